package queue

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// pushAppend appends b as the push inbox does (AppendAfter, its raw write
// already done), which the writer commits with its own sync of the WAL.
func pushAppend(ctx context.Context, q *Queue, b Batch) ([]Frame, error) {
	written := make(chan error, 1)
	written <- nil
	wait, err := q.AppendAfter(ctx, b, written)
	if err != nil {
		return nil, err
	}
	return wait()
}

// TestNothingIsReadBeforeTheWALSync: between a push group's commit and
// the writer's fsync of the WAL, SQLite already shows the commit to
// readers; neither
// the sender's scan of the backlog nor a status lookup may report it
// until the sync made it durable (walsync.go). The writer is held between
// the two by a test hook.
func TestNothingIsReadBeforeTheWALSync(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 10)
	ctx := t.Context()
	if _, err := q.Append(ctx, batch("a", 0, 3, "")); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	beforeWALSync = func() {
		close(held)
		<-release
	}
	t.Cleanup(func() { beforeWALSync = nil })
	appended := make(chan []Frame, 1)
	go func() {
		frames, err := pushAppend(context.Background(), q, batch("a", 3, 3, ""))
		if err != nil {
			t.Error(err)
		}
		appended <- frames
	}()
	<-held
	beforeWALSync = nil // the writer reads it before it blocks

	// The commit is visible to SQLite's readers now.
	var n int
	if err := q.rdb.QueryRowContext(ctx, `SELECT count(*) FROM frames`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d frames visible (%v), want both: the test would show nothing", n, err)
	}
	ids, err := q.FramesAfter(ctx, 0, 10)
	if err != nil || len(ids) != 1 {
		t.Errorf("FramesAfter before the sync: %v (%v), want the first frame alone", ids, err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	st, ok, err := q.EventByKey(short, "a", "k4")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("EventByKey before the sync: %+v, found %v, %v; want it to wait for the sync", st, ok, err)
	}
	short, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	m, err := q.EventsByKeys(short, "a", []string{"k0", "k4"})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("EventsByKeys before the sync: %v, %v; want it to wait for the sync", m, err)
	}
	if _, ok, err := q.EventByKey(ctx, "a", "k0"); err != nil || !ok {
		t.Errorf("EventByKey of an event synced before: found %v, %v", ok, err)
	}

	close(release)
	frames := <-appended
	if len(frames) != 1 {
		t.Fatalf("the held append returned %d frames", len(frames))
	}
	if ids, err := q.FramesAfter(ctx, 0, 10); err != nil || len(ids) != 2 || ids[1] != frames[0].ID {
		t.Errorf("FramesAfter after the sync: %v (%v), want both frames", ids, err)
	}
	if st, ok, err := q.EventByKey(ctx, "a", "k4"); err != nil || !ok || st.Status != StatusQueued {
		t.Errorf("EventByKey after the sync: %+v, found %v, %v", st, ok, err)
	}
}

// TestAFailedWALSyncFailsEveryLaterCommit: a push group's commit whose
// WAL sync fails is reported failed, and so is every later commit, a
// polled page's too, even once the disk syncs
// again (the kernel may have dropped what it could not write); a status
// lookup of the unsynced event fails rather than report it.
func TestAFailedWALSyncFailsEveryLaterCommit(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 10)
	ctx := t.Context()
	if _, err := q.Append(ctx, batch("a", 0, 3, "")); err != nil {
		t.Fatal(err)
	}
	syncWALFile = func(*os.File) error { return syscall.EIO }
	t.Cleanup(func() { syncWALFile = realSyncWALFile })
	if _, err := pushAppend(ctx, q, batch("a", 3, 3, "")); !errors.Is(err, errWALSync) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("append whose WAL sync failed: %v, want the sync's failure", err)
	}
	syncWALFile = realSyncWALFile
	if _, err := q.Append(ctx, batch("a", 6, 3, "")); !errors.Is(err, errWALSync) {
		t.Errorf("append after a failed WAL sync: %v, want the sticky failure", err)
	}
	if _, ok, err := q.EventByKey(ctx, "a", "k4"); !errors.Is(err, errWALSync) {
		t.Errorf("status of an event whose sync failed: found %v, %v; want the failure", ok, err)
	}
	if _, ok, err := q.EventByKey(ctx, "a", "k0"); err != nil || !ok {
		t.Errorf("status of an event synced before the failure: found %v, %v", ok, err)
	}
}

// realSyncWALFile is syncWALFile as the queue runs it.
var realSyncWALFile = syncWALFile
