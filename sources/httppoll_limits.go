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
			return waited, &WaitError{Until: now.Add(d), Err: fmt.Errorf("%s: rate limit", p.where), Reason: WaitRateLimit}
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

// rateLimitReset returns when the rate-limit budget resets, if the
// headers say that none is left. It reads X-RateLimit-Remaining and
// X-RateLimit-Reset, RateLimit-Remaining and RateLimit-Reset, and the IETF
// draft's structured RateLimit field, both as `"policy";r=0;t=30` and as
// the older `limit=10, remaining=0, reset=30`. A reset is unix seconds (a
// value above 1e9) or seconds from now.
func rateLimitReset(h http.Header, now time.Time) (time.Time, bool) {
	for _, prefix := range []string{"X-RateLimit-", "RateLimit-"} {
		if until, ok := resetAt(h.Get(prefix+"Remaining"), h.Get(prefix+"Reset"), now); ok {
			return until, true
		}
	}
	var until time.Time
	for _, v := range h.Values("RateLimit") {
		if t, ok := structuredReset(v, now); ok && t.After(until) {
			until = t
		}
	}
	return until, !until.IsZero()
}

// structuredReset reads a RateLimit field: comma-separated members with
// ";"-separated key=value parameters. Either one member names a policy and
// carries r (remaining) and t (reset), or the members are themselves the
// older limit, remaining and reset. The latest reset of an exhausted
// policy wins.
func structuredReset(v string, now time.Time) (time.Time, bool) {
	var until time.Time
	var dictRemaining, dictReset string
	for _, member := range strings.Split(v, ",") {
		var r, t string
		for _, param := range strings.Split(member, ";") {
			key, val, ok := strings.Cut(strings.TrimSpace(param), "=")
			if !ok {
				continue
			}
			val = strings.Trim(strings.TrimSpace(val), `"`)
			switch strings.ToLower(strings.TrimSpace(key)) {
			case "r":
				r = val
			case "t":
				t = val
			case "remaining":
				dictRemaining = val
			case "reset":
				dictReset = val
			}
		}
		if at, ok := resetAt(r, t, now); ok && at.After(until) {
			until = at
		}
	}
	if at, ok := resetAt(dictRemaining, dictReset, now); ok && at.After(until) {
		until = at
	}
	return until, !until.IsZero()
}

// resetAt returns the reset time when remaining is 0 and reset is unix
// seconds (a value above 1e9) or seconds from now.
func resetAt(remaining, reset string, now time.Time) (time.Time, bool) {
	if n, err := strconv.ParseFloat(strings.TrimSpace(remaining), 64); err != nil || n > 0 {
		return time.Time{}, false
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(reset), 64)
	if err != nil || secs < 0 || math.IsInf(secs, 0) || math.IsNaN(secs) || secs > 1e11 {
		return time.Time{}, false
	}
	var until time.Time
	if secs > 1e9 {
		sec, frac := math.Modf(secs)
		until = time.Unix(int64(sec), int64(frac*1e9))
	} else {
		until = now.Add(time.Duration(secs * float64(time.Second)))
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
		p.notBefore, p.notBeforeWhy, p.notBeforeReason = until, "rate limit exhausted until "+until.UTC().Format(time.RFC3339), WaitRateLimit
		*notes = append(*notes, "rate limit remaining 0: next request in "+until.Sub(now).Round(time.Millisecond).String())
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
