// Package malloctune keeps the C allocator from giving memory back to the
// system after every large free.
//
// libzmq allocates each message it sends or receives with malloc (a frame
// of 100 events of 500 B is ~75 KB) and frees it on another thread once
// the bytes are on the socket or handed over. With glibc's defaults, a
// free that leaves more than 128 KiB at the top of a heap trims it
// (madvise(MADV_DONTNEED) on the freed pages, which makes every other CPU
// running the process flush its TLB), and the next message faults the
// same pages in again; a message above the dynamic mmap threshold is
// mmapped and unmapped each time, with the same cost. Measured in the
// real-path bench (ingestor-bench -mode real), this churn was a third of
// the daemon's CPU and half of the processor's (docs/performance.md,
// "The C allocator").
//
// Apply raises glibc's trim threshold to TrimThreshold and its mmap
// threshold to MmapThreshold, so that freed message buffers are reused.
// The C heap then stays at the most it held (what ZeroMQ and SQLite
// needed at the peak: bounded by the in-flight window and SQLite's cache,
// see the memory formula) instead of shrinking after each message. An
// operator who sets either threshold in GLIBC_TUNABLES keeps it: Apply
// then changes nothing.
package malloctune

/*
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
static int ingestor_malloc_tune(int trim, int mmap_threshold) {
	return mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 && mallopt(M_TRIM_THRESHOLD, trim) == 1;
}
#else
static int ingestor_malloc_tune(int trim, int mmap_threshold) { return -1; }
#endif
// ingestor_malloc_churn allocates and writes 16 buffers of size bytes,
// then frees them, n times, as ZeroMQ does with a burst of messages.
static void ingestor_malloc_churn(int n, size_t size) {
	char *p[16];
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < 16; j++) {
			p[j] = malloc(size);
			if (p[j] != NULL) memset(p[j], i, size);
		}
		for (int j = 0; j < 16; j++) free(p[j]);
	}
}
*/
import "C"

import (
	"os"
	"strings"
	"sync"
)

const (
	// TrimThreshold is how much free memory may sit at the top of a heap
	// before glibc gives it back.
	TrimThreshold = 64 << 20
	// MmapThreshold is the size from which an allocation gets its own
	// mapping: glibc's largest (HEAP_MAX_SIZE/2 on 64-bit systems), so
	// that every ZeroMQ message comes from a heap.
	MmapThreshold = 32 << 20
)

// Result says what Apply did.
type Result struct {
	// Applied is true when the thresholds were set.
	Applied bool
	// Reason says why they were not.
	Reason string
}

var (
	once   sync.Once
	result Result
)

// Apply sets the thresholds once per process and returns what it did.
func Apply() Result {
	once.Do(func() { result = apply(os.Getenv("GLIBC_TUNABLES")) })
	return result
}

func apply(tunables string) Result {
	if strings.Contains(tunables, "malloc.trim_threshold") || strings.Contains(tunables, "malloc.mmap_threshold") {
		return Result{Reason: "GLIBC_TUNABLES sets a malloc threshold: kept"}
	}
	switch C.ingestor_malloc_tune(C.int(TrimThreshold), C.int(MmapThreshold)) {
	case 1:
		return Result{Applied: true}
	case -1:
		return Result{Reason: "not glibc"}
	default:
		return Result{Reason: "mallopt refused the thresholds"}
	}
}

// churn allocates and writes 16 buffers of size bytes in C, then frees
// them, n times, as ZeroMQ does with a burst of messages (for the test
// that checks the thresholds hold).
func churn(n, size int) { C.ingestor_malloc_churn(C.int(n), C.size_t(size)) }
