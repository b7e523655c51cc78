package config

import (
	"cmp"
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

// Load reads and parses the config file at path (or, for a directory,
// the *.toml files in it, as LoadPaths does). ${NAME} references are
// resolved from the process environment.
func Load(path string) (*Config, error) {
	return LoadPaths([]string{path}, Options{})
}

// Options say how a config is checked.
type Options struct {
	// Lookup resolves ${NAME}; nil is the process environment.
	Lookup func(string) (string, bool)
	// Offline checks only what needs nothing of the machine the daemon
	// runs on, as in a CI pipeline: a ${NAME} whose variable is not set is
	// left as written and unchecked (not an error), no file a key names
	// is read (CURVE keys, token and password files, certificates, CA
	// bundles, device tokens: only that a path is given where one is
	// required is checked), and, as always, no listener is bound. What was
	// left unchecked is in Config.Skipped. Every other mistake, an
	// unknown key, a value of the wrong type, a bad duration, a missing
	// required key, is reported as online.
	Offline bool
}

// LoadPaths reads the config at paths, files or directories in the order
// given (a directory stands for its *.toml files in lexical order, see
// ReadPaths), and parses them as one config with opts (ParseFiles).
func LoadPaths(paths []string, opts Options) (*Config, error) {
	files, err := ReadPaths(paths)
	if err != nil {
		return nil, err
	}
	cfg, err := ParseFiles(files, opts)
	if err != nil {
		return nil, err
	}
	cfg.Paths = slices.Clone(paths)
	return cfg, nil
}

// Parse parses data, the contents of the config file named file (which
// errors and Config.Files report), resolving ${NAME} from the process
// environment.
func Parse(file string, data []byte) (*Config, error) {
	return ParseWithEnv(file, data, os.LookupEnv)
}

// Default returns the configuration of ExampleTOML, with no Paths or
// Files. It panics if the embedded example is invalid, which a test
// rules out.
func Default() *Config {
	cfg, err := ParseWithEnv("ingestor.example.toml", []byte(ExampleTOML), func(string) (string, bool) { return "", false })
	if err != nil {
		panic("config: embedded example is invalid: " + err.Error())
	}
	cfg.Paths, cfg.Files = nil, nil
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
	cfg, err := ParseFiles([]File{{Name: file, Data: data}}, Options{Lookup: lookup})
	if err != nil {
		return nil, err
	}
	cfg.Paths = []string{file}
	return cfg, nil
}

// ParseFiles parses files as one config, as ParseWithEnv parses one file:
// every [source.NAME] and [rate_limiters.NAME] block may be in any of
// them, and every other table in one of them only; a table or block
// defined in two files is an error naming both. Every problem is located
// in its own file, and Errors are sorted by file (in the order given),
// then line. Config.Paths is left empty (LoadPaths sets it).
func ParseFiles(files []File, opts Options) (*Config, error) {
	cfg, _, err := parse(files, opts)
	return cfg, err
}

// parse is ParseFiles, also returning the decoder, whose line indexes
// LoadChange uses.
func parse(files []File, opts Options) (*Config, *decoder, error) {
	if len(files) == 0 {
		return nil, nil, errors.New("load config: no config file given")
	}
	d, top, err := newDecoder(files, opts)
	if err != nil {
		return nil, nil, err
	}
	cfg := &Config{}
	for _, f := range files {
		cfg.Files = append(cfg.Files, f.Name)
	}
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if !isTopTable(k) {
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
	cfg.Sources = d.sources(defaults)
	cfg.RateLimiters = d.rateLimiters()
	d.checkLimiterNames(cfg.Sources, cfg.RateLimiters)
	d.checkPush(cfg.Push, cfg.Daemon, cfg.Sources)
	d.undecoded()

	if err := d.result(); err != nil {
		return nil, nil, err
	}
	cfg.Skipped = d.skipped
	slices.SortStableFunc(cfg.Skipped, func(a, b Skipped) int {
		return cmp.Or(slices.Index(cfg.Files, a.File)-slices.Index(cfg.Files, b.File), a.Line-b.Line)
	})
	return cfg, d, nil
}

// newDecoder parses each of files into its top-level tables, and merges
// them (see merge) into one set of top-level tables and a decoder for
// them that resolves ${NAME} with opts.Lookup (nil: the process
// environment). Syntax errors are returned as Errors, every file's.
func newDecoder(files []File, opts Options) (*decoder, map[string]toml.Primitive, error) {
	lookup := opts.Lookup
	if lookup == nil {
		lookup = os.LookupEnv
	}
	d := &decoder{
		owner:     map[string]*doc{},
		lookup:    lookup,
		offline:   opts.Offline,
		unchecked: map[string]bool{},
		flagged:   map[string]bool{},
		raw:       map[string]string{},
	}
	var (
		syntax Errors
		tops   []map[string]toml.Primitive
	)
	for _, f := range files {
		var top map[string]toml.Primitive
		md, err := toml.Decode(string(f.Data), &top)
		if err != nil {
			syntax = append(syntax, syntaxError(f.Name, err)...)
			continue
		}
		d.docs = append(d.docs, &doc{file: f.Name, md: md, lines: indexLines(string(f.Data))})
		tops = append(tops, top)
	}
	if len(syntax) > 0 {
		return nil, nil, syntax
	}
	return d, d.merge(tops), nil
}

// result returns every problem found, sorted by file (in the order
// given) then line, or nil.
func (d *decoder) result() error {
	if len(d.errs) == 0 {
		return nil
	}
	order := map[string]int{}
	for i, o := range d.docs {
		order[o.file] = i
	}
	slices.SortStableFunc(d.errs, func(a, b *Error) int {
		if c := order[a.File] - order[b.File]; c != 0 {
			return c
		}
		return a.Line - b.Line
	})
	return d.errs
}

// syntaxError turns a toml decode error into Errors with its line.
func syntaxError(file string, err error) Errors {
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
