package sources

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// waitLimiters waits for every rate limiter to allow one request and
// returns how long it waited. A wait longer than half the time left before
// ctx's deadline would starve the request itself (a slow rate such as
// "1/m" under a 30s fetch timeout could never be met), so it is handed
// back as a *WaitError instead, and the reservation is kept for the next
// Fetch: the caller comes back when the slot is due and the request goes
// out without queueing again.
func (p *httpPoll) waitLimiters(ctx context.Context) (time.Duration, error) {
	var waited time.Duration
	for i, l := range p.limiters {
		r := p.held[i]
		if r == nil {
			r = l.Reserve()
			p.held[i] = r
		}
		now := time.Now()
		d := r.DelayFrom(now)
		if d <= 0 {
			continue
		}
		if deadline, ok := ctx.Deadline(); ok && d > deadline.Sub(now)/2 {
			return waited, &WaitError{Until: now.Add(d), Err: fmt.Errorf("%s: rate limit", p.where)}
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
			waited += d
		case <-ctx.Done():
			t.Stop()
			return waited, fmt.Errorf("%s: waiting for the rate limit: %w", p.where, ctx.Err())
		}
	}
	clear(p.held)
	return waited, nil
}

// retryAfter parses a Retry-After value, delta-seconds or an HTTP date,
// into the time to wait for. A value that is absent, malformed or not in
// the future yields false: the caller's backoff applies instead.
func retryAfter(v string, now time.Time) (time.Time, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, false
	}
	var until time.Time
	if secs, err := strconv.ParseUint(v, 10, 32); err == nil {
		until = now.Add(time.Duration(secs) * time.Second)
	} else if t, err := http.ParseTime(v); err == nil {
		until = t
	} else {
		return time.Time{}, false
	}
	return until, until.After(now)
}

// rateLimitReset returns when the X-RateLimit budget resets, if the
// headers say that none is left: X-RateLimit-Remaining is 0 and
// X-RateLimit-Reset is unix seconds (a value above 1e9) or seconds from
// now.
func rateLimitReset(h http.Header, now time.Time) (time.Time, bool) {
	rem := strings.TrimSpace(h.Get("X-RateLimit-Remaining"))
	if n, err := strconv.ParseFloat(rem, 64); err != nil || n > 0 {
		return time.Time{}, false
	}
	reset, err := strconv.ParseFloat(strings.TrimSpace(h.Get("X-RateLimit-Reset")), 64)
	if err != nil || reset < 0 || math.IsInf(reset, 0) || math.IsNaN(reset) || reset > 1e11 {
		return time.Time{}, false
	}
	var until time.Time
	if reset > 1e9 {
		sec, frac := math.Modf(reset)
		until = time.Unix(int64(sec), int64(frac*1e9))
	} else {
		until = now.Add(time.Duration(reset * float64(time.Second)))
	}
	return until, until.After(now)
}

// noteRateLimitHeaders makes the next Fetch wait for the rate limit reset
// when slow_on_ratelimit_headers is set and the budget is exhausted.
func (p *httpPoll) noteRateLimitHeaders(h http.Header, now time.Time, notes *[]string) {
	if !p.spec.SlowOnRateLimitHeaders {
		return
	}
	if until, ok := rateLimitReset(h, now); ok {
		p.notBefore, p.notBeforeWhy = until, "rate limit exhausted until "+until.UTC().Format(time.RFC3339)
		*notes = append(*notes, "X-RateLimit-Remaining 0: next request in "+until.Sub(now).Round(time.Millisecond).String())
	}
}

// secretParams are substrings of query parameter names whose values are
// never traced.
var secretParams = []string{"token", "key", "secret", "passw", "signature", "auth", "credential", "session"}

// traceURL returns u for a trace: without user info, with the values of
// secret-looking query parameters replaced by REDACTED.
func traceURL(u *url.URL) string {
	r := *u
	r.User, r.Fragment, r.RawFragment = nil, "", ""
	if r.RawQuery != "" {
		q := r.Query()
		for name, vals := range q {
			lower := strings.ToLower(name)
			for _, s := range secretParams {
				if strings.Contains(lower, s) {
					for i := range vals {
						vals[i] = "REDACTED"
					}
					break
				}
			}
		}
		r.RawQuery = q.Encode()
	}
	return r.String()
}
