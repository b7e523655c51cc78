package malloctune

import (
	"syscall"
	"testing"
)

// faults returns the page faults (minor) the process took so far.
func faults(t *testing.T) int64 {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}

// TestThresholdsStopTheChurn allocates and frees bursts of ZeroMQ-sized buffers (a
// frame of 75 KB, one of 300 KB), sixteen at a time, 50 times: with glibc's
// defaults every one faults its pages in again (the 300 KB one is mmapped
// and unmapped, the 75 KB one trimmed), after Apply almost none does.
func TestThresholdsStopTheChurn(t *testing.T) {
	const n = 50
	measure := func() int64 {
		before := faults(t)
		churn(n, 300<<10)
		churn(n, 75<<10)
		return faults(t) - before
	}
	untuned := measure()
	if r := apply(""); !r.Applied {
		t.Fatalf("Apply: %+v", r)
	}
	churn(1, 300<<10) // the first use of the heap faults it in once
	tuned := measure()
	t.Logf("page faults for %d bursts of 16 x (300 KB + 75 KB) buffers: %d with glibc's defaults, %d tuned", n, untuned, tuned)
	if untuned < n*50 {
		t.Fatalf("only %d page faults with glibc's defaults: the churn this package prevents did not happen", untuned)
	}
	if tuned > untuned/20 {
		t.Errorf("%d page faults tuned (%d untuned): the thresholds do not hold", tuned, untuned)
	}
}

func TestOperatorTunablesWin(t *testing.T) {
	for _, env := range []string{"glibc.malloc.trim_threshold=131072", "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536"} {
		if r := apply(env); r.Applied || r.Reason == "" {
			t.Errorf("GLIBC_TUNABLES=%s: %+v, want the operator's setting kept", env, r)
		}
	}
}
