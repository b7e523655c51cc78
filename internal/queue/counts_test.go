package queue

import (
	"path/filepath"
	"testing"
	"time"
)

func TestCountsBySourceAndOldestPending(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 10)
	ctx := t.Context()
	if oldest, err := q.OldestPending(ctx); err != nil || !oldest.IsZero() {
		t.Fatalf("oldest pending of an empty queue = %v, %v; want zero", oldest, err)
	}
	before := time.Now()
	a, err := q.Append(ctx, batch("a", 0, 25, ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Append(ctx, batch("b", 0, 3, "")); err != nil {
		t.Fatal(err)
	}
	oldest, err := q.OldestPending(ctx)
	if err != nil || oldest.Before(before.Add(-time.Second)) || oldest.After(time.Now()) {
		t.Fatalf("oldest pending = %v, %v; want the first append's time (%v)", oldest, err, before)
	}
	// One frame of a dead-lettered (10 events), one acked (10): a has 5
	// pending events left and 10 dead letters; b is untouched.
	if _, err := q.DeadLetterFrame(ctx, a[0].ID, "poison"); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Ack(ctx, []int64{a[1].ID}, nil); err != nil {
		t.Fatal(err)
	}
	got, err := q.CountsBySource(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]SourceCounts{"a": {PendingEvents: 5, DeadLetters: 10}, "b": {PendingEvents: 3}}
	if len(got) != len(want) || got["a"] != want["a"] || got["b"] != want["b"] {
		t.Fatalf("counts by source = %+v, want %+v", got, want)
	}
	// The oldest pending frame is now a's third: still no later than b's.
	if o, err := q.OldestPending(ctx); err != nil || o.Before(oldest) {
		t.Fatalf("oldest pending after the ack = %v, %v; want at or after %v", o, err, oldest)
	}
}
