package daemon

import (
	"regexp"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestNewFeedPollsWithinStartJitter: a new source with a one-hour interval
// polls within start_jitter (default 5 s), not at a random time within the
// hour as before; /status says when the first poll is due, and the
// "source started" log line says in how long.
func TestNewFeedPollsWithinStartJitter(t *testing.T) {
	h := startDaemon(t, "", "", `
[source.hourly]
kind = "demo"
interval = "1h"
`)
	started := time.Now()
	var due time.Time
	testsync.WaitFor(t, "the first poll's due time in /status", 10*time.Second, func() bool {
		st := getStatus(t, h.d.HTTPAddr()).Sources[0]
		if st.Reason == "interval" && st.Until != nil {
			due = *st.Until
		}
		return !due.IsZero()
	})
	if due.Sub(started) > 5*time.Second+time.Second {
		t.Errorf("first poll due %s after the start, want within start_jitter (5s)", due.Sub(started))
	}
	m := regexp.MustCompile(`msg="source started" .*first_poll_in=([0-9.]+m?s)`).FindStringSubmatch(h.logs.String())
	if m == nil {
		t.Fatalf("no first_poll_in in the source started line:\n%s", h.logs.String())
	}
	if in, err := time.ParseDuration(m[1]); err != nil || in > 5*time.Second {
		t.Errorf("first_poll_in %q (%v), want at most 5s", m[1], err)
	}
	testsync.WaitFor(t, "the first poll", 15*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_source_polls_total", "source", "hourly", "result", "ok") >= 1
	})
}
