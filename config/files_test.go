package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSplitDirectory loads a conf.d directory: its *.toml files in
// lexical order, others and dot files left out, merged into one config in
// which a source inherits the [defaults] of another file and names the
// limiter of a third.
func TestSplitDirectory(t *testing.T) {
	dir := filepath.Join(testdata, "split")
	cfg, err := LoadPaths([]string{dir}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "10-daemon.toml"), filepath.Join(dir, "20-github.toml"), filepath.Join(dir, "30-demo.toml")}
	if !slices.Equal(cfg.Files, want) || !slices.Equal(cfg.Paths, []string{dir}) {
		t.Errorf("files %q, paths %q; want files %q, paths [%s]", cfg.Files, cfg.Paths, want, dir)
	}
	if cfg.Name() != dir || cfg.Args() != "-c "+dir {
		t.Errorf("name %q, args %q", cfg.Name(), cfg.Args())
	}
	if cfg.Daemon.LogLevel != "debug" || cfg.Publish.EventsPerFrame != 50 {
		t.Errorf("daemon %+v, publish %+v: the first file's tables are not applied", cfg.Daemon, cfg.Publish)
	}
	gh := source(t, cfg, "github_issues")
	if gh.Interval != 30*time.Second || gh.Line != 5 {
		t.Errorf("github_issues: interval %v (want [defaults]' 30s from 10-daemon.toml), line %d (want 5)", gh.Interval, gh.Line)
	}
	if demo := source(t, cfg, "demo"); demo.Interval != 5*time.Second || demo.Line != 1 {
		t.Errorf("demo: interval %v, line %d", demo.Interval, demo.Line)
	}
	if len(cfg.RateLimiters) != 1 || cfg.RateLimiters[0].Name != "github" || cfg.RateLimiters[0].Line != 2 {
		t.Errorf("rate limiters %+v", cfg.RateLimiters)
	}
}

// TestRepeatedPaths merges the paths in the order given, a file and a
// directory alike; a block defined again by a later path is reported at
// its own file and line, naming the first.
func TestRepeatedPaths(t *testing.T) {
	a, b := filepath.Join(testdata, "split", "10-daemon.toml"), filepath.Join(testdata, "split", "30-demo.toml")
	cfg, err := LoadPaths([]string{a, b}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Files, []string{a, b}) || cfg.Daemon.LogLevel != "debug" || len(cfg.Sources) != 1 {
		t.Errorf("files %q, log level %q, sources %+v", cfg.Files, cfg.Daemon.LogLevel, cfg.Sources)
	}
	if cfg.Args() != "-c "+a+" -c "+b || cfg.Name() != a+", "+b {
		t.Errorf("args %q, name %q", cfg.Args(), cfg.Name())
	}
	minimal := filepath.Join(testdata, "minimal.good.toml")
	_, err = LoadPaths([]string{filepath.Join(testdata, "split"), minimal}, Options{})
	want := minimal + `:2: source "demo" already defined at ` + b + ":1"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}

// TestSplitDuplicates: a table, a source and a rate limiter defined in
// two files are each reported once, at the second file's line, naming the
// first's; the keys of a table defined twice are not reported again, and
// every other problem keeps its own file and line.
func TestSplitDuplicates(t *testing.T) {
	dir := filepath.Join(testdata, "split_dup")
	a, b := filepath.Join(dir, "10-a.toml"), filepath.Join(dir, "20-b.toml")
	_, err := LoadPaths([]string{dir}, Options{})
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("err = %v, want Errors", err)
	}
	want := []string{
		a + `:6: source "x": interval: must be a duration such as "500ms", "30s" or "1m30s", not "soon"`,
		b + `:2: [daemon] already defined at ` + a + `:1 (split files may each add [source.NAME] and [rate_limiters.NAME] blocks, but any other table belongs in one file)`,
		b + `:5: source "x" already defined at ` + a + `:4`,
		b + `:10: source "y": colour: unknown key`,
		b + `:12: rate limiter "shared" already defined at ` + a + `:8`,
	}
	if got := strings.Split(err.Error(), "\n"); !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", err, strings.Join(want, "\n"))
	}
}

// TestSplitSyntaxErrors: a syntax error in any file is reported with its
// file and line, every file's at once.
func TestSplitSyntaxErrors(t *testing.T) {
	_, err := ParseFiles([]File{
		{Name: "a.toml", Data: []byte("[daemon]\nlog_level = \n")},
		{Name: "b.toml", Data: []byte("[source.x]\nkind = \"demo\"\n")},
		{Name: "c.toml", Data: []byte("\n\n[publish\n")},
	}, Options{})
	var errs Errors
	if !errors.As(err, &errs) || len(errs) != 2 || errs[0].File != "a.toml" || errs[0].Line != 2 || errs[1].File != "c.toml" || errs[1].Line < 3 {
		t.Errorf("err = %v, want a.toml:2 and c.toml from line 3", err)
	}
}

// TestConfigDirectoryWithoutTOML: a directory with no *.toml file, or no
// file at all, is an error naming it.
func TestConfigDirectoryWithoutTOML(t *testing.T) {
	for _, dir := range []string{filepath.Join(testdata, "no_toml"), t.TempDir()} {
		_, err := LoadPaths([]string{dir}, Options{})
		if want := "load config: the directory " + dir + " holds no *.toml file"; err == nil || err.Error() != want {
			t.Errorf("err = %v, want %q", err, want)
		}
	}
	if _, err := LoadPaths(nil, Options{}); err == nil {
		t.Error("no path: no error")
	}
}

// TestFingerprintFollowsTheDirectory: the digest changes when a file of a
// directory is added, edited or removed, and only then.
func TestFingerprintFollowsTheDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	fp := func() [32]byte {
		t.Helper()
		f, err := Fingerprint([]string{dir})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	write("a.toml", "[source.a]\nkind = \"demo\"\n")
	first := fp()
	write("notes.txt", "ignored")
	if fp() != first {
		t.Error("a file that is not *.toml changed the fingerprint")
	}
	write("b.toml", "[source.b]\nkind = \"demo\"\n")
	added := fp()
	if added == first {
		t.Error("adding b.toml did not change the fingerprint")
	}
	write("b.toml", "[source.b]\nkind = \"demo\"\nenabled = false\n")
	if fp() == added {
		t.Error("editing b.toml did not change the fingerprint")
	}
	if err := os.Remove(filepath.Join(dir, "b.toml")); err != nil {
		t.Fatal(err)
	}
	if fp() != first {
		t.Error("removing b.toml did not bring the first fingerprint back")
	}
}

// TestLoadChangeRereadsADirectory: a reload of a directory reads it anew,
// and a setting that cannot change live is reported in the file that has
// it.
func TestLoadChangeRereadsADirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("10-daemon.toml", "[daemon]\ndata_dir = \"/tmp/ingestor-split\"\n")
	write("20-a.toml", "[source.a]\nkind = \"demo\"\n")
	old, err := LoadPaths([]string{dir}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	write("30-b.toml", "[source.b]\nkind = \"demo\"\n")
	next, plan, err := LoadChange(old, old.Paths)
	if err != nil || !slices.Equal(plan.Start, []string{"b"}) || !slices.Equal(plan.Stay, []string{"a"}) || len(next.Files) != 3 {
		t.Fatalf("plan %v, files %q, err %v", plan, next.Files, err)
	}
	write("10-daemon.toml", "[daemon]\ndata_dir = \"/tmp/ingestor-split\"\n\nlog_level = \"debug\"\n")
	_, _, err = LoadChange(old, old.Paths)
	want := filepath.Join(dir, "10-daemon.toml") + ":4: daemon.log_level: changed, but it cannot change while the daemon runs"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v, want %q", err, want)
	}
}
