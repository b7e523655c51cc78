package daemon

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestSourceCountersStartAtZero: a polled source's counters (and those a
// push source shares with it) are exported at 0 as soon as it starts, before any malformed payload, failed poll or
// restart, so that increase() over a window sees the first one (a series
// born at 1 shows no increase) and alerts need no absent().
func TestSourceCountersStartAtZero(t *testing.T) {
	h := startDaemon(t, "", "", `
[source.quiet]
kind = "demo"
interval = "1h"
start_jitter = "1h"

[push]
addr = "127.0.0.1:0"

[source.hooks]
kind = "webhook"
id_field = "id"
`)
	exported := func() map[string]bool {
		mfs, err := h.d.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				var labels []string
				for _, lp := range m.GetLabel() {
					labels = append(labels, lp.GetName()+"="+lp.GetValue())
				}
				have[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = true
			}
		}
		return have
	}
	want := []string{"ingestor_source_malformed_total{source=quiet}", "ingestor_actor_restarts_total{actor=source-quiet}",
		"ingestor_source_events_total{source=quiet}", "ingestor_source_duplicates_total{source=quiet}",
		"ingestor_source_bytes_total{source=quiet}", "ingestor_source_paused{source=quiet}"}
	for _, c := range []string{"events", "duplicates", "bytes"} {
		want = append(want, "ingestor_source_"+c+"_total{source=hooks}")
	}
	for _, r := range []string{"ok", "error", "malformed", "wait"} {
		want = append(want, fmt.Sprintf("ingestor_source_polls_total{result=%s,source=quiet}", r))
	}
	missing := want
	testsync.WaitFor(t, "every counter of the source exported", 10*time.Second, func() bool {
		have := exported()
		missing = slices.DeleteFunc(slices.Clone(want), func(w string) bool { return have[w] })
		return len(missing) == 0
	})
	if polls := metric(t, h.d.Registry(), "ingestor_source_polls_total", "source", "quiet", "result", "ok"); polls != 0 {
		t.Errorf("%v polls ok before the first poll is due (start_jitter 1h): the check above saw a series born at its first event", polls)
	}
}

// TestDeadLetterGauge: ingestor_dead_letters counts the active dead
// letters of each source, and is 0, not absent, for a source without any.
func TestDeadLetterGauge(t *testing.T) {
	h := startDaemon(t, "", "", `
[source.bad]
kind = "demo"
interval = "50ms"
malformed_every = 1
malformed_retries = 0

[source.good]
kind = "demo"
interval = "1h"
`)
	testsync.WaitFor(t, "a dead letter of bad in the gauge", 20*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_dead_letters", "source", "bad") >= 1
	})
	mfs, err := h.d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	good := false
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "ingestor_dead_letters" && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == "good" {
				good = m.GetGauge().GetValue() == 0
			}
		}
	}
	if !good {
		t.Error("ingestor_dead_letters{source=\"good\"} is not exported at 0")
	}
}
