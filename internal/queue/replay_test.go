package queue

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// forgetBatch is a batch of source "s" with keys k<from>..k<from+n-1>.
func forgetBatch(from, n int) Batch {
	b := Batch{Source: "s", FetchedAt: time.Now(), RawKey: "s/raw.json"}
	for i := from; i < from+n; i++ {
		b.Events = append(b.Events, NewEvent{Key: fmt.Sprintf("k%d", i), RawOff: i, RawLen: 1})
	}
	return b
}

func frameKeys(frames []Frame) (keys []string, maxID int64) {
	for _, f := range frames {
		maxID = max(maxID, f.ID)
		for _, e := range f.Events {
			keys = append(keys, e.Key)
		}
	}
	return keys, maxID
}

// TestForgetRequeuesOnlyWhatIsNotPending checks forced redelivery: acked
// and dead-lettered events are forgotten and queued again by the next
// Append; a pending event is left alone and stays a duplicate.
func TestForgetRequeuesOnlyWhatIsNotPending(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	q, err := Open(Options{Path: path, EventsPerFrame: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	frames, err := q.Append(ctx, forgetBatch(0, 6)) // frames (k0 k1) (k2 k3) (k4 k5)
	if err != nil || len(frames) != 3 {
		t.Fatalf("append: %d frames, %v", len(frames), err)
	}
	_, firstMax := frameKeys(frames)
	if _, err := q.Ack(ctx, []int64{frames[0].ID}, []KeyAck{{Frame: frames[1].ID, Source: "s", Key: "k2"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.DeadLetterFrame(ctx, frames[2].ID, "test"); err != nil {
		t.Fatal(err)
	}
	if got := q.PendingEvents(); got != 1 {
		t.Fatalf("pending = %d, want 1 (k3)", got)
	}

	// Without Forget, everything is a duplicate.
	if again, err := q.Append(ctx, forgetBatch(0, 6)); err != nil || len(again) != 0 {
		t.Fatalf("append again: %d frames, %v; want all duplicates", len(again), err)
	}
	n, err := q.Forget(ctx, "s", []string{"k0", "k1", "k2", "k3", "k4", "k5", "unknown"})
	if err != nil || n != 5 {
		t.Fatalf("forget = %d, %v; want 5 (all but the pending k3)", n, err)
	}
	if n, err := q.Forget(ctx, "other", []string{"k0"}); err != nil || n != 0 {
		t.Fatalf("forget in another source = %d, %v; want 0", n, err)
	}
	again, err := q.Append(ctx, forgetBatch(0, 6))
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := frameKeys(again)
	if want := []string{"k0", "k1", "k2", "k4", "k5"}; !slices.Equal(keys, want) {
		t.Fatalf("queued again %q, want %q", keys, want)
	}
	if got := q.PendingEvents(); got != 6 {
		t.Fatalf("pending = %d, want 6", got)
	}

	// Ack everything and forget it all: with no frame and no event row
	// left, a reopened queue must still not reuse a frame id.
	var ids []int64
	for id := int64(0); ; {
		page, err := q.FramesAfter(ctx, id, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		ids = append(ids, page...)
		id = page[len(page)-1]
	}
	_, secondMax := frameKeys(again)
	if _, err := q.Ack(ctx, ids, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Forget(ctx, "s", []string{"k0", "k1", "k2", "k3", "k4", "k5"}); err != nil || n != 6 {
		t.Fatalf("forget after acks = %d, %v; want 6", n, err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q, err = Open(Options{Path: path, EventsPerFrame: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	}()
	frames, err = q.Append(ctx, forgetBatch(0, 1))
	if err != nil || len(frames) != 1 {
		t.Fatalf("append after reopen: %d frames, %v", len(frames), err)
	}
	if frames[0].ID <= max(firstMax, secondMax) {
		t.Fatalf("frame id %d reused (ids up to %d were allocated before)", frames[0].ID, max(firstMax, secondMax))
	}
}
