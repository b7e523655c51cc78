package devicewire

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzEnvelope checks DecodeEnvelope against a reference built on
// encoding/json: both accept the same messages, read the same fields from
// them, and every rejection makes a valid answer. The seed corpus is in
// testdata/fuzz/FuzzEnvelope.
func FuzzEnvelope(f *testing.F) {
	f.Fuzz(func(t *testing.T, msg []byte) {
		env, err := DecodeEnvelope(msg)
		want, wantOK := referenceEnvelope(msg)
		if err != nil {
			if wantOK {
				t.Fatalf("DecodeEnvelope rejected a valid envelope: %v", err)
			}
			answer := Ack{EventID: env.EventID, Status: StatusRejected, Reason: err.Error()}.Encode()
			if !json.Valid(answer) || err.Error() == "" {
				t.Fatalf("rejection %q is not a valid answer", answer)
			}
			return
		}
		if !wantOK {
			t.Fatalf("DecodeEnvelope accepted %q, which encoding/json finds invalid", msg)
		}
		if !sameEnvelope(env, want) {
			t.Fatalf("DecodeEnvelope read %+v, encoding/json %+v", env, want)
		}
	})
}

// sameEnvelope reports whether a and b hold the same fields, their times
// the same instant in the same zone offset (each parse makes its own
// *time.Location, so == cannot compare them).
func sameEnvelope(a, b Envelope) bool {
	_, offset := a.TS.Zone()
	_, wantOffset := b.TS.Zone()
	sameTime := a.TS.Equal(b.TS) && offset == wantOffset
	a.TS, b.TS = time.Time{}, time.Time{}
	return a == b && sameTime
}

// referenceEnvelope validates an envelope with encoding/json, as the
// protocol describes it.
func referenceEnvelope(msg []byte) (Envelope, bool) {
	var env Envelope
	if !utf8.Valid(msg) || !json.Valid(msg) {
		return env, false
	}
	dec := json.NewDecoder(bytes.NewReader(msg))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return env, false
	}
	members := map[string][]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return env, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return env, false
		}
		key := tok.(string)
		members[key] = append(members[key], raw)
	}
	for _, key := range envelopeFields {
		optional := key == "schema_version" || key == "seq" || key == "traceparent" || key == "tracestate"
		if len(members[key]) > 1 || (len(members[key]) == 0 && !optional) {
			return env, false
		}
	}
	if v, ok := members["schema_version"]; ok {
		c := v[0][0]
		if c != '-' && (c < '0' || c > '9') {
			return env, false
		}
		if n, err := strconv.ParseFloat(string(v[0]), 64); err != nil || n != 1 {
			return env, false
		}
	}
	if v, ok := members["seq"]; ok {
		if n, err := strconv.ParseInt(string(v[0]), 10, 64); err == nil && n > 0 {
			env.Seq = n
		}
	}
	for key, dst := range map[string]*string{"traceparent": &env.Traceparent, "tracestate": &env.Tracestate} {
		if v, ok := members[key]; ok && (!strings.HasPrefix(string(v[0]), `"`) || json.Unmarshal(v[0], dst) != nil) {
			return env, false
		}
	}
	var ts string
	for key, dst := range map[string]*string{"event_id": &env.EventID, "type": &env.Type, "ts": &ts,
		"session_id": &env.SessionID, "device_id": &env.DeviceID} {
		raw := members[key][0]
		if !strings.HasPrefix(string(raw), `"`) || json.Unmarshal(raw, dst) != nil || *dst == "" || len(*dst) > 256 {
			return env, false
		}
	}
	var err error
	if env.TS, err = time.Parse(time.RFC3339, ts); err != nil {
		return env, false
	}
	return env, true
}
