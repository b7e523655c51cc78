package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// sample is one acked frame: its fetch-to-ack latency and its event count.
type sample struct {
	latency time.Duration
	events  int
}

// recorder collects the daemon's OnAck calls. OnAck runs on the daemon's
// sender goroutine, so it only appends and counts.
type recorder struct {
	target int64 // events to ack before the run is done

	mu      sync.Mutex
	samples []sample

	acked     atomic.Int64
	reached   chan struct{} // closed once target events are acked
	reachOnce sync.Once
	// reachedAt and reachedAcked (the events acked then, at least target)
	// are written before reached is closed.
	reachedAt    time.Time
	reachedAcked int64

	// The backlog: events fetched before backlogBefore (unix ns; 0 = no
	// backlog being measured), backlogSize of them queued at that time.
	backlogBefore atomic.Int64
	backlogSize   atomic.Int64
	backlogAcked  atomic.Int64
	drained       chan struct{} // closed once backlogSize backlog events are acked
	drainOnce     sync.Once
	drainedAt     time.Time // written before drained is closed
}

func newRecorder(target int64) *recorder {
	return &recorder{target: target, reached: make(chan struct{}), drained: make(chan struct{})}
}

// watchBacklog starts counting acked events fetched before now towards a
// backlog of size events.
func (r *recorder) watchBacklog(now time.Time, size int64) {
	r.backlogSize.Store(size)
	r.backlogBefore.Store(now.UnixNano())
	if size <= 0 {
		r.drainOnce.Do(func() { r.drainedAt = now; close(r.drained) })
	}
}

// onAck is the daemon's OnAck. Latency samples stop once the target is
// reached: later acks belong to the shutdown.
func (r *recorder) onAck(fetchedAt time.Time, events int) {
	now := time.Now()
	if !isClosed(r.reached) {
		r.mu.Lock()
		r.samples = append(r.samples, sample{now.Sub(fetchedAt), events})
		r.mu.Unlock()
	}
	if n := r.acked.Add(int64(events)); n >= r.target {
		r.reachOnce.Do(func() { r.reachedAt, r.reachedAcked = now, n; close(r.reached) })
	}
	if before := r.backlogBefore.Load(); before != 0 && fetchedAt.UnixNano() < before {
		if r.backlogAcked.Add(int64(events)) >= r.backlogSize.Load() {
			r.drainOnce.Do(func() { r.drainedAt = now; close(r.drained) })
		}
	}
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// latencies returns the weighted percentiles p (0 to 100) of the recorded
// latencies: each frame counts once per event it carried. It returns zeros
// when nothing was recorded.
func (r *recorder) latencies(ps ...float64) []time.Duration {
	r.mu.Lock()
	s := slices.Clone(r.samples)
	r.mu.Unlock()
	return weightedPercentiles(s, ps...)
}

func weightedPercentiles(s []sample, ps ...float64) []time.Duration {
	out := make([]time.Duration, len(ps))
	var total int64
	for _, x := range s {
		total += int64(x.events)
	}
	if total == 0 {
		return out
	}
	slices.SortFunc(s, func(a, b sample) int { return cmp.Compare(a.latency, b.latency) })
	for i, p := range ps {
		// rank is the 1-based position of the percentile among all events.
		rank := max(int64(p/100*float64(total)+0.5), 1)
		var seen int64
		for _, x := range s {
			if seen += int64(x.events); seen >= rank {
				out[i] = x.latency
				break
			}
		}
	}
	return out
}

// usage is the process's CPU time so far and its peak RSS, with the bytes
// its Go heap allocated and its collector's cycles so far.
type usage struct {
	user, sys time.Duration
	maxRSSKiB int64
	allocated uint64
	gcCycles  uint64
}

// heapSamples are the runtime metrics usage reads.
var heapSamples = []string{"/gc/heap/allocs:bytes", "/gc/cycles/total:gc-cycles"}

func getUsage() (usage, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return usage{}, fmt.Errorf("getrusage: %w", err)
	}
	ms := make([]metrics.Sample, len(heapSamples))
	for i, name := range heapSamples {
		ms[i].Name = name
	}
	metrics.Read(ms)
	return usage{
		user:      time.Duration(ru.Utime.Nano()),
		sys:       time.Duration(ru.Stime.Nano()),
		maxRSSKiB: int64(ru.Maxrss), // KiB on Linux
		allocated: ms[0].Value.Uint64(),
		gcCycles:  ms[1].Value.Uint64(),
	}, nil
}

// currentRSSMiB returns the process's resident set size now, from
// /proc/self/status (Linux), or -1 when it cannot be read.
func currentRSSMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			kib, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte(" kB"))), 10, 64)
			if err != nil {
				return -1
			}
			return float64(kib) / 1024
		}
	}
	return -1
}

// stallLimit is how long a wait may go without progress before the bench
// gives up.
const stallLimit = 30 * time.Second

// errCapped reports that the -duration cap ended a wait.
var errCapped = errors.New("duration cap reached")

// watchdog runs the bench's waits.
type watchdog struct {
	// ctx ends the run (a signal); capCtx ends it early but successfully
	// (-duration).
	ctx, capCtx context.Context
	// stall is how long a wait may go without progress.
	stall time.Duration
	// state describes the pipeline for the stall error.
	state func() string
}

// wait polls until done reports true. It fails when progress has not
// changed for w.stall, and returns errCapped when w.capCtx ends first.
func (w *watchdog) wait(what string, done func() bool, progress func() int64) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	last, lastAt := progress(), time.Now()
	for !done() {
		select {
		case <-w.ctx.Done():
			return fmt.Errorf("%s: %w", what, context.Cause(w.ctx))
		case <-w.capCtx.Done():
			return errCapped
		case now := <-t.C:
			if p := progress(); p != last {
				last, lastAt = p, now
			} else if now.Sub(lastAt) >= w.stall {
				return fmt.Errorf("no progress for %v while %s (%s): the pipeline is stuck; rerun with -v to see the daemon's logs",
					w.stall, what, w.state())
			}
		}
	}
	return nil
}
