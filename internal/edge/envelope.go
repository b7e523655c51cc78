package edge

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

// maxIDBytes is the longest event_id, type, session_id and device_id the
// ws_ingress protocol accepts.
const maxIDBytes = 256

// seqBytes bounds what adding "seq" makes an envelope grow by.
const seqBytes = len(`"seq":,`) + 20

// envelope is one input item made into a ws_ingress envelope, ready to
// store.
type envelope struct {
	eventID  string
	deviceID string
	// base is the encoded envelope, without seq when needSeq is set.
	base []byte
	// needSeq is set when the producer gave no seq: the outbox assigns the
	// next value of the device's counter when it stores the row.
	needSeq bool
	// raw is the envelope as stored (and sent), set by outbox.add.
	raw []byte
}

// filler completes input items into envelopes: what the producer left out
// of event_id, ts, session_id, device_id and schema_version it fills in.
type filler struct {
	deviceID  string
	sessionID string
	maxBytes  int
	now       func() time.Time
}

// newID returns 16 random bytes in hex, for event and session ids.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics instead)
	return hex.EncodeToString(b[:])
}

// parse makes item, one JSON object, into an envelope. An item that is
// not a JSON object, lacks "type" or "payload", or has a field the
// ws_ingress protocol would reject is an error that says why: such an
// item would only reach the daemon's rejection.
func (f *filler) parse(item []byte) (*envelope, error) {
	item = bytes.TrimSpace(item)
	if len(item) == 0 {
		return nil, errors.New("empty event")
	}
	if !utf8.Valid(item) {
		return nil, errors.New("event is not valid UTF-8")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(item, &m); err != nil || m == nil {
		return nil, fmt.Errorf("event is not a JSON object: %s", jsonProblem(err))
	}
	if _, err := idField(m, "type"); err != nil {
		return nil, err
	}
	if _, ok := m["payload"]; !ok {
		return nil, errors.New(`"payload" is required (any JSON value)`)
	}
	e := &envelope{}
	fill := func(key, def string) (string, error) {
		v, err := idField(m, key)
		if errors.Is(err, errMissing) {
			m[key] = quote(def)
			return def, nil
		}
		return v, err
	}
	var err error
	if e.eventID, err = fill("event_id", newID()); err != nil {
		return nil, err
	}
	if _, err = fill("session_id", f.sessionID); err != nil {
		return nil, err
	}
	if e.deviceID, err = fill("device_id", f.deviceID); err != nil {
		return nil, err
	}
	if raw, ok := m["ts"]; ok {
		var ts string
		if json.Unmarshal(raw, &ts) != nil {
			return nil, errors.New(`"ts" must be an RFC 3339 time string`)
		}
		if _, err := time.Parse(time.RFC3339, ts); err != nil {
			return nil, fmt.Errorf(`"ts" must be an RFC 3339 time such as "2026-01-02T15:04:05Z", not %q`, ts)
		}
	} else {
		m["ts"] = quote(f.now().UTC().Format(time.RFC3339Nano))
	}
	if raw, ok := m["schema_version"]; ok {
		if string(raw) != "1" {
			return nil, fmt.Errorf(`"schema_version" must be 1, not %s`, raw)
		}
	} else {
		m["schema_version"] = json.RawMessage("1")
	}
	if raw, ok := m["seq"]; ok {
		if _, err := strconv.ParseInt(string(raw), 10, 64); err != nil {
			return nil, fmt.Errorf(`"seq" must be an integer, not %s`, raw)
		}
	} else {
		e.needSeq = true
	}
	if e.base, err = json.Marshal(m); err != nil {
		return nil, fmt.Errorf("encode the envelope: %w", err)
	}
	if n := len(e.base) + seqBytes; n > f.maxBytes {
		return nil, fmt.Errorf("event of about %d bytes is over max_envelope_bytes %d", n, f.maxBytes)
	}
	return e, nil
}

// errMissing marks an absent field.
var errMissing = errors.New("missing")

// idField returns the field key of m, which must be a non-empty string of
// at most maxIDBytes bytes.
func idField(m map[string]json.RawMessage, key string) (string, error) {
	raw, ok := m[key]
	if !ok {
		return "", fmt.Errorf("%q is required: %w", key, errMissing)
	}
	var s string
	if json.Unmarshal(raw, &s) != nil || s == "" {
		return "", fmt.Errorf("%q must be a non-empty string, not %s", key, raw)
	}
	if len(s) > maxIDBytes {
		return "", fmt.Errorf("%q is %d bytes long, over the limit of %d", key, len(s), maxIDBytes)
	}
	return s, nil
}

// quote encodes s as a JSON string.
func quote(s string) json.RawMessage {
	b, _ := json.Marshal(s) // a string always encodes
	return b
}

// withSeq returns base, an encoded JSON object without "seq", with seq
// added as its first member.
func withSeq(base []byte, seq int64) []byte {
	out := make([]byte, 0, len(base)+seqBytes)
	out = append(out, `{"seq":`...)
	out = strconv.AppendInt(out, seq, 10)
	out = append(out, ',')
	return append(out, base[1:]...)
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
