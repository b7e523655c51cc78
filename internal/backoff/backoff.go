// Package backoff computes capped exponential backoff with full jitter, the
// one retry schedule used everywhere in the daemon: actor restarts, failed
// polls, raw-store retries and redelivery.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy is a capped exponential backoff with full jitter: the n-th wait
// (n from 0) is uniform in [0, min(Max, Base*2^n)].
type Policy struct {
	// Base is the ceiling of the first wait.
	Base time.Duration
	// Max caps every wait.
	Max time.Duration
}

// Ceiling returns the upper bound of the n-th wait, before jitter.
func (p Policy) Ceiling(n int) time.Duration {
	if p.Base <= 0 {
		return 0
	}
	d := p.Base
	for i := 0; i < n && d < p.Max; i++ {
		d *= 2
	}
	if p.Max > 0 && d > p.Max {
		d = p.Max
	}
	return d
}

// Delay returns the n-th wait: uniform in [0, Ceiling(n)].
func (p Policy) Delay(n int) time.Duration {
	c := p.Ceiling(n)
	if c <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(c) + 1))
}

// Jitter returns d spread uniformly by +/- frac (0.1 = 10%).
func Jitter(d time.Duration, frac float64) time.Duration {
	if frac <= 0 || d <= 0 {
		return d
	}
	spread := float64(d) * frac
	return time.Duration(float64(d) - spread + rand.Float64()*2*spread)
}

// Sleep waits d, or less when ctx ends; it reports whether ctx is still
// live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
