package actors

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSecondRingKeepsTheLastMinute(t *testing.T) {
	var r secondRing
	t0 := time.Unix(1_800_000_000, 0)
	r.add(t0, 3)
	r.add(t0.Add(500*time.Millisecond), 2)
	r.add(t0.Add(10*time.Second), 7)
	s := r.series(t0.Add(10 * time.Second))
	if len(s) != statusWindow || s[statusWindow-1] != 7 || s[statusWindow-11] != 5 || r.sum(t0.Add(10*time.Second)) != 12 {
		t.Fatalf("series 10s later = %v, want 5 ten seconds back and 7 now", s)
	}
	// A minute later the first second has left the window, and a slot
	// reused for a new second starts from 0.
	if got := r.sum(t0.Add(60 * time.Second)); got != 7 {
		t.Fatalf("sum 60s later = %d, want 7", got)
	}
	r.add(t0.Add(60*time.Second), 1)
	if got := r.sum(t0.Add(60 * time.Second)); got != 8 {
		t.Fatalf("sum after a reused slot = %d, want 8", got)
	}
}

func TestSourceStatusAndForgetSource(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	if _, ok := m.SourceStatus("a"); ok {
		t.Fatal("a status for a source nothing reported")
	}
	m.Pushed("a", 2, 1, 300, time.Now().Add(-time.Minute))
	m.crashed("source-a", errors.New("boom"), time.Second)
	m.crashed("publisher", "not a source", time.Second)
	m.polls.WithLabelValues("a", "ok").Inc()
	m.restarts.WithLabelValues("source-a").Inc()
	st, ok := m.SourceStatus("a")
	if !ok || st.Restarts != 1 || st.LastPanic != "boom" || st.State != StateFailing || st.Reason != ReasonRestart ||
		st.RecordsLastMinute != 3 || st.BytesLastMinute != 300 || st.LastSuccess.IsZero() || st.NewestRecord.IsZero() {
		t.Fatalf("status of a = %+v, %v", st, ok)
	}
	if _, ok := m.SourceStatus("publisher"); ok {
		t.Error("a shared actor's crash made a source status")
	}
	m.ForgetSource("a")
	if _, ok := m.SourceStatus("a"); ok {
		t.Error("status of a kept after ForgetSource")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			for _, l := range mm.GetLabel() {
				if v := l.GetValue(); v == "a" || v == "source-a" {
					t.Errorf("%s{%s=%q} kept after ForgetSource", mf.GetName(), l.GetName(), v)
				}
			}
		}
	}
}
