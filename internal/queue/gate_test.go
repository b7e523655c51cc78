package queue

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// committed reports whether source's key is committed, as a reader sees it.
func committed(t *testing.T, q *Queue, source, key string) bool {
	t.Helper()
	_, ok, err := q.EventByKey(t.Context(), source, key)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestAppendAfterCommitsOnceWritten(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	written := make(chan error, 1)
	wait, err := q.AppendAfter(t.Context(), keysBatch("hooks", "r1", "k1", "k2"), written)
	if err != nil {
		t.Fatal(err)
	}
	written <- nil
	frames, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(frames); n != 1 || len(frames[0].Events) != 2 {
		t.Fatalf("frames %+v, want one of 2 events", frames)
	}
	if !committed(t, q, "hooks", "k1") || !committed(t, q, "hooks", "k2") {
		t.Error("the keys of an append whose write succeeded are not committed")
	}
}

// A write that fails commits nothing of its append: its keys are new to a
// later append, and the raw object is not referenced.
func TestAppendAfterAFailedWriteCommitsNothing(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	written := make(chan error, 1)
	wait, err := q.AppendAfter(t.Context(), keysBatch("hooks", "r1", "k1"), written)
	if err != nil {
		t.Fatal(err)
	}
	disk := errors.New("disk on fire")
	written <- disk
	if _, err := wait(); !errors.Is(err, disk) {
		t.Fatalf("wait: %v, want the write's error", err)
	}
	if committed(t, q, "hooks", "k1") {
		t.Error("the key of an append whose write failed is committed")
	}
	inUse, err := q.RawKeysInUse(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if inUse["r1"] {
		t.Error("the raw object of a failed write is referenced")
	}
	if n, _ := appendNew(t, q, keysBatch("hooks", "r2", "k1")); n != 1 {
		t.Errorf("k1 appended again after its write failed: %d new, want 1", n)
	}
}

// A write that outlasts gateWait does not hold the writer: its append is
// rolled back, other commits go on, and it commits once the write ends.
func TestAppendAfterASlowWriteHoldsNoOtherCommit(t *testing.T) {
	deferring := make(chan struct{}, 1)
	deferringGated = func() { deferring <- struct{}{} }
	t.Cleanup(func() { deferringGated = nil }) // after the queue's own cleanup closed it
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	written := make(chan error, 1)
	wait, err := q.AppendAfter(t.Context(), keysBatch("hooks", "r1", "k1"), written)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-deferring:
	case <-time.After(time.Minute):
		t.Fatal("the writer never gave up waiting for the write")
	}
	if n, _ := appendNew(t, q, keysBatch("polled", "r2", "p1")); n != 1 {
		t.Fatalf("an append while the write runs: %d new, want 1", n)
	}
	if committed(t, q, "hooks", "k1") {
		t.Fatal("an append is committed before its write ended")
	}
	written <- nil
	frames, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) != 1 || frames[0].Events[0].Key != "k1" {
		t.Fatalf("frames %+v, want k1's", frames)
	}
	if !committed(t, q, "hooks", "k1") {
		t.Error("the append is not committed once its write ended")
	}
	if n := q.PendingEvents(); n != 2 {
		t.Errorf("%d events pending, want 2", n)
	}
}
