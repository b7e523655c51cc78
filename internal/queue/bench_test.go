package queue

import (
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BenchmarkAppendAndAck measures the queue's per-event cost on the real
// path's shape: batches of 1000 new events (a fetched page) appended with
// their cursor at synchronous = full, then every frame acked as a
// processor does, frame by frame. It reports ns/event and the process's CPU time per event.
func BenchmarkAppendAndAck(b *testing.B) {
	q, err := Open(Options{Path: filepath.Join(b.TempDir(), "q.db"), EventsPerFrame: 100})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := q.Close(); err != nil {
			b.Error(err)
		}
	}()
	const page = 1000
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	n := 0
	for i := range b.N {
		bt := Batch{Source: "firehose", FetchedAt: time.Now(), RawKey: fmt.Sprintf("firehose/2026/11/24/%d-page.json", i),
			Cursor: fmt.Sprint((i + 1) * page), SetCursor: true, Events: make([]NewEvent, page)}
		for j := range bt.Events {
			bt.Events[j] = NewEvent{Key: fmt.Sprintf("ev-%d", n), EventTime: bt.FetchedAt, RawOff: j * 500, RawLen: 500}
			n++
		}
		frames, err := q.Append(b.Context(), bt)
		if err != nil {
			b.Fatal(err)
		}
		ids := make([]int64, len(frames))
		for k, f := range frames {
			ids[k] = f.ID
		}
		if _, err := q.Ack(b.Context(), ids, nil); err != nil {
			b.Fatal(err)
		}
	}
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/event")
	b.ReportMetric(float64(cpu)/float64(n), "cpu-ns/event")
}
