package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ingestorhq/ingestor/config"
)

// subcommand is the preamble every `ingestor NAME -c FILE ...` shares: its
// flag set writing to stderr, the -c flag, parsing with flags before or
// after the positional arguments, -h answered with the usage and exit 0,
// and the config loaded with every problem printed.
type subcommand struct {
	name   string
	fs     *flag.FlagSet
	paths  *configPaths
	stderr io.Writer
}

// configPaths is the -c flag, which every command that reads the
// daemon's config takes: a config file or a directory of *.toml files,
// repeatable (the files are merged, see config.ReadPaths).
type configPaths []string

func (p *configPaths) String() string { return strings.Join(*p, ", ") }

func (p *configPaths) Set(v string) error {
	if v == "" {
		return errors.New("the path is empty")
	}
	*p = append(*p, v)
	return nil
}

// configFlag adds -c to fs, with help saying what the config is for.
func configFlag(fs *flag.FlagSet, help string) *configPaths {
	p := &configPaths{}
	fs.Var(p, "c", help+": a `FILE`, or a directory of *.toml files; repeat -c to merge several")
	return p
}

// loadConfig loads the config at paths, or the embedded example when
// there are none.
func loadConfig(paths configPaths) (*config.Config, error) {
	if len(paths) == 0 {
		return config.Default(), nil
	}
	return config.LoadPaths(paths, config.Options{})
}

// newSubcommand returns the preamble of `ingestor name`; usage, when not
// empty, is printed above the flags' defaults by -h and after a usage
// error, and pathHelp is the -c flag's help.
func newSubcommand(name, usage, pathHelp string, stderr io.Writer) *subcommand {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if usage != "" {
		fs.Usage = func() {
			fmt.Fprint(stderr, usage)
			fs.PrintDefaults()
		}
	}
	return &subcommand{name: name, fs: fs, paths: configFlag(fs, pathHelp), stderr: stderr}
}

// parse parses args and returns the positional arguments. When it returns
// done, the command ends with code: 0 after -h, 2 after a flag error (the
// flag package printed it and the usage).
func (s *subcommand) parse(args []string) (pos []string, code int, done bool) {
	pos, err := parseInterspersed(s.fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return nil, 0, true
	case err != nil:
		return nil, 2, true
	}
	return pos, 0, false
}

// flagExit is the exit code of a command whose flags did not parse: 0
// after -h or --help (the flag package printed the usage), 2 after a
// flag error (it printed the error and the usage).
func flagExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

// fail prints "ingestor NAME: message" and returns 2, the exit code of a
// usage error.
func (s *subcommand) fail(format string, a ...any) int {
	fmt.Fprintf(s.stderr, "ingestor %s: %s\n", s.name, fmt.Sprintf(format, a...))
	return 2
}

// hasPath reports whether -c was given.
func (s *subcommand) hasPath() bool { return len(*s.paths) > 0 }

// needPath reports whether -c was given, printing the usage error when
// not.
func (s *subcommand) needPath() bool {
	if !s.hasPath() {
		s.fail("-c FILE is required")
		return false
	}
	return true
}

// load loads the -c files; on a problem it prints every one (file:line)
// and returns nil, and the command exits 1.
func (s *subcommand) load() *config.Config {
	return s.loadWith(config.Options{})
}

// loadWith is load with opts.
func (s *subcommand) loadWith(opts config.Options) *config.Config {
	cfg, err := config.LoadPaths(*s.paths, opts)
	if err != nil {
		printConfigError(s.stderr, err)
		return nil
	}
	return cfg
}

// isHelp reports whether arg asks for help in place of a subcommand
// (`ingestor dlq -h`).
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}
