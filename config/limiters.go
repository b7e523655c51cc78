package config

import (
	"maps"
	"slices"
	"strings"

	"github.com/ingestorhq/ingestor/sources"
)

// RateLimiter is a named token bucket shared by the sources that name it
// in rate_limiter ([rate_limiters.NAME]).
type RateLimiter struct {
	Name  string
	Rate  sources.Rate
	Burst int
	Line  int
}

// rateLimiterTOML is one [rate_limiters.NAME] block as written.
type rateLimiterTOML struct {
	Rate  string `toml:"rate"`
	Burst int    `toml:"burst"`
}

// rateLimiterDefaults is a [rate_limiters.NAME] block with its defaults.
func rateLimiterDefaults() rateLimiterTOML { return rateLimiterTOML{Burst: 1} }

// limiterUser is implemented by specs that may name a shared limiter.
type limiterUser interface{ LimiterName() string }

// rateLimiters decodes every [rate_limiters.NAME] block, sorted by name.
func (d *decoder) rateLimiters() []RateLimiter {
	blocks := d.blocks["rate_limiters"]
	var out []RateLimiter
	for _, name := range slices.Sorted(maps.Keys(blocks)) {
		path := []string{"rate_limiters", name}
		m, ok := d.table(blocks[name], path)
		if !ok {
			continue
		}
		t := rateLimiterDefaults()
		present := d.decodeKeys(m, path, true, &t)
		l := RateLimiter{Name: name, Burst: t.Burst, Line: d.line(path)}
		if !sourceName.MatchString(name) {
			d.errs = append(d.errs, d.newError(path, "invalid rate limiter name: use only letters, digits, '_' and '-'"))
		}
		switch r, err := sources.ParseRate(t.Rate); {
		case !present["rate"]:
			d.errAt(child(path, "rate"), "is required, e.g. \"10/s\"")
		case err != nil:
			d.errAt(child(path, "rate"), "%s", strings.TrimPrefix(err.Error(), "rate "))
		default:
			l.Rate = r
		}
		if t.Burst < 1 {
			d.errAt(child(path, "burst"), "must be at least 1")
		}
		out = append(out, l)
	}
	return out
}

// checkLimiterNames reports enabled sources naming a limiter that is not
// defined.
func (d *decoder) checkLimiterNames(srcs []Source, limiters []RateLimiter) {
	for _, s := range srcs {
		u, ok := s.Spec.(limiterUser)
		if !ok || u.LimiterName() == "" || !s.Enabled {
			continue
		}
		if !slices.ContainsFunc(limiters, func(l RateLimiter) bool { return l.Name == u.LimiterName() }) {
			d.errAt([]string{"source", s.Name, "rate_limiter"}, "no [rate_limiters.%s] block defines %q", u.LimiterName(), u.LimiterName())
		}
	}
}

// Limiters builds the shared rate limiters the config defines, as sources
// expect them in sources.Env; nil when there are none.
func (c *Config) Limiters() *sources.RateLimiters {
	if len(c.RateLimiters) == 0 {
		return nil
	}
	l := sources.NewRateLimiters()
	for _, rl := range c.RateLimiters {
		l.Add(rl.Name, rl.Rate, rl.Burst)
	}
	return l
}
