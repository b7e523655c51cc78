package edge

import (
	"encoding/json"
	"testing"
	"time"
)

// FuzzParseEnvelope checks that any input item is either refused with an
// error or made into an envelope the ws_ingress protocol accepts: a JSON
// object with every required field, within max_envelope_bytes once its
// seq is added.
func FuzzParseEnvelope(f *testing.F) {
	for _, seed := range []string{
		`{"type":"t","payload":1}`,
		`{"type":"t","payload":{"a":[1,2,{"b":null}]},"event_id":"e","ts":"2026-01-02T03:04:05Z","seq":3}`,
		`{"type":"t","payload":"\u00e9\ud83d\ude00","x":{"y":true},"schema_version":1,"device_id":"d","session_id":"s"}`,
		`{"type":"t","payload":1,"type":"u"}`, `{"type":"t","payload":null}`,
		`{"type":"t"}`, `[]`, `null`, `"x"`, `{"type":1,"payload":1}`, "{\"type\":\"\xff\",\"payload\":1}",
	} {
		f.Add([]byte(seed))
	}
	fl := &filler{deviceID: "dev", sessionID: "sess", maxBytes: 4096, now: time.Now}
	f.Fuzz(func(t *testing.T, item []byte) {
		e, err := fl.parse(item)
		if err != nil {
			return
		}
		raw := e.base
		if e.needSeq {
			raw = withSeq(e.base, 1<<62)
		}
		if len(raw) > fl.maxBytes {
			t.Fatalf("envelope of %d bytes over max %d: %s", len(raw), fl.maxBytes, raw)
		}
		var env struct {
			SchemaVersion int             `json:"schema_version"`
			EventID       string          `json:"event_id"`
			Type          string          `json:"type"`
			TS            string          `json:"ts"`
			SessionID     string          `json:"session_id"`
			DeviceID      string          `json:"device_id"`
			Seq           *int64          `json:"seq"`
			Payload       json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal(raw, &env); err != nil {
			t.Fatalf("envelope is not JSON: %v: %s", err, raw)
		}
		if _, err := time.Parse(time.RFC3339, env.TS); err != nil || env.SchemaVersion != 1 || env.Seq == nil || env.Payload == nil ||
			env.EventID != e.eventID || env.DeviceID != e.deviceID || !okID(env.EventID) || !okID(env.Type) || !okID(env.SessionID) || !okID(env.DeviceID) {
			t.Fatalf("envelope %s breaks the protocol (ts error %v)", raw, err)
		}
	})
}

// okID reports whether s is a valid protocol id: non-empty, at most 256 bytes.
func okID(s string) bool { return s != "" && len(s) <= maxIDBytes }
