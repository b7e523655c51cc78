package devicewire

import (
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// Envelope is what the daemon reads of a device's envelope; the envelope
// itself, as received, is the event.
type Envelope struct {
	EventID, Type, SessionID, DeviceID string
	TS                                 time.Time
	// Seq is the envelope's seq, 0 when it has none or one that is not a
	// positive integer (such a seq is not tracked; the envelope is stored
	// all the same, since refusing it would lose the event).
	Seq int64
	// Traceparent and Tracestate are the envelope's optional W3C trace
	// context: the daemon continues that trace (an invalid one is ignored,
	// as the W3C spec says, and the envelope is stored all the same).
	Traceparent, Tracestate string
}

// envelopeFields are the top-level keys of an envelope the daemon reads;
// every one but schema_version, seq, traceparent and tracestate is
// required.
var envelopeFields = [...]string{"schema_version", "event_id", "type", "ts", "session_id", "device_id", "payload", "seq",
	"traceparent", "tracestate"}

// DecodeEnvelope reads and validates one envelope (PROTOCOL.md, "Device
// ingress (ws_ingress)"). On error, env holds the event_id if one could be
// read, so that the rejection names it. Unknown top-level keys are allowed
// and kept; a known key written twice is an error, since readers of the
// stored envelope could disagree on which one counts.
func DecodeEnvelope(msg []byte) (env Envelope, err error) {
	if !utf8.Valid(msg) {
		return env, errors.New("the envelope is not valid UTF-8")
	}
	var d jsonscan.Decoder
	d.Reset(msg)
	if k := d.Peek(); k != jsonscan.Object {
		if _, _, err := d.Value(); err != nil || d.End() != nil {
			return env, errors.New("the envelope is not JSON")
		}
		return env, fmt.Errorf("the envelope must be a JSON object, not %s", kindPhrase(k))
	}
	var seen [len(envelopeFields)]bool
	strs := map[string]*string{"event_id": &env.EventID, "type": &env.Type, "session_id": &env.SessionID, "device_id": &env.DeviceID,
		"traceparent": &env.Traceparent, "tracestate": &env.Tracestate}
	var ts string
	strs["ts"] = &ts
	err = d.Object(func(rawKey []byte, plain bool) error {
		key := string(rawKey)
		if !plain {
			var uerr error
			if key, uerr = jsonscan.Unquote(rawKey); uerr != nil {
				return nil // the syntax error is reported by Object
			}
		}
		i := fieldIndex(key)
		if i < 0 {
			return nil // an unknown key: kept, not read
		}
		if seen[i] {
			return fmt.Errorf("%s appears twice", key)
		}
		seen[i] = true
		if key == "payload" {
			return nil // any JSON value, validated as it is skipped
		}
		val, kind, verr := d.Value()
		if verr != nil {
			return verr
		}
		return readEnvelopeField(&env, strs, key, val, kind)
	})
	if err == nil {
		err = d.End()
	}
	var syn *jsonscan.SyntaxError
	if errors.As(err, &syn) {
		return env, fmt.Errorf("the envelope is not valid JSON: %w", err)
	}
	if err != nil {
		return env, err
	}
	if err := checkEnvelopeFields(&seen, strs); err != nil {
		return env, err
	}
	if env.TS, err = time.Parse(time.RFC3339, ts); err != nil {
		return env, fmt.Errorf("ts %q is not an RFC 3339 time such as \"2026-01-02T15:04:05Z\"", ts)
	}
	return env, nil
}

// readEnvelopeField stores val, the value of the envelope's field key
// (not payload), in env: seq and schema_version are numbers, the others
// strings, which go where strs says.
func readEnvelopeField(env *Envelope, strs map[string]*string, key string, val []byte, kind jsonscan.Kind) error {
	switch key {
	case "seq":
		if kind == jsonscan.Number {
			if n, perr := strconv.ParseInt(string(val), 10, 64); perr == nil && n > 0 {
				env.Seq = n
			}
		}
		return nil
	case "schema_version":
		if kind != jsonscan.Number {
			return fmt.Errorf("schema_version must be the number %d, not %s", SchemaVersion, kindPhrase(kind))
		}
		if v, perr := strconv.ParseFloat(string(val), 64); perr != nil || v != SchemaVersion {
			return fmt.Errorf("schema_version %s is not supported (only %d is)", val, SchemaVersion)
		}
		return nil
	}
	if kind != jsonscan.String {
		return fmt.Errorf("%s must be a string, not %s", key, kindPhrase(kind))
	}
	s, uerr := jsonscan.Unquote(val)
	if uerr != nil {
		return fmt.Errorf("%s: %w", key, uerr)
	}
	*strs[key] = s
	return nil
}

// checkEnvelopeFields reports the first required field the envelope does
// not have (seen, by index in envelopeFields), or whose string is empty
// or too long.
func checkEnvelopeFields(seen *[len(envelopeFields)]bool, strs map[string]*string) error {
	for i, key := range envelopeFields {
		if !seen[i] && key != "schema_version" && key != "seq" && key != "traceparent" && key != "tracestate" {
			return fmt.Errorf("%s is missing", key)
		}
	}
	for _, key := range []string{"event_id", "type", "ts", "session_id", "device_id"} {
		switch v := *strs[key]; {
		case v == "":
			return fmt.Errorf("%s is empty", key)
		case len(v) > MaxIDBytes:
			return fmt.Errorf("%s is longer than %d bytes", key, MaxIDBytes)
		}
	}
	return nil
}

// fieldIndex returns the index of key in envelopeFields, or -1.
func fieldIndex(key string) int {
	for i, f := range envelopeFields {
		if f == key {
			return i
		}
	}
	return -1
}

// kindPhrase names a kind of JSON value in a sentence: "an array", "null".
func kindPhrase(k jsonscan.Kind) string {
	switch k {
	case jsonscan.Null:
		return "null"
	case jsonscan.Bool:
		return "a boolean"
	case jsonscan.Object, jsonscan.Array:
		return "an " + k.String()
	}
	return "a " + k.String()
}
