package push

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestDrainEstimate drives the estimate with a queue that settles events
// at a chosen rate while senders are refused at another, and checks the
// advertised wait: (excess + refusals per second) / drain rate, bounded.
func TestDrainEstimate(t *testing.T) {
	for _, tc := range []struct {
		name            string
		drain, refusals float64 // per second
		excess          int64
		want            time.Duration
	}{
		{name: "slow drain, many senders", drain: 10, refusals: 50, excess: 1, want: 5100 * time.Millisecond},
		{name: "twice the drain, half the wait", drain: 20, refusals: 50, excess: 1, want: 2550 * time.Millisecond},
		{name: "excess counts", drain: 10, refusals: 0, excess: 30, want: 3 * time.Second},
		{name: "fast drain: at least a second", drain: 1000, refusals: 50, excess: 1, want: time.Second},
		{name: "nothing drains: the longest wait", drain: 0, refusals: 5, excess: 1, want: maxRetryAfter},
		{name: "a trickle: at most the longest wait", drain: 0.5, refusals: 100, excess: 1, want: maxRetryAfter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var settled atomic.Int64
			d := &drainEstimate{settled: settled.Load}
			start := time.Date(2026, 11, 24, 21, 0, 0, 0, time.UTC)
			// 20 s of history at 100 ms steps: the estimate samples every
			// 250 ms and keeps 10 s.
			var refusedAcc, settledAcc float64
			for step := range 200 {
				now := start.Add(time.Duration(step) * 100 * time.Millisecond)
				settledAcc += tc.drain / 10
				settled.Store(int64(settledAcc))
				refusedAcc += tc.refusals / 10
				for int64(refusedAcc) > d.refused.Load() {
					d.refused.Add(1)
				}
				d.sample(now)
			}
			now := start.Add(20 * time.Second)
			got := d.retryAfter(now, tc.excess)
			if diff := got - tc.want; diff < -tc.want/10 || diff > tc.want/10 {
				t.Errorf("retryAfter = %v, want %v (within 10%%)", got, tc.want)
			}
		})
	}
}

// TestDrainEstimateForgetsOldDrain checks that a drain older than the
// window does not count: a queue that drained fast, then stopped for
// longer than the window, advertises the longest wait.
func TestDrainEstimateForgetsOldDrain(t *testing.T) {
	var settled atomic.Int64
	d := &drainEstimate{settled: settled.Load}
	start := time.Date(2026, 11, 24, 21, 0, 0, 0, time.UTC)
	for step := range 100 {
		settled.Add(100)
		d.sample(start.Add(time.Duration(step) * 100 * time.Millisecond))
	}
	for step := range 150 {
		d.sample(start.Add(10*time.Second + time.Duration(step)*100*time.Millisecond))
	}
	if got := d.retryAfter(start.Add(25*time.Second), 1); got != maxRetryAfter {
		t.Errorf("after %v without a settled event: retryAfter = %v, want %v", 15*time.Second, got, maxRetryAfter)
	}
}

// TestDrainEstimateUnmeasured answers the shortest wait before anything
// was measured.
func TestDrainEstimateUnmeasured(t *testing.T) {
	var settled atomic.Int64
	d := &drainEstimate{settled: settled.Load}
	if got := d.retryAfter(time.Now(), 5); got != minRetryAfter {
		t.Errorf("retryAfter = %v, want %v", got, minRetryAfter)
	}
}

// TestBacklogEstimate: a saturated commit's Retry-After is the time to
// clear the commits waiting at the group commit's working rate (idle time
// does not lower it), and each refusal books its own place after those
// refused before it, so that a burst of refused senders is spread at the
// pace the commit takes them; past 10 s the wait is spread at random over
// 5 to 10 s.
func TestBacklogEstimate(t *testing.T) {
	var b backlogEstimate
	now := time.Now()
	if got := b.retryAfter(now, 4096); got != time.Second {
		t.Errorf("before any group: %v, want 1s", got)
	}
	b.observe(1000, 500*time.Millisecond) // 2,000 commits/s while working: one every 0.5 ms
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	if got, want := b.retryAfter(now, 4096), ms(2048.5); got != want { // 4096 / 2000 s, then its own place
		t.Errorf("4096 waiting: %v, want %v", got, want)
	}
	// The next sender refused at the same moment is booked after it.
	if got, want := b.retryAfter(now, 4096), ms(2049); got != want {
		t.Errorf("the next refusal: %v, want %v", got, want)
	}
	// Later, with nothing booked ahead any more, only the waiting count.
	later := now.Add(5 * time.Second)
	if got, want := b.retryAfter(later, 0), 100*time.Millisecond; got != want {
		t.Errorf("0 waiting: %v, want the floor %v", got, want)
	}
	for i := range 20_000 {
		got := b.retryAfter(later, 1000)
		switch want := ms(500 + 0.5*float64(i+1)); {
		case want <= 10*time.Second && got != want:
			t.Fatalf("refusal %d of a burst: %v, want %v", i, got, want)
		case want > 10*time.Second && (got < 5*time.Second || got > 10*time.Second):
			t.Fatalf("refusal %d of a burst, past the bound: %v, want 5s to 10s", i, got)
		}
	}
	// A slower group lowers the rate by a fifth of the difference.
	b.observe(100, time.Second) // 0.8*2000 + 0.2*100 = 1620/s
	if got, want := b.retryAfter(later.Add(time.Minute), 3240), 2*time.Second+time.Second/1620; got != want {
		t.Errorf("after a slow group: %v, want %v", got, want)
	}
}
