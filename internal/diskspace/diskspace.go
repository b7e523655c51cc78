// Package diskspace watches the free space of the file systems the daemon
// writes to (its data dir, and a file raw store's directory) and says when
// new work must wait for space: below daemon.min_free_bytes, and after a
// write failed for lack of space (ENOSPC, SQLite's SQLITE_FULL) until space
// comes back. Sources stop polling and push sources answer 503 while it
// does; delivery and acks go on, so that retention frees what the
// processors acknowledge.
package diskspace

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mattn/go-sqlite3"
	"github.com/prometheus/client_golang/prometheus"
)

// ResumeAfterFull is the free space every watched file system needs, as
// well as min_free_bytes, before work resumes after a write failed for
// lack of space: without it, a watermark of 0 would resume as soon as a
// few bytes were freed, and fail again at once.
const ResumeAfterFull = 64 << 20

// UnsizedRetry is how long work waits after a write failed for lack of
// space when a watched file system reports no size (so free space cannot
// show that room came back) before it tries again.
const UnsizedRetry = 30 * time.Second

// DefaultInterval is how often Run reads the free space.
const DefaultInterval = time.Second

// Fresh is how old a reading Low may answer from: at the daemon's
// fastest, about 1 MiB is written in that time, far less than any
// sensible min_free_bytes. A statfs costs a microsecond or two.
const Fresh = 100 * time.Millisecond

// IsFull reports whether err is a write that failed for lack of space:
// ENOSPC or EDQUOT from the file system, SQLITE_FULL from SQLite.
func IsFull(err error) bool {
	if err == nil {
		return false
	}
	var se sqlite3.Error
	if errors.As(err, &se) && se.Code == sqlite3.ErrFull {
		return true
	}
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Options configure a Guard.
type Options struct {
	// Paths are the directories to watch; one that does not exist yet is
	// watched through its nearest existing parent.
	Paths []string
	// MinFree is daemon.min_free_bytes: below it on any path, Low reports
	// true. 0 turns the watermark off (only failed writes pause work).
	MinFree int64
	// Interval is how often the free space is read. Default DefaultInterval.
	Interval time.Duration
	Logger   *slog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// statfs reads a path's free bytes; tests replace it.
	statfs func(path string) (int64, error)
}

// Guard is the daemon's view of its disks. Low is cheap (an atomic load):
// every poll calls it.
type Guard struct {
	o     Options
	state atomic.Pointer[State]
	// mu orders checks: Check runs from the ticker and from Failed.
	mu sync.Mutex
	// full is set by Failed and cleared once every path has
	// max(MinFree, ResumeAfterFull) free.
	full    bool
	fullErr string
	fullAt  time.Time
	// unsized are the paths whose file system reports no size, logged once.
	unsized map[string]bool

	freeBytes *prometheus.GaugeVec
	low       prometheus.Gauge
	failures  prometheus.Counter
}

// State is what the last check found.
type State struct {
	// Low is true while new work must wait for space.
	Low bool
	// Reason says why, naming the path and its free bytes ("" when not Low).
	Reason string
	// Free is each path's free bytes at the check.
	Free map[string]int64
	at   time.Time
}

// New reads every path's free space once and returns a Guard; Run keeps
// it current. A path whose file system cannot be read is an error.
func New(o Options) (*Guard, error) {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.statfs == nil {
		o.statfs = statfsFree
	}
	o.Paths = slices.Compact(slices.Sorted(slices.Values(o.Paths)))
	g := &Guard{o: o, unsized: map[string]bool{},
		freeBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ingestor_disk_free_bytes",
			Help: "Free bytes of the file system of each directory the daemon writes to (data dir, file raw store)."}, []string{"path"}),
		low: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_disk_full",
			Help: "1 while sources pause and push sources answer 503 for lack of disk space (below daemon.min_free_bytes, or after a write failed with ENOSPC or SQLITE_FULL)."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_disk_full_errors_total",
			Help: "Writes that failed for lack of disk space (ENOSPC, SQLITE_FULL); the work is retried once space returns."}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(g.freeBytes, g.low, g.failures)
	}
	for _, p := range o.Paths {
		if _, err := o.statfs(p); err != nil {
			return nil, fmt.Errorf("disk space of %s: %w", p, err)
		}
	}
	g.Check()
	return g, nil
}

// Run checks the free space every Interval until done is closed.
func (g *Guard) Run(done <-chan struct{}) {
	t := time.NewTicker(g.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			g.Check()
		}
	}
}

// Low reports whether new work must wait for space, and why. A state
// older than Fresh is read again first (unless a check is under way), so
// that a fast writer cannot run far past the watermark between two ticks
// of Run.
func (g *Guard) Low() (reason string, low bool) {
	s := g.state.Load()
	if time.Since(s.at) > Fresh && g.mu.TryLock() {
		g.check()
		g.mu.Unlock()
		s = g.state.Load()
	}
	return s.Reason, s.Low
}

// State returns what the last check found.
func (g *Guard) State() State { return *g.state.Load() }

// Failed takes note of a write's error: when it is a lack of space
// (IsFull), work waits until every path has max(MinFree, ResumeAfterFull)
// free, and Failed returns true. Other errors are ignored.
func (g *Guard) Failed(err error) bool {
	if !IsFull(err) {
		return false
	}
	g.failures.Inc()
	g.mu.Lock()
	g.full, g.fullErr, g.fullAt = true, err.Error(), time.Now()
	g.mu.Unlock()
	g.Check()
	return true
}

// Check reads the free space now and updates the state, logging each
// change.
func (g *Guard) Check() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.check()
}

// check is Check with g.mu held.
func (g *Guard) check() {
	next := &State{Free: make(map[string]int64, len(g.o.Paths)), at: time.Now()}
	resume := max(g.o.MinFree, ResumeAfterFull)
	allRoom, unsized := true, false
	for _, p := range g.o.Paths {
		free, err := g.o.statfs(p)
		if err != nil {
			// Keep the last reading: a failed statfs says nothing about space.
			g.o.Logger.Warn("reading free disk space failed", "path", p, "err", err)
			last, ok := int64(0), false
			if prev := g.state.Load(); prev != nil {
				last, ok = prev.Free[p]
			}
			if !ok {
				continue // never read: nothing to judge by
			}
			free = last
		}
		if free == unknownFree {
			// The file system reports no size (some FUSE file systems):
			// only failed writes can tell that it is full.
			unsized = true
			if !g.unsized[p] {
				g.unsized[p] = true
				g.o.Logger.Warn("the file system reports no size: daemon.min_free_bytes cannot be checked there; only a write that fails for lack of space pauses the sources", "path", p)
			}
			continue
		}
		next.Free[p] = free
		g.freeBytes.WithLabelValues(p).Set(float64(free))
		if free < resume {
			allRoom = false
		}
		if !next.Low && free < g.o.MinFree {
			next.Low, next.Reason = true, fmt.Sprintf("%s has %d bytes free, below daemon.min_free_bytes %d", p, free, g.o.MinFree)
		}
	}
	// A file system without a size cannot show that space came back: work
	// tries again UnsizedRetry after the failure.
	if g.full && allRoom && (!unsized || next.at.Sub(g.fullAt) >= UnsizedRetry) {
		g.full = false
	}
	if g.full && !next.Low {
		next.Low, next.Reason = true, fmt.Sprintf("a write failed for lack of space (%s); waiting until every disk has %d bytes free", g.fullErr, resume)
	}
	prev := g.state.Swap(next)
	switch {
	case next.Low && (prev == nil || !prev.Low):
		g.low.Set(1)
		g.o.Logger.Error("disk space low: sources pause and push sources answer 503 until space returns; delivery and acks go on",
			"reason", next.Reason, "free_bytes", next.Free, "min_free_bytes", g.o.MinFree)
	case !next.Low && prev != nil && prev.Low:
		g.low.Set(0)
		g.o.Logger.Info("disk space is back: sources resume", "free_bytes", next.Free, "min_free_bytes", g.o.MinFree)
	}
}

// unknownFree is what statfs reads for a file system that reports no size
// (zero blocks in all, as some FUSE file systems do).
const unknownFree = -1

// statfsFree returns the bytes an unprivileged writer may still use on
// the file system of path, or of its nearest existing parent while path
// does not exist yet (a spill dir is made on first use); unknownFree when
// the file system reports no size.
func statfsFree(path string) (int64, error) {
	var st syscall.Statfs_t
	for p := filepath.Clean(path); ; {
		err := syscall.Statfs(p, &st)
		if err == nil {
			if st.Blocks == 0 {
				return unknownFree, nil
			}
			return int64(st.Bavail) * int64(st.Bsize), nil //nolint:gosec // block counts fit in int64
		}
		parent := filepath.Dir(p)
		if !errors.Is(err, syscall.ENOENT) || parent == p {
			return 0, err
		}
		p = parent
	}
}
