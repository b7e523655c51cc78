package config

import (
	_ "embed" // ExampleTOML
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
)

// ExampleTOML is ingestor.example.toml: every key, documented, with its
// default. It is valid, runs one demo source, and is what Default parses.
//
//go:embed ingestor.example.toml
var ExampleTOML string

// Load reads and parses the config file at path. ${NAME} references are
// resolved from the process environment.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	return ParseWithEnv(path, data, os.LookupEnv)
}

// Parse parses data, the contents of the config file named file (which
// errors and Config.File report), resolving ${NAME} from the process
// environment.
func Parse(file string, data []byte) (*Config, error) {
	return ParseWithEnv(file, data, os.LookupEnv)
}

// Default returns the configuration of ExampleTOML, with File empty. It
// panics if the embedded example is invalid, which a test rules out.
func Default() *Config {
	cfg, err := ParseWithEnv("ingestor.example.toml", []byte(ExampleTOML), func(string) (string, bool) { return "", false })
	if err != nil {
		panic("config: embedded example is invalid: " + err.Error())
	}
	cfg.File = ""
	return cfg
}

// ParseWithEnv is Parse with lookup (such as os.LookupEnv) resolving
// ${NAME}. It applies the defaults, decodes strictly, then validates, and
// returns every problem found as Errors, sorted by line.
//
// ${NAME} is expanded in string values of every table except disabled
// sources, so a secret need not be set for a source that is off; $${ stands
// for a literal ${.
func ParseWithEnv(file string, data []byte, lookup func(string) (string, bool)) (*Config, error) {
	d, top, err := newDecoder(file, data, lookup)
	if err != nil {
		return nil, err
	}
	cfg := &Config{File: file}
	for _, k := range slices.Sorted(maps.Keys(top)) {
		switch k {
		case "daemon", "raw_store", "publish", "push", "cluster", "telemetry", "defaults", "source", "rate_limiters":
		default:
			d.unknown([]string{k})
		}
	}
	cfg.Daemon = d.daemon(top)
	cfg.RawStore = d.rawStore(top, cfg.Daemon.DataDir)
	cfg.Publish = d.publish(top)
	cfg.Push = d.push(top)
	cfg.Cluster = d.cluster(top)
	cfg.Telemetry = d.telemetry(top)
	defaults := d.defaults(top)
	cfg.Sources = d.sources(top, defaults)
	cfg.RateLimiters = d.rateLimiters(top)
	d.checkLimiterNames(cfg.Sources, cfg.RateLimiters)
	d.checkPush(cfg.Push, cfg.Daemon, cfg.Sources)
	d.undecoded()

	if err := d.result(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// newDecoder parses data, the TOML text of file, into its top-level
// tables and a decoder for them that resolves ${NAME} with lookup (nil:
// the process environment). A syntax error is returned as Errors.
func newDecoder(file string, data []byte, lookup func(string) (string, bool)) (*decoder, map[string]toml.Primitive, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	var top map[string]toml.Primitive
	md, err := toml.Decode(string(data), &top)
	if err != nil {
		return nil, nil, syntaxError(file, err)
	}
	return &decoder{
		file:    file,
		md:      md,
		lines:   indexLines(string(data)),
		lookup:  lookup,
		flagged: map[string]bool{},
		raw:     map[string]string{},
	}, top, nil
}

// result returns every problem found, sorted by line, or nil.
func (d *decoder) result() error {
	if len(d.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(d.errs, func(a, b *Error) int { return a.Line - b.Line })
	return d.errs
}

// syntaxError turns a toml decode error into Errors with its line.
func syntaxError(file string, err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		line := pe.Position.Line
		if line == 0 {
			line = pe.Line
		}
		msg := pe.Message
		if pe.LastKey != "" {
			msg = fmt.Sprintf("%s (after key %s)", msg, pe.LastKey)
		}
		return Errors{{File: file, Line: line, Msg: "invalid TOML: " + msg}}
	}
	return Errors{{File: file, Msg: "invalid TOML: " + strings.TrimPrefix(err.Error(), "toml: ")}}
}

// section splits the top-level table name into its keys, decodes them into
// targets (which already hold the defaults) and expands ${ENV} in them. A
// missing table leaves the defaults untouched.
func (d *decoder) section(top map[string]toml.Primitive, name string, targets ...any) {
	prim, ok := top[name]
	if !ok {
		return
	}
	path := []string{name}
	m, ok := d.table(prim, path)
	if !ok {
		return
	}
	present := d.decodeKeys(m, path, true, targets...)
	d.interpolate(path, present, targets...)
}
