package config

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ingestorhq/ingestor/sources"
)

// sourceTOML holds the keys every [source.NAME] block takes besides those
// of its kind.
type sourceTOML struct {
	Kind             string   `toml:"kind"`
	Enabled          bool     `toml:"enabled"`
	Interval         duration `toml:"interval"`
	Jitter           percent  `toml:"jitter"`
	Timeout          duration `toml:"timeout"`
	InflightBatches  int      `toml:"inflight_batches"`
	MalformedRetries int      `toml:"malformed_retries"`
	StartJitter      duration `toml:"start_jitter"`
}

// sourceKeysDefaults is the common keys of a [source.NAME] block with their
// own defaults (the others inherit [defaults]).
func sourceKeysDefaults() sourceTOML { return sourceTOML{Enabled: true} }

// sourceName matches a valid NAME in [source.NAME].
var sourceName = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// sources decodes every [source.NAME] block, sorted by name.
func (d *decoder) sources(def sourceDefaults) []Source {
	blocks := d.blocks["source"]
	out := make([]Source, 0, len(blocks))
	for _, name := range slices.Sorted(maps.Keys(blocks)) {
		out = append(out, d.source(name, blocks[name], def))
	}
	return out
}

// source decodes one [source.NAME] block: the common keys, inheriting
// [defaults] for those it does not set, and the keys of its kind into the
// kind's Spec, which then validates itself.
func (d *decoder) source(name string, prim toml.Primitive, def sourceDefaults) Source {
	path := []string{"source", name}
	src := Source{Name: name, Line: d.line(path), Enabled: true}
	if !sourceName.MatchString(name) {
		// Not errAt: that would mark the whole block as already reported.
		d.errs = append(d.errs, d.newError(path, "invalid source name: use only letters, digits, '_' and '-'"))
	}
	m, ok := d.table(prim, path)
	if !ok {
		return src
	}

	// The kind decides which other keys exist, so it is read first; a kind
	// of the wrong type is reported by decodeKeys below.
	var kind string
	if p, ok := m["kind"]; ok {
		if err := d.docOf(path).md.PrimitiveDecode(p, &kind); err != nil {
			kind = ""
		}
	}
	spec, known := sources.NewSpec(kind)
	t := sourceKeysDefaults()
	targets := []any{&t}
	if known {
		targets = append(targets, spec)
	}
	// Without a known kind, the kind's keys cannot be told from typos, so
	// unknown keys are only reported for a known kind.
	present := d.decodeKeys(m, path, known, targets...)
	kindPath := child(path, "kind")
	switch {
	case !present["kind"]:
		d.errAt(kindPath, "is required (one of %s)", quoteList(sources.Kinds()))
	case !known:
		d.errAt(kindPath, "unknown kind %s (want one of %s)", d.show(kindPath, t.Kind), quoteList(sources.Kinds()))
	}
	// A disabled source may reference secrets that are not set.
	if t.Enabled {
		d.interpolate(path, present, targets...)
	}

	src.Kind, src.Enabled = t.Kind, t.Enabled
	src.Interval, src.Jitter, src.Timeout, src.InflightBatches = def.interval, def.jitter, def.timeout, def.inflightBatches
	src.MalformedRetries, src.StartJitter = def.malformedRetries, def.startJitter
	if present["start_jitter"] {
		src.StartJitter = d.durationOrOff(child(path, "start_jitter"), t.StartJitter, def.startJitter, time.Millisecond, 24*time.Hour)
	}
	if present["interval"] {
		src.Interval = d.duration(child(path, "interval"), t.Interval, def.interval)
	}
	if present["jitter"] {
		src.Jitter = d.percent(child(path, "jitter"), t.Jitter, def.jitter)
	}
	if present["timeout"] {
		src.Timeout = d.duration(child(path, "timeout"), t.Timeout, def.timeout)
	}
	if present["inflight_batches"] {
		src.InflightBatches = d.inflight(child(path, "inflight_batches"), t.InflightBatches, def.inflightBatches)
	}
	if present["malformed_retries"] {
		src.MalformedRetries = d.malformedRetries(child(path, "malformed_retries"), t.MalformedRetries, def.malformedRetries)
	}
	if known {
		// A key that already has an error (such as a value of the wrong
		// type) keeps that error rather than gaining a second one.
		for _, fe := range d.validateSpec(path, spec, targets) {
			d.errAt(child(path, strings.Split(fe.Key, ".")...), "%s", fe.Msg)
		}
		src.Spec = spec
	}
	return src
}

// Source returns the [source.NAME] block, enabled or not, or an error that
// lists the names there are.
func (c *Config) Source(name string) (Source, error) {
	names := make([]string, 0, len(c.Sources))
	for _, s := range c.Sources {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	if len(names) == 0 {
		return Source{}, fmt.Errorf("no source %q: the config has no [source.NAME] block", name)
	}
	return Source{}, fmt.Errorf("no source %q (the config has %s)", name, strings.Join(names, ", "))
}
