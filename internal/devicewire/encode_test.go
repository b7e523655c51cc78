package devicewire

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestEncode checks how items become envelopes, and that every item the
// daemon would reject is refused with the reason.
func TestEncode(t *testing.T) {
	enc := &Encoder{DeviceID: "dev-1", SessionID: "s1", MaxBytes: 2048, Now: time.Now}
	d, err := enc.Encode([]byte(`{"type":"t","payload":null,"extra":{"k":[1,2]},"event_id":"e1","ts":"2026-01-02T03:04:05.5+01:00","seq":7}`))
	if err != nil {
		t.Fatal(err)
	}
	if d.EventID != "e1" || d.NeedSeq || d.DeviceID != "dev-1" {
		t.Errorf("draft = %+v", d)
	}
	for _, want := range []string{`"extra":{"k":[1,2]}`, `"ts":"2026-01-02T03:04:05.5+01:00"`, `"session_id":"s1"`, `"schema_version":1`, `"seq":7`, `"payload":null`} {
		if !bytes.Contains(d.Base, []byte(want)) {
			t.Errorf("envelope %s lacks %s", d.Base, want)
		}
	}
	long := strings.Repeat("x", MaxIDBytes+1)
	for _, tc := range []struct{ in, want string }{
		{``, "empty"},
		{`[1]`, "not a JSON object"},
		{`null`, "not a JSON object"},
		{`{"type":"t"`, "not a JSON object"},
		{"{\"type\":\"\xff\",\"payload\":1}", "UTF-8"},
		{`{"payload":1}`, `"type" is required`},
		{`{"type":"","payload":1}`, `"type" must be a non-empty string`},
		{`{"type":3,"payload":1}`, `"type" must be a non-empty string`},
		{`{"type":"t"}`, `"payload" is required`},
		{`{"type":"t","payload":1,"event_id":""}`, `"event_id" must be a non-empty string`},
		{`{"type":"t","payload":1,"event_id":"` + long + `"}`, `"event_id" is 257 bytes long`},
		{`{"type":"t","payload":1,"device_id":7}`, `"device_id" must be`},
		{`{"type":"t","payload":1,"session_id":null}`, `"session_id" must be`},
		{`{"type":"t","payload":1,"ts":"yesterday"}`, `"ts" must be an RFC 3339 time`},
		{`{"type":"t","payload":1,"ts":5}`, `"ts" must be an RFC 3339 time string`},
		{`{"type":"t","payload":1,"schema_version":2}`, `"schema_version" must be 1`},
		{`{"type":"t","payload":1,"seq":1.5}`, `"seq" must be an integer`},
		{`{"type":"t","payload":"` + strings.Repeat("x", 2048) + `"}`, "over max_envelope_bytes 2048"},
	} {
		if _, err := enc.Encode([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("encode %.60q: %v, want %q", tc.in, err, tc.want)
		}
	}
}

// FuzzEncode is the round trip of the protocol: any item is either
// refused by the device's Encoder or made into an envelope, within
// MaxBytes once its seq is added, that the daemon's DecodeEnvelope
// accepts with the event_id, device_id and seq the device stored it under.
func FuzzEncode(f *testing.F) {
	for _, seed := range []string{
		`{"type":"t","payload":1}`,
		`{"type":"t","payload":{"a":[1,2,{"b":null}]},"event_id":"e","ts":"2026-01-02T03:04:05Z","seq":3}`,
		`{"type":"t","payload":"\u00e9\ud83d\ude00","x":{"y":true},"schema_version":1,"device_id":"d","session_id":"s"}`,
		`{"type":"t","payload":1,"type":"u"}`, `{"type":"t","payload":null}`,
		`{"type":"t"}`, `[]`, `null`, `"x"`, `{"type":1,"payload":1}`, "{\"type\":\"\xff\",\"payload\":1}",
		`{"type":"t<&>","payload":1,"seq":-4,"event_id":"\ud800"}`,
	} {
		f.Add([]byte(seed))
	}
	enc := &Encoder{DeviceID: "dev", SessionID: "sess", MaxBytes: 4096, Now: time.Now}
	f.Fuzz(func(t *testing.T, item []byte) {
		d, err := enc.Encode(item)
		if err != nil {
			return
		}
		raw, seq := d.Base, int64(0)
		if d.NeedSeq {
			seq = 1 << 62
			raw = d.WithSeq(seq)
		}
		if len(raw) > enc.MaxBytes {
			t.Fatalf("envelope of %d bytes over max %d: %s", len(raw), enc.MaxBytes, raw)
		}
		env, err := DecodeEnvelope(raw)
		if err != nil {
			t.Fatalf("the daemon rejects the envelope %s: %v", raw, err)
		}
		if env.EventID != d.EventID || env.DeviceID != d.DeviceID || (d.NeedSeq && env.Seq != seq) {
			t.Fatalf("the daemon reads %+v from %s, the device stored event_id %q device_id %q seq %d",
				env, raw, d.EventID, d.DeviceID, seq)
		}
	})
}
