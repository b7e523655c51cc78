// Package malloctune keeps the C allocator from handing memory back to
// the system after every large free, for processes that receive large
// ZeroMQ messages.
//
// libzmq allocates every message larger than 8 KiB with malloc on its I/O
// thread, and the receiver frees it on its own thread. With glibc's
// defaults each such free of a frame (~75 KB for 100 events of 500 B) can
// find more than the trim threshold free at the top of the I/O thread's
// arena and give it back (madvise, with a TLB flush on every core), and
// the next message then page-faults its way into fresh memory. In the
// example processor that was a third of its CPU (docs/performance.md).
// Tune raises the thresholds so that the freed memory stays in the arena
// for the next messages.
package malloctune

import (
	"os"
	"sync/atomic"
)

// Thresholds set by Tune: memory freed at the top of an arena is given
// back to the system only beyond TrimThreshold, and allocations of
// MmapThreshold or more are mapped on their own. Both bound what the
// process keeps: at most TrimThreshold of free memory per arena, which
// only a burst of messages larger than the steady flow leaves.
const (
	TrimThreshold = 32 << 20
	MmapThreshold = 16 << 20
)

// Tune sets glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD to
// MmapThreshold and TrimThreshold, unless $GLIBC_TUNABLES is set (the
// operator's choice then stands). It reports whether it changed them:
// false as well without glibc or cgo.
func Tune() bool {
	if os.Getenv("GLIBC_TUNABLES") != "" {
		return false
	}
	if !tune(TrimThreshold, MmapThreshold) {
		return false
	}
	tuned.Store(true)
	return true
}

// tuned records that Tune changed the thresholds in this process.
var tuned atomic.Bool
