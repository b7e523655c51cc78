package sources

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"
)

// Rate is a request rate such as "10/s", "300/m" or "1/500ms".
type Rate struct {
	// Limit is the rate in events per second.
	Limit rate.Limit
	// Text is the rate as written.
	Text string
}

// ParseRate parses N/UNIT where UNIT is s, m, h or a Go duration ("500ms").
func ParseRate(s string) (Rate, error) {
	n, per, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: want N/UNIT such as \"10/s\", \"300/m\" or \"1/500ms\"", s)
	}
	count, err := strconv.ParseFloat(strings.TrimSpace(n), 64)
	if err != nil || count <= 0 {
		return Rate{}, fmt.Errorf("rate %q: %q is not a positive number", s, n)
	}
	var d time.Duration
	switch per = strings.TrimSpace(per); per {
	case "s":
		d = time.Second
	case "m":
		d = time.Minute
	case "h":
		d = time.Hour
	default:
		if d, err = time.ParseDuration(per); err != nil || d <= 0 {
			return Rate{}, fmt.Errorf("rate %q: %q is not s, m, h or a positive duration", s, per)
		}
	}
	return Rate{Limit: rate.Limit(count / d.Seconds()), Text: s}, nil
}

// RateLimiters are the named limiters that several sources hitting one API
// share.
type RateLimiters struct {
	m map[string]*rate.Limiter
}

// NewRateLimiters builds empty named limiters.
func NewRateLimiters() *RateLimiters { return &RateLimiters{m: make(map[string]*rate.Limiter)} }

// Add defines the limiter name.
func (l *RateLimiters) Add(name string, r Rate, burst int) {
	l.m[name] = rate.NewLimiter(r.Limit, max(burst, 1))
}

// Get returns the limiter name, or nil.
func (l *RateLimiters) Get(name string) *rate.Limiter {
	if l == nil {
		return nil
	}
	return l.m[name]
}

// Share makes name's limiter the one of that name in from, so that the
// sources naming it keep one bucket across a reload of the config.
func (l *RateLimiters) Share(name string, from *RateLimiters) {
	l.m[name] = from.Get(name)
}
