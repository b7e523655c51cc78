package testupstream

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// RateHeaders is how a RateWindow announces its budget.
type RateHeaders int

const (
	// XRateLimit sends X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until the window ends).
	XRateLimit RateHeaders = iota
	// PlainRateLimit sends RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset, as the first IETF drafts named them.
	PlainRateLimit
	// DraftRateLimit sends the structured fields of the current IETF draft:
	// RateLimit-Policy: "default";q=LIMIT;w=WINDOW and
	// RateLimit: "default";r=REMAINING;t=RESET.
	DraftRateLimit
	// DictRateLimit sends one RateLimit: limit=L, remaining=R, reset=T,
	// as an older draft did.
	DictRateLimit
)

// RateWindow is a fixed rate-limit window: at most Limit requests per
// Window, counted from the server's start. Every response announces the
// requests left in the current window and the seconds until it ends
// (rounded up); a request that arrives in a window after its budget is
// spent is an overrun, answered 429 and counted (see Server.Overruns).
type RateWindow struct {
	Limit   int
	Window  time.Duration
	Headers RateHeaders
}

// windowState counts the requests of the current window.
type windowState struct {
	start    time.Time
	index    int64
	count    int
	overruns int
}

// limit counts a request that arrived at now against w, turning resp into
// a 429 for an overrun, and adds the rate-limit headers.
func (st *windowState) limit(w RateWindow, now time.Time, resp *response) {
	idx := int64(now.Sub(st.start) / w.Window)
	if idx != st.index {
		st.index, st.count = idx, 0
	}
	st.count++
	if st.count > w.Limit {
		st.overruns++
		*resp = response{status: http.StatusTooManyRequests, header: http.Header{"Content-Type": {"text/plain"}},
			body: []byte("rate limit window exhausted")}
	}
	remaining := max(w.Limit-st.count, 0)
	end := st.start.Add(time.Duration(idx+1) * w.Window)
	reset := strconv.Itoa(int(math.Ceil(end.Sub(now).Seconds())))
	limit, secs := strconv.Itoa(w.Limit), strconv.Itoa(int(math.Ceil(w.Window.Seconds())))
	h := resp.header
	switch w.Headers {
	case XRateLimit:
		h.Set("X-RateLimit-Limit", limit)
		h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
		h.Set("X-RateLimit-Reset", reset)
	case PlainRateLimit:
		h.Set("RateLimit-Limit", limit)
		h.Set("RateLimit-Remaining", strconv.Itoa(remaining))
		h.Set("RateLimit-Reset", reset)
	case DraftRateLimit:
		h.Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%s;w=%s`, limit, secs))
		h.Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%s`, remaining, reset))
	case DictRateLimit:
		h.Set("RateLimit", fmt.Sprintf("limit=%s, remaining=%d, reset=%s", limit, remaining, reset))
	}
}

// Overruns returns how many requests arrived in a RateWindow window after
// its budget was spent.
func (s *Server) Overruns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.window.overruns
}
