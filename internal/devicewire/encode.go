package devicewire

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// seqBytes bounds what adding "seq" makes an envelope grow by.
const seqBytes = len(`"seq":,`) + 20

// Encoder makes a device's envelopes from the items its producers give:
// it checks each item against the protocol and fills in what the item
// leaves out of event_id, ts, session_id, device_id and schema_version.
type Encoder struct {
	// DeviceID fills the device_id of items that have none.
	DeviceID string
	// SessionID fills the session_id of items that have none.
	SessionID string
	// MaxBytes bounds one envelope, its seq included.
	MaxBytes int
	// Now gives the ts of items that have none; nil is time.Now.
	Now func() time.Time
}

// Draft is an item made into an envelope, before the device numbers it.
type Draft struct {
	// EventID and DeviceID are the envelope's, given or filled in.
	EventID, DeviceID string
	// Base is the encoded envelope, its keys sorted; without "seq" when
	// NeedSeq is set.
	Base []byte
	// NeedSeq is set when the item had no seq: the device assigns the
	// next value of its counter (WithSeq) when it stores the envelope.
	NeedSeq bool
	// Traceparent and Tracestate are the envelope's W3C trace context,
	// given by the item or filled in by EncodeTraced; "" for none.
	Traceparent, Tracestate string
}

// NewID returns 16 random bytes in hex, for event and session ids.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics instead)
	return hex.EncodeToString(b[:])
}

// Encode makes item, one JSON object, into an envelope. An item that is
// not a JSON object, lacks "type" or "payload", or has a field the
// protocol rejects is an error that says why, for the producer: such an
// item would only reach the daemon's rejection.
func (e *Encoder) Encode(item []byte) (Draft, error) {
	return e.EncodeTraced(item, "", "")
}

// EncodeTraced is Encode, filling in the trace context parent and state
// (a W3C traceparent and tracestate) when the item has no traceparent of
// its own and parent is not "": the daemon continues that trace.
func (e *Encoder) EncodeTraced(item []byte, parent, state string) (Draft, error) {
	var d Draft
	item = bytes.TrimSpace(item)
	if len(item) == 0 {
		return d, errors.New("empty event")
	}
	if !utf8.Valid(item) {
		return d, errors.New("event is not valid UTF-8")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(item, &m); err != nil || m == nil {
		return d, fmt.Errorf("event is not a JSON object: %s", jsonProblem(err))
	}
	if _, err := idField(m, "type"); err != nil {
		return d, err
	}
	if _, ok := m["payload"]; !ok {
		return d, errors.New(`"payload" is required (any JSON value)`)
	}
	fill := func(key, def string) (string, error) {
		v, err := idField(m, key)
		if errors.Is(err, errMissing) {
			m[key] = quote(def)
			return def, nil
		}
		return v, err
	}
	var err error
	if d.EventID, err = fill("event_id", NewID()); err != nil {
		return d, err
	}
	if _, err = fill("session_id", e.SessionID); err != nil {
		return d, err
	}
	if d.DeviceID, err = fill("device_id", e.DeviceID); err != nil {
		return d, err
	}
	if raw, ok := m["ts"]; ok {
		var ts string
		if json.Unmarshal(raw, &ts) != nil {
			return d, errors.New(`"ts" must be an RFC 3339 time string`)
		}
		if _, err := time.Parse(time.RFC3339, ts); err != nil {
			return d, fmt.Errorf(`"ts" must be an RFC 3339 time such as "2026-01-02T15:04:05Z", not %q`, ts)
		}
	} else {
		now := e.Now
		if now == nil {
			now = time.Now
		}
		m["ts"] = quote(now().UTC().Format(time.RFC3339Nano))
	}
	if raw, ok := m["schema_version"]; ok {
		if string(raw) != strconv.Itoa(SchemaVersion) {
			return d, fmt.Errorf(`"schema_version" must be %d, not %s`, SchemaVersion, raw)
		}
	} else {
		m["schema_version"] = json.RawMessage(strconv.Itoa(SchemaVersion))
	}
	if err := traceFields(m, &d, parent, state); err != nil {
		return d, err
	}
	if raw, ok := m["seq"]; ok {
		if _, err := strconv.ParseInt(string(raw), 10, 64); err != nil {
			return d, fmt.Errorf(`"seq" must be an integer, not %s`, raw)
		}
	} else {
		d.NeedSeq = true
	}
	if d.Base, err = json.Marshal(m); err != nil {
		return d, fmt.Errorf("encode the envelope: %w", err)
	}
	if n := len(d.Base) + seqBytes; n > e.MaxBytes {
		return d, fmt.Errorf("event of about %d bytes is over max_envelope_bytes %d", n, e.MaxBytes)
	}
	return d, nil
}

// WithSeq returns the envelope of a draft that NeedSeq, with seq added as
// its first member.
func (d *Draft) WithSeq(seq int64) []byte {
	out := make([]byte, 0, len(d.Base)+seqBytes)
	out = append(out, `{"seq":`...)
	out = strconv.AppendInt(out, seq, 10)
	out = append(out, ',')
	return append(out, d.Base[1:]...)
}

// errMissing marks an absent field.
var errMissing = errors.New("missing")

// idField returns the field key of m, which must be a non-empty string of
// at most MaxIDBytes bytes.
func idField(m map[string]json.RawMessage, key string) (string, error) {
	raw, ok := m[key]
	if !ok {
		return "", fmt.Errorf("%q is required: %w", key, errMissing)
	}
	var s string
	if json.Unmarshal(raw, &s) != nil || s == "" {
		return "", fmt.Errorf("%q must be a non-empty string, not %s", key, raw)
	}
	if len(s) > MaxIDBytes {
		return "", fmt.Errorf("%q is %d bytes long, over the limit of %d", key, len(s), MaxIDBytes)
	}
	return s, nil
}

// quote encodes s as a JSON string.
func quote(s string) json.RawMessage {
	b, _ := json.Marshal(s) // a string always encodes
	return b
}

// jsonProblem says what is wrong with a JSON text for a producer.
func jsonProblem(err error) string {
	if err == nil {
		return "null"
	}
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Sprintf("%v at byte %d", syn, syn.Offset)
	}
	return err.Error()
}

// traceFields reads the item's traceparent and tracestate into d, or fills
// in parent and state when it has no traceparent.
func traceFields(m map[string]json.RawMessage, d *Draft, parent, state string) error {
	for key, dst := range map[string]*string{"traceparent": &d.Traceparent, "tracestate": &d.Tracestate} {
		if raw, ok := m[key]; ok && json.Unmarshal(raw, dst) != nil {
			return fmt.Errorf("%q must be a string", key)
		}
	}
	if _, ok := m["traceparent"]; ok || parent == "" {
		return nil
	}
	d.Traceparent, d.Tracestate = parent, state
	m["traceparent"] = quote(parent)
	if state != "" {
		m["tracestate"] = quote(state)
	} else {
		delete(m, "tracestate")
	}
	return nil
}
