package push

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// drainEstimate turns what the queue is doing into the Retry-After of a
// sender refused because the queue is full: the time for the processors'
// acks to make room for the events above the limit and for every request
// refused lately (each will come back), at the drain rate measured over
// the last drainWindow:
//
//	wait = (pending - max_pending_events + 1 + refused in the last second) / drain rate
//
// bounded to [minRetryAfter, maxRetryAfter]; maxRetryAfter when nothing
// drains. Telling every refused sender "1 second" while the queue drains
// 10 events a second and 500 senders wait would only bring them back to be
// refused again; spreading them over the time the drain needs lets each
// one in at its retry.
type drainEstimate struct {
	// settled returns the queue's settled events so far, and refused
	// counts the requests refused because the queue was full.
	settled func() int64
	refused atomic.Int64
	// last is the time of the newest sample, in Unix nanoseconds.
	last atomic.Int64
	mu   sync.Mutex
	// samples holds (time, settled events, refused requests) once per
	// sampleEvery, the oldest first, over drainWindow.
	samples []drainSample
}

type drainSample struct {
	at      time.Time
	settled int64
	refused int64
}

const (
	// sampleEvery is how often the estimate samples the queue.
	sampleEvery = 250 * time.Millisecond
	// drainWindow is how far back the drain rate is measured.
	drainWindow = 10 * time.Second
	// minRetryAfter and maxRetryAfter bound the Retry-After of a full
	// queue.
	minRetryAfter = time.Second
	maxRetryAfter = time.Minute
)

// sample records the queue's settled count and the refusals so far at now,
// at most once per sampleEvery, and forgets the samples older than
// drainWindow. The inbox calls it on every commit, so the cost of a call
// that does not sample is one atomic load.
func (d *drainEstimate) sample(now time.Time) {
	if last := d.last.Load(); last != 0 && now.UnixNano()-last < int64(sampleEvery) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := len(d.samples); n > 0 && now.Sub(d.samples[n-1].at) < sampleEvery {
		return
	}
	d.samples = append(d.samples, drainSample{at: now, settled: d.settled(), refused: d.refused.Load()})
	d.last.Store(now.UnixNano())
	i := 0
	for i < len(d.samples)-1 && now.Sub(d.samples[i].at) > drainWindow {
		i++
	}
	d.samples = d.samples[i:]
}

// retryAfter counts a refusal at now, with excess events above the limit
// (at least 1: the one refused), and returns its wait.
func (d *drainEstimate) retryAfter(now time.Time, excess int64) time.Duration {
	refused := d.refused.Add(1)
	d.sample(now)
	settled := d.settled()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.samples) == 0 {
		return minRetryAfter
	}
	first := d.samples[0]
	span := now.Sub(first.at)
	if span < sampleEvery {
		return minRetryAfter // not measured yet
	}
	rate := float64(settled-first.settled) / span.Seconds()
	if rate <= 0 {
		return maxRetryAfter
	}
	// Refusals in the last second or so: since the newest sample at least
	// a second old (or the oldest), per second.
	base := first
	for i := len(d.samples) - 1; i >= 0; i-- {
		if now.Sub(d.samples[i].at) >= time.Second {
			base = d.samples[i]
			break
		}
	}
	var lately float64
	if age := now.Sub(base.at); age > 0 {
		lately = float64(refused-base.refused) / max(age.Seconds(), 1)
	}
	wait := time.Duration(math.Ceil((float64(max(excess, 1)) + lately) / rate * float64(time.Second)))
	return min(max(wait, minRetryAfter), maxRetryAfter)
}

// backlogEstimate turns the group commit's backlog into the Retry-After
// of a sender refused because the commit is saturated (or pushed out of
// the waiting line by a source below its fair share), and spreads the
// refused senders over the time the group commit needs for them: each
// refusal books the next place after the commits waiting and after every
// sender refused before it that is not yet due back, at the rate the group
// commit takes commits while it works,
//
//	due  = max(now + waiting / rate, last due) + 1 / rate
//	wait = due - now
//
// within [minBusyRetryAfter, maxBusyRetryAfter]; a wait the bound cuts
// short is spread at random over the bound's second half, and while the
// rate is not measured yet the wait is minRetryAfter. The rate is a
// moving average of each group's size over its duration, so idle time
// does not lower it: a burst after a quiet hour is told how long the
// burst takes, not an hour's average. A device is told its wait to the
// millisecond (a webhook's Retry-After rounds it up to whole seconds).
// Before, every sender refused was told the time to clear the commits
// waiting, rounded up to a second: 1,000 devices with 64 envelopes each
// in flight came back together every second, most to be refused again,
// and refusing took the CPU the commits needed (ingestor-bench -mode
// overload: a tenth of the unloaded goodput).
type backlogEstimate struct {
	mu sync.Mutex
	// rate is commits per second of group-commit work; 0 until measured.
	rate float64
	// due is the last place booked.
	due time.Time
}

const (
	// minBusyRetryAfter and maxBusyRetryAfter bound the Retry-After of a
	// saturated commit: the backlog is gone within seconds, so a longer
	// wait would only idle senders.
	minBusyRetryAfter = 100 * time.Millisecond
	maxBusyRetryAfter = 10 * time.Second
)

// observe records a group of commits that took d.
func (b *backlogEstimate) observe(commits int, d time.Duration) {
	if commits <= 0 || d <= 0 {
		return
	}
	r := float64(commits) / d.Seconds()
	b.mu.Lock()
	if b.rate == 0 {
		b.rate = r
	} else {
		b.rate = 0.8*b.rate + 0.2*r
	}
	b.mu.Unlock()
}

// retryAfter books a place for a sender refused at now with waiting
// commits ahead and returns its wait.
func (b *backlogEstimate) retryAfter(now time.Time, waiting int) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rate <= 0 {
		return minRetryAfter // not measured yet
	}
	per := time.Duration(float64(time.Second) / b.rate)
	due := now.Add(time.Duration(float64(waiting) / b.rate * float64(time.Second)))
	if b.due.After(due) {
		due = b.due
	}
	due = due.Add(per)
	if wait := due.Sub(now); wait <= maxBusyRetryAfter {
		b.due = due
		return max(wait, minBusyRetryAfter)
	}
	b.due = now.Add(maxBusyRetryAfter)
	return maxBusyRetryAfter/2 + rand.N(maxBusyRetryAfter/2)
}
