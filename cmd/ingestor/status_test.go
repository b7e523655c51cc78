package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/daemon"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// runStatus runs `ingestor status args...` and returns its exit code,
// stdout and stderr.
func runStatus(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"status"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestStatusCommand runs `ingestor status` against a daemon with a source
// in each state (testupstream.StateFeeds): -o json carries every source's
// state and reason, the table shows each on its row, aligned and without
// colour when not on a terminal, with the failing source's error under it.
func TestStatusCommand(t *testing.T) {
	dir := t.TempDir()
	feeds := testupstream.NewStateFeeds(t)
	cfgPath, cfg := writeDaemonConfig(t, dir, "", "max_pending_events = 5", feeds.TOML)
	d, stop := startInProcess(t, cfg)
	status := func(args ...string) daemon.Status {
		t.Helper()
		code, out, errOut := runStatus(append(args, "-o", "json")...)
		if code != 0 {
			t.Fatalf("ingestor status %v: exit %d: %s", args, code, errOut)
		}
		var st daemon.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("ingestor status -o json: %v\n%s", err, out)
		}
		return st
	}
	feeds.Bring(t, d.PushAddr(), func(name string) (string, string) {
		for _, s := range status("-c", cfgPath).Sources {
			if s.Name == name {
				return s.State, s.Reason
			}
		}
		return "", ""
	})

	// --addr (or -addr) reaches the same daemon.
	st := status("--addr", d.HTTPAddr())
	if len(st.Sources) != len(feeds.Want) {
		t.Fatalf("%d sources, want %d", len(st.Sources), len(feeds.Want))
	}
	for _, s := range st.Sources {
		if want := feeds.Want[s.Name]; s.State != want[0] || s.Reason != want[1] {
			t.Errorf("source %q: %s %s in -o json, want %s %s", s.Name, s.State, s.Reason, want[0], want[1])
		}
	}

	code, out, errOut := runStatus("-c", cfgPath)
	if code != 0 {
		t.Fatalf("ingestor status: exit %d: %s", code, errOut)
	}
	t.Logf("ingestor status:\n%s", out)
	if strings.Contains(out, "\x1b[") {
		t.Error("colour codes in the table written to a buffer, not a terminal")
	}
	lines := strings.Split(out, "\n")
	header := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "SOURCE ") {
			header = i
		}
	}
	if header < 0 {
		t.Fatalf("no table header in:\n%s", out)
	}
	stateCol := strings.Index(lines[header], "STATE")
	for name, want := range feeds.Want {
		row := regexp.MustCompile(`^` + name + `\s`)
		found := false
		for _, l := range lines[header+1:] {
			if row.MatchString(l) {
				found = true
				if len(l) <= stateCol || !strings.HasPrefix(l[stateCol:], want[0]+" ") || (want[1] != "" && !strings.Contains(l, want[1])) {
					t.Errorf("row of %q: %q, want %s under STATE (column %d) and %q", name, l, want[0], stateCol, want[1])
				}
			}
		}
		if !found {
			t.Errorf("no row for source %q", name)
		}
	}
	if !regexp.MustCompile(`(?m)^broken: last error .*status 404$`).MatchString(out) {
		t.Errorf("the failing source's error is not under the table:\n%s", out)
	}
	if !strings.Contains(out, "queue: 11/5 (full) pending events") {
		t.Errorf("the full queue is not shown:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^config: \S+, applied `).MatchString(out) {
		t.Errorf("the running config is not shown:\n%s", out)
	}
	// A refused reload is shown with its problems.
	refused, at := st, st.Time
	refused.Config = daemon.ConfigStatus{File: "x.toml", LastReloadAt: &at, LastReloadSuccessAt: at.Add(-time.Hour),
		LastReloadError: "x.toml:3: daemon.data_dir: changed\nx.toml:9: source \"b\": interval: bad"}
	var rb bytes.Buffer
	printStatus(&rb, refused, false)
	if !strings.Contains(rb.String(), "config: x.toml: the last reload (0s ago) was REFUSED; running the config applied 60m ago:\n  x.toml:3: daemon.data_dir: changed\n  x.toml:9:") {
		t.Errorf("a refused reload is not shown:\n%s", rb.String())
	}

	// A coloured table has the same columns once the colours are removed.
	var coloured bytes.Buffer
	printStatus(&coloured, st, true)
	if !strings.Contains(coloured.String(), ansiRed+"broken") {
		t.Errorf("the failing source is not red in the coloured table:\n%q", coloured.String())
	}
	var plain bytes.Buffer
	printStatus(&plain, st, false)
	if got := regexp.MustCompile("\x1b\\[[0-9;]*m").ReplaceAllString(coloured.String(), ""); got != plain.String() {
		t.Errorf("the coloured table without its colours differs from the plain one:\n%s\n---\n%s", got, plain.String())
	}

	stop()
	code, _, errOut = runStatus("-c", cfgPath)
	if code != 1 || !strings.Contains(errOut, "cannot read the daemon's status") || !strings.Contains(errOut, "daemon.http_addr of "+cfgPath) {
		t.Errorf("with the daemon stopped: exit %d, stderr %q; want 1 and a message naming daemon.http_addr of the config", code, errOut)
	}
}

func TestStatusCommandUsage(t *testing.T) {
	if code, _, errOut := runStatus("-addr", "127.0.0.1:9", "-o", "yaml"); code != 2 || !strings.Contains(errOut, "want table or json") {
		t.Errorf("-o yaml: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runStatus("-addr", "127.0.0.1:9", "extra"); code != 2 || !strings.Contains(errOut, `unexpected argument "extra"`) {
		t.Errorf("an extra argument: exit %d, %q", code, errOut)
	}
	missing := filepath.Join(t.TempDir(), "missing.toml")
	if code, _, errOut := runStatus("-c", missing); code != 1 || !strings.Contains(errOut, missing) {
		t.Errorf("a missing config: exit %d, %q", code, errOut)
	}
}

func TestStatusColourOnlyOnATerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := errors.Join(r.Close(), w.Close()); err != nil {
			t.Error(err)
		}
	}()
	if isTerminal(w) {
		t.Error("a pipe is taken for a terminal: `ingestor status | less` would get colour codes")
	}
	if isTerminal(&bytes.Buffer{}) {
		t.Error("a buffer is taken for a terminal")
	}
}
