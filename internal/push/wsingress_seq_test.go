package push

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/devicewire"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/sources"
)

// envelopeSeq is envelopeFor with a seq.
func envelopeSeq(device, id string, seq int64) string {
	return strings.Replace(envelopeFor(device, id), `{"schema_version":1,`, fmt.Sprintf(`{"schema_version":1,"seq":%d,`, seq), 1)
}

// TestWSIngressSeqGaps has a device skip seq numbers over a real
// WebSocket, with seq_gap_grace = "0s": the skipped range is counted and
// logged with the device, a seq that goes back is counted as a reset, an
// envelope without a usable seq is stored and not tracked, and the
// device's last seq is exported.
func TestWSIngressSeqGaps(t *testing.T) {
	r := startWS(t, func(s *sources.WSIngressSpec) { s.SeqGapGrace = "0s" })
	var logs testsync.LockedBuffer
	r.inbox.o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	d := dialDevice(t, r.url, tokenA)
	store := func(msg string) {
		t.Helper()
		d.send(msg)
		if a := d.next(); a.Status != devicewire.StatusStored {
			t.Fatalf("answer %+v, want stored", a)
		}
	}
	for seq := int64(1); seq <= 3; seq++ {
		store(envelopeSeq("dev-a", fmt.Sprint("e", seq), seq))
	}
	store(envelopeSeq("dev-a", "e6", 6))
	store(envelopeSeq("dev-a", "e7", 7))
	store(strings.Replace(envelopeFor("dev-a", "no-seq"), `{"schema_version":1,`, `{"schema_version":1,"seq":"eight",`, 1))
	m := r.inbox.o.Metrics.ws
	if got := metricValue(t, m.seqGaps.WithLabelValues("devices")); got != 1 {
		t.Errorf("seq gaps = %v, want 1 (4-5)", got)
	}
	if got := metricValue(t, m.seqResets.WithLabelValues("devices")); got != 0 {
		t.Errorf("seq resets = %v, want 0", got)
	}
	if !strings.Contains(logs.String(), "device=dev-a missing_from=4 missing_to=5 missing=2") {
		t.Errorf("no log line names the device and the missing range; logs:\n%s", logs.String())
	}
	store(envelopeSeq("dev-a", "after-reset-1", 1))
	if got := metricValue(t, m.seqResets.WithLabelValues("devices")); got != 1 {
		t.Errorf("seq resets = %v after the counter went back, want 1", got)
	}
	if got := metricValue(t, r.metrics.ws.lastSeq.WithLabelValues("devices", "dev-a")); got != 7 {
		t.Errorf("last seq of dev-a = %v, want 7", got)
	}
	if n := r.q.PendingEvents(); n != 7 {
		t.Errorf("queue holds %d events, want all 7 (the one without a usable seq too)", n)
	}
}

// TestWSIngressSeqOutOfOrderIsNoGap sends a device's envelopes out of
// order, as a window in flight or a retry can store them: within
// seq_gap_grace the late one fills its place and nothing is reported.
func TestWSIngressSeqOutOfOrderIsNoGap(t *testing.T) {
	r := startWS(t, nil) // seq_gap_grace: the default minute
	d := dialDevice(t, r.url, tokenB)
	for _, seq := range []int64{1, 3, 5, 2, 4, 6} {
		d.send(envelopeSeq("dev-b", fmt.Sprint("e", seq), seq))
		if a := d.next(); a.Status != devicewire.StatusStored {
			t.Fatalf("answer %+v, want stored", a)
		}
	}
	if got := metricValue(t, r.inbox.o.Metrics.ws.seqGaps.WithLabelValues("devices")); got != 0 {
		t.Errorf("seq gaps = %v, want 0", got)
	}
	if got := metricValue(t, r.inbox.o.Metrics.ws.seqResets.WithLabelValues("devices")); got != 0 {
		t.Errorf("seq resets = %v, want 0", got)
	}
}
