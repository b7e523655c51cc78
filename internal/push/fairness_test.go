package push

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/queue/queuetest"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// tally counts what a source's commits were answered.
type tally struct {
	stored, refused atomic.Int64
}

// commitOne commits one event keyed key for source into in, in a goroutine
// of wg, and counts its answer in n.
func commitOne(t *testing.T, wg *sync.WaitGroup, in *Inbox, n *tally, source, key string) {
	wg.Go(func() {
		body := fmt.Appendf(nil, `{"id":%q}`, key)
		outs, err := in.Commit(context.Background(), source, body, []Event{{Key: key, Len: len(body)}})
		var busy *BusyError
		switch {
		case errors.As(err, &busy):
			n.refused.Add(1)
		case err != nil:
			t.Errorf("%s %s: %v", source, key, err)
		case !outs[0].New:
			t.Errorf("%s %s: answered as a duplicate", source, key)
		default:
			n.stored.Add(1)
		}
	})
}

// TestInboxBurstSourceCannotStarveAnother fills every waiting slot of the
// group commit with one source's requests while the commit is stalled (a
// second SQLite connection holds the queue's write lock), then a second
// source offers a few requests. They must be let in, each in place of the
// burst's newest waiting request (which is answered "retry later", as if
// refused on arrival), and committed once the commit resumes. Before,
// admission was first come first served: every request of the second
// source was refused for as long as the burst kept the slots full, so a
// flood of devices on one ws_ingress source could starve a webhook source
// of the same daemon.
func TestInboxBurstSourceCannotStarveAnother(t *testing.T) {
	const slots, extra, trickle = 64, 10, 8
	dir := t.TempDir()
	in, q, _, _ := openInboxIn(t, dir, 1_000_000, func(o *InboxOptions) { o.MaxWaiting = slots })
	release := queuetest.HoldWriteLock(t, filepath.Join(dir, "queue.db"))
	var burst, small tally
	var wg sync.WaitGroup
	// The first commit is taken by the worker, which then waits for the
	// write lock: nothing leaves the waiting line until it is released.
	commitOne(t, &wg, in, &burst, "burst", "b-0")
	testsync.WaitFor(t, "the first group's raw write", 10*time.Second, func() bool {
		entries, err := os.ReadDir(filepath.Join(dir, "raw"))
		return err == nil && len(entries) > 0
	})
	for i := range slots + extra {
		commitOne(t, &wg, in, &burst, "burst", fmt.Sprintf("b-%d", i+1))
	}
	testsync.WaitFor(t, "the burst to fill every waiting slot", 10*time.Second, func() bool { return burst.refused.Load() == extra })
	for i := range trickle {
		commitOne(t, &wg, in, &small, "trickle", fmt.Sprintf("t-%d", i))
	}
	// Each request of the trickle is either refused or let in in place of
	// one of the burst's.
	testsync.WaitFor(t, "every request of the trickle to be let in or refused", 10*time.Second, func() bool {
		return small.refused.Load()+burst.refused.Load()-extra == trickle
	})
	if n := small.refused.Load(); n > 0 {
		t.Errorf("%d of %d requests of the trickle source refused while the burst source held every waiting slot", n, trickle)
	}
	release()
	wg.Wait()
	if got := small.stored.Load(); got != trickle-small.refused.Load() {
		t.Errorf("%d requests of the trickle source stored, want every one let in (%d)", got, trickle-small.refused.Load())
	}
	if got, want := burst.stored.Load(), int64(1+slots)-(burst.refused.Load()-extra); got != want {
		t.Errorf("%d requests of the burst stored, want %d (the first, and the waiting ones not refused in the trickle's place)", got, want)
	}
	for i := range trickle - int(small.refused.Load()) {
		if _, ok, err := q.EventByKey(context.Background(), "trickle", fmt.Sprintf("t-%d", i)); err != nil || !ok {
			t.Errorf("t-%d is not in the ledger (err %v)", i, err)
		}
	}
}
