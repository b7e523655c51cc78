package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"unicode"

	"github.com/ingestorhq/ingestor/sources"
)

// Plan is what reloading a config changes in a running daemon: which
// enabled sources start, stop, restart or stay as they are. Each list is
// sorted.
type Plan struct {
	// Start are sources enabled in the new config that were not running:
	// added, or enabled by the edit.
	Start []string `json:"start"`
	// Stop are running sources the new config removes or disables: they
	// drain (what they fetched commits; their queued events stay and are
	// delivered) and stop.
	Stop []string `json:"stop"`
	// Restart are running sources whose effective settings changed (their
	// block, the [defaults] they inherit, or the [rate_limiters] entry they
	// name): they drain and start again from their durable cursor.
	Restart []string `json:"restart"`
	// Stay are running sources the edit does not affect: they keep their
	// actor and schedule.
	Stay []string `json:"stay"`
}

// Changes reports whether p starts, stops or restarts anything.
func (p Plan) Changes() bool { return len(p.Start)+len(p.Stop)+len(p.Restart) > 0 }

// String is a one-line summary such as "start [a] stop [] restart [b] stay [c d]".
func (p Plan) String() string {
	return fmt.Sprintf("start %v stop %v restart %v stay %v", p.Start, p.Stop, p.Restart, p.Stay)
}

// LoadChange loads the config at paths (files or directories, as
// LoadPaths reads them: a reload passes the running config's Paths, so
// that a file added to a directory is read too), and compares it with
// old, the running config: it returns the new config and what reloading
// it changes. Only [source.*], [defaults] and [rate_limiters] can change
// while the daemon runs; any other difference is returned as Errors, one
// per key, with its file and line, and then nothing is to be applied.
// Adding the first enabled push source is refused too: the push listener
// opens only at start-up.
func LoadChange(old *Config, paths []string) (*Config, Plan, error) {
	files, err := ReadPaths(paths)
	if err != nil {
		return nil, Plan{}, err
	}
	next, d, err := parse(files, Options{})
	if err != nil {
		return nil, Plan{}, err
	}
	next.Paths = slices.Clone(paths)
	plan, err := diff(old, next, d)
	if err != nil {
		return nil, Plan{}, err
	}
	return next, plan, nil
}

// diff compares old with next, which d decoded.
func diff(old, next *Config, d *decoder) (Plan, error) {
	var errs Errors
	fixed := func(section string, a, b any) {
		for _, key := range changedKeys(a, b) {
			path := []string{section, key}
			o := d.docOf(path)
			msg := "changed"
			if _, written := o.lines[pathKey(path)]; !written {
				msg = "changed (its default follows a setting changed here)"
			}
			errs = append(errs, &Error{File: o.file, Line: o.lines.lookup(path), Key: section + "." + key,
				Msg: msg + ", but it cannot change while the daemon runs; restart the daemon to apply it (nothing of this edit was applied)"})
		}
	}
	fixed("daemon", old.Daemon, next.Daemon)
	fixed("raw_store", old.RawStore, next.RawStore)
	fixed("publish", old.Publish, next.Publish)
	fixed("push", old.Push, next.Push)
	fixed("cluster", old.Cluster, next.Cluster)
	if !PushEnabled(old.Sources) && PushEnabled(next.Sources) {
		for _, s := range next.Sources {
			if _, ok := s.Spec.(sources.PushSpec); ok && s.Enabled {
				errs = append(errs, &Error{File: d.docOf([]string{"source", s.Name}).file, Line: s.Line, Source: s.Name,
					Msg: "the first enabled push source needs the push listener (push.addr), which opens only at start-up; restart the daemon to add it (nothing of this edit was applied)"})
			}
		}
	}
	if len(errs) > 0 {
		return Plan{}, errs
	}

	var p Plan
	running := func(c *Config, name string) (Source, bool) {
		i := slices.IndexFunc(c.Sources, func(s Source) bool { return s.Name == name })
		if i < 0 || !c.Sources[i].Enabled {
			return Source{}, false
		}
		return c.Sources[i], true
	}
	for _, s := range old.Sources {
		if !s.Enabled {
			continue
		}
		n, ok := running(next, s.Name)
		switch {
		case !ok:
			p.Stop = append(p.Stop, s.Name)
		case !sameSource(s, n) || !reflect.DeepEqual(old.limiterOf(s), next.limiterOf(n)):
			p.Restart = append(p.Restart, s.Name)
		default:
			p.Stay = append(p.Stay, s.Name)
		}
	}
	for _, s := range next.Sources {
		if _, ok := running(old, s.Name); s.Enabled && !ok {
			p.Start = append(p.Start, s.Name)
		}
	}
	return p, nil
}

// sameSource reports whether a and b have the same effective settings;
// where the block sits in the file does not count.
func sameSource(a, b Source) bool {
	a.Line, b.Line = 0, 0
	return reflect.DeepEqual(a, b)
}

// limiterOf returns the definition of the shared limiter s names, without
// its line, or nil.
func (c *Config) limiterOf(s Source) *RateLimiter {
	u, ok := s.Spec.(limiterUser)
	if !ok || u.LimiterName() == "" {
		return nil
	}
	for _, l := range c.RateLimiters {
		if l.Name == u.LimiterName() {
			l.Line = 0
			return &l
		}
	}
	return nil
}

// changedKeys returns the config keys (snake_case field names) whose values
// differ between the structs a and b, of one type.
func changedKeys(a, b any) []string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var keys []string
	for i := range va.NumField() {
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			keys = append(keys, snakeCase(va.Type().Field(i).Name))
		}
	}
	return keys
}

// snakeCase turns a Go field name into its config key: HTTPAddr becomes
// http_addr, CurveSecretKeyFile curve_secret_key_file.
func snakeCase(name string) string {
	var b strings.Builder
	r := []rune(name)
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 && (unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}
