package devicewire

import (
	"strings"
	"testing"
)

// TestAckRoundTrip encodes each kind of answer as the daemon sends it and
// decodes it as the device reads it.
func TestAckRoundTrip(t *testing.T) {
	for _, a := range []Ack{
		{EventID: "e1", Status: StatusStored, AckTS: "2026-11-24T10:00:00.5Z"},
		{EventID: "", Status: StatusRejected, Reason: `type must be a string, not a number`},
		{EventID: "e\"3\u00e9", Status: StatusRetry, Reason: "queue full", RetryAfterMS: 1500},
	} {
		got, err := DecodeAck(a.Encode())
		if err != nil || got != a {
			t.Errorf("DecodeAck(%s) = %+v, %v; want %+v", a.Encode(), got, err, a)
		}
	}
	if enc := string(Ack{EventID: "e1", Status: StatusStored}.Encode()); enc != `{"event_id":"e1","status":"stored"}` {
		t.Errorf("an answer without reason, ack_ts or wait encodes as %s", enc)
	}
	for _, bad := range []string{`not json`, `"stored"`, `[1]`, `{"status":1}`} {
		if _, err := DecodeAck([]byte(bad)); err == nil || !strings.Contains(err.Error(), "decode an answer") {
			t.Errorf("DecodeAck(%s): err = %v", bad, err)
		}
	}
}
