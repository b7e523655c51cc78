package queue

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestEventStatus follows one event through queued, delivered and acked,
// and another into the dead letters, by seq and by key.
func TestEventStatus(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 1)
	ctx := context.Background()
	frames, err := q.Append(ctx, Batch{Source: "s", FetchedAt: time.Now(), RawKey: "s/raw",
		Events: []NewEvent{{Key: "a", RawLen: 1}, {Key: "b", RawOff: 1, RawLen: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	check := func(key, want string) EventStatus {
		t.Helper()
		st, ok, err := q.EventByKey(ctx, "s", key)
		if err != nil || !ok {
			t.Fatalf("EventByKey(%s): ok %v, err %v", key, ok, err)
		}
		if st.Status != want {
			t.Fatalf("%s is %q, want %q", key, st.Status, want)
		}
		bySeq, ok, err := q.EventBySeq(ctx, "s", st.Seq)
		if err != nil || !ok || bySeq != st {
			t.Fatalf("EventBySeq(%d) = %+v, %v, %v; by key %+v", st.Seq, bySeq, ok, err, st)
		}
		return st
	}
	check("a", StatusQueued)
	if err := q.CountDeliveries(ctx, []int64{frames[0].ID}); err != nil {
		t.Fatal(err)
	}
	if st := check("a", StatusDelivered); st.Deliveries != 1 {
		t.Errorf("deliveries = %d, want 1", st.Deliveries)
	}
	if _, err := q.Ack(ctx, []int64{frames[0].ID}, nil); err != nil {
		t.Fatal(err)
	}
	check("a", StatusAcked)
	if _, err := q.DeadLetterFrame(ctx, frames[1].ID, "poison"); err != nil {
		t.Fatal(err)
	}
	check("b", StatusDeadLettered)
	if _, ok, err := q.EventByKey(ctx, "s", "nope"); ok || err != nil {
		t.Errorf("unknown key: ok %v, err %v", ok, err)
	}
	if _, ok, err := q.EventBySeq(ctx, "other", 1); ok || err != nil {
		t.Errorf("seq of another source: ok %v, err %v", ok, err)
	}
}
