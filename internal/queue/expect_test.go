package queue

import (
	"path/filepath"
	"testing"
	"time"
)

// TestAcksCommitWithAnExpectedAppend: while an append is expected
// (Expect), an ack that reaches the writer is held and commits in the
// append's transaction, one synced commit for both and no lazy one; when
// the expected append does not come, the held ack commits on its own
// once the caller says so. Either way the ack takes effect.
func TestAcksCommitWithAnExpectedAppend(t *testing.T) {
	holding := make(chan struct{}, 1)
	holdingLazy = func() { holding <- struct{}{} }
	t.Cleanup(func() { holdingLazy = nil }) // after the queue's own cleanup closed it
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	_, first := appendNew(t, q, keysBatch("hooks", "r1", "k1", "k2"))
	acked := make(chan error, 1)
	ack := func(frames []Frame) {
		go func() {
			_, err := q.Ack(t.Context(), []int64{frames[0].ID}, nil)
			acked <- err
		}()
	}

	synced0, lazy0 := q.Commits()
	done := q.Expect()
	ack(first)
	waitHolding(t, holding)
	_, second := appendNew(t, q, keysBatch("hooks", "r2", "k3"))
	done()
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
	if synced, lazy := q.Commits(); synced != synced0+1 || lazy != lazy0 {
		t.Errorf("an ack held for the expected append: %d synced and %d lazy commits, want 1 and 0", synced-synced0, lazy-lazy0)
	}
	if n := q.PendingFrames(); n != 1 {
		t.Errorf("%d frames pending after the first was acked, want 1", n)
	}

	done = q.Expect()
	ack(second)
	waitHolding(t, holding)
	done() // the append does not come
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
	if synced, lazy := q.Commits(); synced != synced0+1 || lazy != lazy0+1 {
		t.Errorf("an ack whose expected append did not come: %d synced and %d lazy commits, want 0 and 1 more", synced-synced0-1, lazy-lazy0)
	}
	if n := q.PendingFrames(); n != 0 {
		t.Errorf("%d frames pending after both were acked", n)
	}
}

// waitHolding waits until the writer holds a lazy group, failing the test
// after a minute.
func waitHolding(t *testing.T, holding <-chan struct{}) {
	t.Helper()
	select {
	case <-holding:
	case <-time.After(time.Minute):
		t.Fatal("the writer never held the ack for the expected append")
	}
}
