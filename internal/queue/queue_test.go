package queue

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/queue/queuetest"
)

func openTest(t testing.TB, path string, perFrame int) *Queue {
	t.Helper()
	return openWindow(t, path, perFrame, 0)
}

// openWindow is openTest with a dedupe window (0: the default).
func openWindow(t testing.TB, path string, perFrame int, window time.Duration) *Queue {
	t.Helper()
	q, err := Open(Options{Path: path, EventsPerFrame: perFrame, DedupeWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	})
	return q
}

func batch(source string, from, n int, cursor string) Batch {
	b := Batch{Source: source, FetchedAt: time.Now(), RawKey: fmt.Sprintf("%s/raw-%d", source, from), Cursor: cursor, SetCursor: cursor != ""}
	for i := from; i < from+n; i++ {
		b.Events = append(b.Events, NewEvent{Key: fmt.Sprintf("k%d", i), RawOff: i * 10, RawLen: 10, Payload: []byte(`{}`)})
	}
	return b
}

func TestAppendPacksFramesDedupesAndStoresCursor(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	ctx := t.Context()
	frames, err := q.Append(ctx, batch("a", 0, 10, "10"))
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) != 3 || len(frames[0].Events) != 4 || len(frames[2].Events) != 2 {
		t.Fatalf("want frames of 4,4,2 events, got %d frames", len(frames))
	}
	if got := q.PendingEvents(); got != 10 {
		t.Fatalf("pending = %d, want 10", got)
	}
	// Overlapping re-fetch: k5..k14, only k10..k14 are new.
	frames, err = q.Append(ctx, batch("a", 5, 10, "15"))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, f := range frames {
		for _, e := range f.Events {
			if e.Key < "k10" && len(e.Key) == 2 {
				t.Errorf("duplicate %s was queued again", e.Key)
			}
			n++
		}
	}
	if n != 5 || q.PendingEvents() != 15 {
		t.Fatalf("new events = %d pending = %d, want 5 and 15", n, q.PendingEvents())
	}
	// Same keys in another source are distinct.
	if frames, err = q.Append(ctx, batch("b", 0, 3, "")); err != nil || len(frames) != 1 || len(frames[0].Events) != 3 {
		t.Fatalf("source b: frames=%v err=%v", frames, err)
	}
	c, ok, err := q.Cursor(ctx, "a")
	if err != nil || !ok || c != "15" {
		t.Fatalf("cursor of a = %q %v %v, want 15", c, ok, err)
	}
	if _, ok, _ := q.Cursor(ctx, "b"); ok {
		t.Error("source b has a cursor though none was set")
	}
}

func TestAckFramesAndKeysAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	q, err := Open(Options{Path: path, EventsPerFrame: 5})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	frames, err := q.Append(ctx, batch("a", 0, 10, "9"))
	if err != nil {
		t.Fatal(err)
	}
	cleared, err := q.Ack(ctx, []int64{frames[0].ID, 99999}, []KeyAck{{Frame: frames[1].ID, Source: "a", Key: "k5"}, {Frame: frames[1].ID, Source: "a", Key: "k5"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cleared) != 1 || cleared[0] != frames[0].ID {
		t.Fatalf("cleared = %v, want only %d", cleared, frames[0].ID)
	}
	if q.PendingEvents() != 4 || q.PendingFrames() != 1 {
		t.Fatalf("pending events=%d frames=%d, want 4 and 1", q.PendingEvents(), q.PendingFrames())
	}
	f, ok, err := q.LoadFrame(ctx, frames[1].ID)
	if err != nil || !ok || len(f.Events) != 4 || f.Events[0].Key != "k6" || f.Events[0].RawKey != "a/raw-0" || f.Events[0].RawOff != 60 {
		t.Fatalf("LoadFrame = %+v %v %v", f, ok, err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	q = openTest(t, path, 5)
	if q.PendingEvents() != 4 || q.PendingFrames() != 1 {
		t.Fatalf("after reopen pending events=%d frames=%d, want 4 and 1", q.PendingEvents(), q.PendingFrames())
	}
	ids, err := q.FramesAfter(ctx, 0, 10)
	if err != nil || len(ids) != 1 || ids[0] != frames[1].ID {
		t.Fatalf("FramesAfter = %v %v", ids, err)
	}
	// Acked keys are remembered: re-appending them queues nothing.
	again, err := q.Append(ctx, batch("a", 0, 10, "9"))
	if err != nil || len(again) != 0 {
		t.Fatalf("re-append queued %d frames, err %v", len(again), err)
	}
	// Completing the frame key by key clears it.
	var keys []KeyAck
	for _, e := range f.Events {
		keys = append(keys, KeyAck{Frame: f.ID, Source: "a", Key: e.Key})
	}
	cleared, err = q.Ack(ctx, nil, keys)
	if err != nil || len(cleared) != 1 || q.PendingEvents() != 0 || q.PendingFrames() != 0 {
		t.Fatalf("ack by keys: cleared=%v err=%v pending=%d", cleared, err, q.PendingEvents())
	}
	// New frames get ids above every earlier one, even after reopen.
	fr, err := q.Append(ctx, batch("a", 100, 1, ""))
	if err != nil || fr[0].ID <= frames[1].ID {
		t.Fatalf("new frame id %v not above %d (err %v)", fr, frames[1].ID, err)
	}
}

func TestDeadLetterFrameAndPrune(t *testing.T) {
	q := openWindow(t, filepath.Join(t.TempDir(), "q.db"), 10, time.Nanosecond)
	ctx := t.Context()
	frames, err := q.Append(ctx, batch("a", 0, 20, ""))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := q.DeadLetterFrame(ctx, frames[0].ID, "max deliveries reached"); err != nil || n != 10 {
		t.Fatalf("dead-lettered %d events (err %v), want 10", n, err)
	}
	dl, err := q.DeadLetters(ctx, 100)
	if err != nil || len(dl) != 10 || dl[0].Frame != frames[0].ID || dl[0].RawKey != "a/raw-0" || dl[0].Key != "k0" || dl[0].Seq != frames[0].Events[0].Seq {
		t.Fatalf("dead letters = %+v %v", dl, err)
	}
	if q.PendingEvents() != 10 || q.PendingFrames() != 1 {
		t.Fatalf("pending = %d events %d frames, want 10 and 1", q.PendingEvents(), q.PendingFrames())
	}
	// Events held by active dead letters are never pruned.
	if n, err := q.Prune(ctx); err != nil || n != 0 {
		t.Fatalf("prune deleted %d (err %v), want none: the dead-lettered events are held", n, err)
	}
	if _, err := q.Ack(ctx, []int64{frames[1].ID}, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Prune(ctx); err != nil || n != 10 {
		t.Fatalf("prune after ack deleted %d (err %v), want the 10 acked", n, err)
	}
	// Dropping the dead letters releases their events to retention; the
	// dead-letter rows themselves are gone only because they were dropped.
	if n, err := q.DropDeadLetters(ctx, DLQFilter{Source: "a"}); err != nil || n != 10 {
		t.Fatalf("dropped %d (err %v), want 10", n, err)
	}
	if n, err := q.Prune(ctx); err != nil || n != 10 {
		t.Fatalf("prune after drop deleted %d (err %v), want 10", n, err)
	}
}

// TestIDsNeverReused prunes everything, reopens, and checks that new frames
// and events get ids above every earlier one: a late ack of an old frame
// must never clear a new one.
func TestIDsNeverReused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	q, err := Open(Options{Path: path, EventsPerFrame: 10, DedupeWindow: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	frames, err := q.Append(ctx, batch("a", 0, 30, ""))
	if err != nil {
		t.Fatal(err)
	}
	last := frames[len(frames)-1]
	ids := []int64{frames[0].ID, frames[1].ID, last.ID}
	if _, err := q.Ack(ctx, ids, nil); err != nil {
		t.Fatal(err)
	}
	// The first switch of generations empties the other, empty one; the
	// second forgets the first generation's keys.
	if n, err := q.Prune(ctx); err != nil || n != 0 {
		t.Fatalf("first prune forgot %d (err %v), want 0", n, err)
	}
	if n, err := q.Prune(ctx); err != nil || n != 30 {
		t.Fatalf("second prune forgot %d (err %v), want 30", n, err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q = openTest(t, path, 10)
	again, err := q.Append(ctx, batch("a", 100, 1, ""))
	if err != nil {
		t.Fatal(err)
	}
	if again[0].ID <= last.ID || again[0].Events[0].Seq <= last.Events[len(last.Events)-1].Seq {
		t.Fatalf("after prune and reopen: frame %d seq %d, not above frame %d seq %d",
			again[0].ID, again[0].Events[0].Seq, last.ID, last.Events[len(last.Events)-1].Seq)
	}
}

// TestTryAppendAsyncReportsFullAndCallsBack holds the write lock from a
// second connection so that the writer blocks for real: TryAppendAsync
// then fills the writer and reports ErrFull without waiting, and the room
// callback comes once the lock is released and the writer takes work.
func TestTryAppendAsyncReportsFullAndCallsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	q := openTest(t, path, 4)
	release := queuetest.HoldWriteLock(t, path)
	room := make(chan struct{}, 1)
	committed := make(chan error, 1024)
	n := 0
	for ; ; n++ {
		if n == 1000 {
			t.Fatal("1000 batches were enqueued while the writer was blocked: TryAppendAsync never reported ErrFull")
		}
		err := q.TryAppendAsync(batch("a", n, 1, fmt.Sprint(n)), nil, func(_ []Frame, err error) { committed <- err },
			func() { room <- struct{}{} })
		if errors.Is(err, ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-room:
		t.Fatal("room was called while the writer was blocked")
	default:
	}
	release()
	select {
	case <-room:
	case <-time.After(10 * time.Second):
		t.Fatal("room was not called after the writer resumed")
	}
	for i := range n {
		if err := <-committed; err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	if c, _, err := q.Cursor(t.Context(), "a"); err != nil || c != fmt.Sprint(n-1) {
		t.Fatalf("cursor = %q (%v), want %d", c, err, n-1)
	}
}

// TestFailedChainAppliesNothing fails a chain the way the Publisher does
// for a batch it could not hand over: later batches on it are not applied.
func TestFailedChainAppliesNothing(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	chain := &Chain{}
	chain.Fail(errors.New("batch 1 was never queued"))
	done := make(chan error, 1)
	if err := q.TryAppendAsync(batch("a", 0, 3, "3"), chain, func(_ []Frame, err error) { done <- err }, func() {}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "never queued") {
		t.Fatalf("append on a failed chain: %v, want the chain's error", err)
	}
	if _, ok, _ := q.Cursor(t.Context(), "a"); ok || q.PendingEvents() != 0 {
		t.Fatalf("a batch on a failed chain was applied: pending %d", q.PendingEvents())
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.TryAppendAsync(batch("a", 0, 1, ""), nil, func([]Frame, error) {}, func() {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("TryAppendAsync after Close: %v, want ErrClosed", err)
	}
}

// TestOpenInDirWithURICharacters opens a queue in a directory whose name
// holds the characters a SQLite URI gives a meaning to: the database must
// be created at the path given, and work.
func TestOpenInDirWithURICharacters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data?x=1#frag%41 dir")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "queue.db")
	q := openTest(t, path, 10)
	if _, err := q.Append(t.Context(), batch("a", 0, 3, "c1")); err != nil {
		t.Fatalf("append: %v", err)
	}
	if cursor, ok, err := q.Cursor(t.Context(), "a"); err != nil || !ok || cursor != "c1" {
		t.Fatalf("cursor = %q, %v, %v; want c1 read back", cursor, ok, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the database is not at the path given: %v", err)
	}
	if stray, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), "data*")); len(stray) != 1 {
		t.Errorf("files next to the data dir: %q, want only the data dir", stray)
	}
}

// TestOpenRelativePath opens a queue by a relative path, as the default
// data_dir "./data" gives: the database must be created there and work.
func TestOpenRelativePath(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.Mkdir("data", 0o755); err != nil {
		t.Fatal(err)
	}
	q := openTest(t, "data/queue.db", 10)
	if _, err := q.Append(t.Context(), batch("a", 0, 2, "c1")); err != nil {
		t.Fatalf("append: %v", err)
	}
	if _, err := os.Stat("data/queue.db"); err != nil {
		t.Fatalf("the database is not at the path given: %v", err)
	}
}

// TestDuplicateBetweenNewEventsKeepsThem appends batches where known keys
// sit between new ones, and a key repeated within the batch. SQLite's
// AUTOINCREMENT spends an id on each skipped duplicate, so the new
// events' ids are not consecutive: every new event must still come back
// in a frame with its own seq, and the frames loaded from the database
// must hold the same events.
func TestDuplicateBetweenNewEventsKeepsThem(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 8)
	ctx := t.Context()
	if _, err := q.Append(ctx, Batch{Source: "s", FetchedAt: time.Now(), RawKey: "s/raw-0",
		Events: []NewEvent{{Key: "a", RawLen: 1}, {Key: "b", RawOff: 1, RawLen: 1}}}); err != nil {
		t.Fatal(err)
	}
	keys := []string{"x", "a", "y", "b", "z", "x", "w"}
	b := Batch{Source: "s", FetchedAt: time.Now(), RawKey: "s/raw-1"}
	for i, k := range keys {
		b.Events = append(b.Events, NewEvent{Key: k, RawOff: i, RawLen: 1})
	}
	frames, err := q.Append(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Event{}
	for _, f := range frames {
		loaded, ok, err := q.LoadFrame(ctx, f.ID)
		if err != nil || !ok {
			t.Fatalf("load frame %d: ok %v err %v", f.ID, ok, err)
		}
		if len(loaded.Events) != len(f.Events) {
			t.Errorf("frame %d: appended with %d events, loaded with %d", f.ID, len(f.Events), len(loaded.Events))
		}
		for i, e := range f.Events {
			got[e.Key] = e
			if i < len(loaded.Events) && (loaded.Events[i].Seq != e.Seq || loaded.Events[i].Key != e.Key) {
				t.Errorf("frame %d event %d: appended %s/%d, loaded %s/%d", f.ID, i, e.Key, e.Seq, loaded.Events[i].Key, loaded.Events[i].Seq)
			}
		}
	}
	for _, k := range []string{"x", "y", "z", "w"} {
		e, ok := got[k]
		if !ok {
			t.Errorf("new event %s is in no frame", k)
			continue
		}
		st, ok, err := q.EventByKey(ctx, "s", k)
		if err != nil || !ok || st.Seq != e.Seq {
			t.Errorf("event %s: frame seq %d, ledger %+v (ok %v, err %v)", k, e.Seq, st, ok, err)
		}
		if want := map[string]int{"x": 0, "y": 2, "z": 4, "w": 6}[k]; e.RawOff != want {
			t.Errorf("event %s: raw offset %d, want %d (the first of a repeated key wins)", k, e.RawOff, want)
		}
	}
	if len(got) != 4 || q.PendingEvents() != 6 {
		t.Errorf("%d new events in frames, %d pending; want 4 and 6", len(got), q.PendingEvents())
	}
}

// TestOnlyAcksCommitWithoutFsync checks which commits wait for an fsync
// under synchronous = full: a group of acks (and delivery counts) commits
// with NORMAL, since losing it to a power cut only resends its events; an
// append, whose commit a cursor or a sender's answer waits for, commits
// with FULL again, and its fsync of the WAL covers the acks before it; a
// push group's append commits with NORMAL and the writer's own fsync of
// the WAL (walsync.go). Under synchronous = normal nothing changes the
// mode.
func TestOnlyAcksCommitWithoutFsync(t *testing.T) {
	mode := func(q *Queue) int {
		t.Helper()
		var m int
		if err := q.wdb.QueryRow(`PRAGMA synchronous`).Scan(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	const normal, full = 1, 2
	for _, configured := range []string{"full", "normal"} {
		t.Run(configured, func(t *testing.T) {
			q, err := Open(Options{Path: filepath.Join(t.TempDir(), "q.db"), EventsPerFrame: 10, Synchronous: configured})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := q.Close(); err != nil {
					t.Error(err)
				}
			}()
			ctx := t.Context()
			want := func(after string, fullWant int) {
				t.Helper()
				if configured == "normal" {
					fullWant = normal
				}
				if got := mode(q); got != fullWant {
					t.Errorf("after %s: synchronous = %d, want %d", after, got, fullWant)
				}
			}
			want("open", full)
			frames, err := q.Append(ctx, batch("a", 0, 3, "3"))
			if err != nil {
				t.Fatal(err)
			}
			want("an append", full)
			if err := q.CountDeliveries(ctx, []int64{frames[0].ID}); err != nil {
				t.Fatal(err)
			}
			want("a delivery count", normal)
			if cleared, err := q.Ack(ctx, []int64{frames[0].ID}, nil); err != nil || len(cleared) != 1 {
				t.Fatalf("ack: %v %v", cleared, err)
			}
			want("an ack", normal)
			if _, err := q.Append(ctx, batch("a", 3, 3, "6")); err != nil {
				t.Fatal(err)
			}
			want("an append after acks", full)
			if _, err := q.Ack(ctx, []int64{frames[0].ID}, nil); err != nil {
				t.Fatal(err)
			}
			want("another ack", normal)
			if err := q.DeadLetter(ctx, "a", "malformed", "a/raw-9", ""); err != nil {
				t.Fatal(err)
			}
			want("a dead letter", full)

			// A push group's append commits with NORMAL, and the writer
			// fsyncs the WAL itself (walsync.go).
			syncs := q.walSyncs.Load()
			written := make(chan error, 1)
			written <- nil
			wait, err := q.AppendAfter(ctx, batch("a", 9, 3, ""), written)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := wait(); err != nil {
				t.Fatal(err)
			}
			want("a push group's append", normal)
			if synced := q.walSyncs.Load() > syncs; synced != (configured == "full") {
				t.Errorf("the writer synced the WAL after a push group's append: %v, want %v", synced, configured == "full")
			}
		})
	}
}
