package queue

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/ingestorhq/ingestor/internal/durable"
)

// The WAL's sync of a push group's commit, with synchronous = full.
//
// SQLite with synchronous = FULL fsyncs the WAL inside its COMMIT, in a
// cgo call: the writer's goroutine holds its P (its right to run Go code)
// for the whole sync, and on two cores the goroutines readied meanwhile
// (the HTTP handlers reading the next group's requests, the sender, the
// inbox) wait for the runtime's monitor to take it back while a core sits
// idle. So a group holding a push group's append (a gated request,
// AppendAfter) commits with SQLite's NORMAL, which writes the same WAL
// frames and syncs the WAL only at a checkpoint (and its header when it
// starts over), and the writer then fsyncs the WAL itself on a sync
// thread (durable.DatasyncParked) before it finishes any request of the
// group: no caller, sender, device or cursor learns of the commit before
// its WAL frames are on disk, as with FULL. On the webhook path that was
// +7-16% requests/s in most pairs. Other groups keep FULL: on the polled
// path, whose two cores are busy, the sync thread's answer waits for the
// scheduler to poll the network, and the same change there cost 8% of
// the events/s (docs/performance.md).
//
// What differs from FULL: SQLite shows a commit to readers once it is
// written, before that sync. Two reads could pass it on: the sender's
// scan of the frames table for a backlog (a frame sent and acked before
// a power cut took it would have its id given again, and a stale ack
// would clear the new frame unread) and the event status lookups (a
// sender could be told "queued" about an event a power cut then takes).
// The writer publishes the highest frame id and seq known durable after
// each durable commit; FramesAfter lists no frame above it, and the
// status lookups wait for it to cover what they found. A failed sync
// fails its group and every later one (the kernel may have dropped the
// pages it could not write, so a later sync proves nothing about them):
// the queue is unusable until the daemon restarts.

// syncWALFile syncs the WAL file: durable.DatasyncParked, or a test's
// failure.
var syncWALFile = durable.DatasyncParked

// beforeWALSync, when set (by a test), runs on the writer between a
// commit and the WAL's sync.
var beforeWALSync func()

// errWALSync wraps a failed sync of the WAL, sticky: see above.
var errWALSync = errors.New("the queue's WAL could not be made durable; restart the daemon")

// durableMarks are the highest frame id and seq that a sync of the WAL
// made durable, and a channel closed at each advance.
type durableMarks struct {
	frame, seq atomic.Int64
	mu         sync.Mutex
	advanced   chan struct{}
	failed     error // sticky, under mu
}

// set publishes new marks and wakes the waiters.
func (m *durableMarks) set(frame, seq int64) {
	m.frame.Store(frame)
	m.seq.Store(seq)
	m.mu.Lock()
	m.wakeLocked()
	m.mu.Unlock()
}

// wakeLocked wakes the waiters of await; m.mu is held.
func (m *durableMarks) wakeLocked() {
	if m.advanced != nil {
		close(m.advanced)
		m.advanced = nil
	}
}

// fail records a failed sync and wakes the waiters.
func (m *durableMarks) fail(err error) {
	m.mu.Lock()
	m.failed = err
	m.wakeLocked()
	m.mu.Unlock()
}

// err returns the sticky failure, if any.
func (m *durableMarks) err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failed
}

// await waits until the durable seq reaches seq, ctx ends or a sync
// failed.
func (m *durableMarks) await(ctx context.Context, seq int64) error {
	for {
		if m.seq.Load() >= seq {
			return nil
		}
		m.mu.Lock()
		if m.failed != nil {
			m.mu.Unlock()
			return m.failed
		}
		if m.seq.Load() >= seq { // advanced before the lock
			m.mu.Unlock()
			return nil
		}
		if m.advanced == nil {
			m.advanced = make(chan struct{})
		}
		ch := m.advanced
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for the commit to be durable: %w", ctx.Err())
		}
	}
}

// ownWALSync reports whether the writer syncs the WAL itself after its
// commits (synchronous = full).
func (q *Queue) ownWALSync() bool { return q.opts.Synchronous != "normal" }

// syncCommitted makes the writer's last commit durable: an fsync of the
// WAL, on a sync thread, then the marks published.
func (q *Queue) syncCommitted() error {
	if err := q.durable.err(); err != nil {
		return err
	}
	if beforeWALSync != nil {
		beforeWALSync()
	}
	err := q.openWAL()
	if err == nil {
		err = syncWALFile(q.wal)
	}
	if err != nil {
		err = fmt.Errorf("%w: fsync %s-wal: %w", errWALSync, q.opts.Path, err)
		q.opts.Logger.Error("the queue's WAL could not be made durable: every commit fails until the daemon restarts",
			"path", q.opts.Path+"-wal", "err", err)
		q.durable.fail(err)
		return err
	}
	q.walSyncs.Add(1)
	q.durable.set(q.nextFrame-1, q.highSeq)
	return nil
}

// openWAL opens the WAL file for its sync, or again when SQLite made a
// new one (the last connection closing deletes it: the file held open
// has no name left).
func (q *Queue) openWAL() error {
	if q.wal != nil {
		fi, err := q.wal.Stat()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Nlink > 0 {
			return nil
		}
		_ = q.wal.Close() // only read for its sync
		q.wal = nil
	}
	f, err := os.OpenFile(q.opts.Path+"-wal", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	q.wal = f
	return nil
}

// syncAtOpen makes what an earlier process committed durable before
// anything is read (a process killed between a commit and its sync left
// it in the page cache alone), and publishes the marks.
func (q *Queue) syncAtOpen() error {
	if !q.ownWALSync() {
		q.durable.set(q.nextFrame-1, q.highSeq)
		return nil
	}
	f, err := os.OpenFile(q.opts.Path+"-wal", os.O_RDWR, 0)
	if err == nil {
		err = errors.Join(durable.Datasync(f), f.Close())
	} else if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("fsync the queue's WAL: %w", err)
	}
	q.durable.set(q.nextFrame-1, q.highSeq)
	return nil
}
