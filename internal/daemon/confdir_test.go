package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestReloadRereadsAConfigDirectory runs a daemon on a conf.d directory
// (-c DIR) with watch_config: a reload reads the directory again, so a
// file added there starts its source, a file that defines a source a
// second time is refused naming both files, and a file removed stops its
// source. /status names the directory and the files read.
func TestReloadRereadsAConfigDirectory(t *testing.T) {
	demo := func(name string) string {
		return fmt.Sprintf("[source.%s]\nkind = \"demo\"\ninterval = \"50ms\"\nevents_per_tick = 1\n", name)
	}
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, pub: "tcp://" + testsync.FreePort(t), ack: "tcp://" + testsync.FreePort(t)}
	confd := filepath.Join(dir, "conf.d")
	if err := os.Mkdir(confd, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(confd, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("10-daemon.toml", h.configText("watch_config = true", "", `ack_timeout = "2m"`))
	write("20-a.toml", demo("a"))
	write("README", "not a config file: ignored")
	cfg, err := config.LoadPaths([]string{confd}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	startConfig(t, h, cfg, Options{watchInterval: 20 * time.Millisecond})
	testsync.WaitFor(t, "source a to start", 20*time.Second, func() bool { return h.d.pipeline.SourcePID("a") != nil })
	aPID := h.d.pipeline.SourcePID("a")

	write("30-b.toml", demo("b"))
	// The reload starts b, then stores the config /status shows: wait for
	// both.
	wantFiles := []string{filepath.Join(confd, "10-daemon.toml"), filepath.Join(confd, "20-a.toml"), filepath.Join(confd, "30-b.toml")}
	testsync.WaitFor(t, "source b to start and /status to list its file", 20*time.Second, func() bool {
		st := h.d.status(t.Context()).Config
		return h.d.pipeline.SourcePID("b") != nil && st.File == confd && slices.Equal(st.Files, wantFiles)
	})

	write("40-dup.toml", "\n"+demo("b"))
	testsync.WaitFor(t, "the duplicate source to be refused", 20*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_config_last_reload_successful") == 0
	})
	want := filepath.Join(confd, "40-dup.toml") + `:2: source "b" already defined at ` + filepath.Join(confd, "30-b.toml") + ":1"
	if c := h.d.status(t.Context()).Config; !strings.Contains(c.LastReloadError, want) {
		t.Errorf("the refusal does not name both places %q:\n%s", want, c.LastReloadError)
	}
	res, err := h.d.Reload(t.Context(), true)
	if err == nil || !slices.Equal(res.Paths, []string{confd}) {
		t.Errorf("dry run: %+v, %v; want the duplicate refused for paths [%s]", res, err, confd)
	}

	for _, name := range []string{"40-dup.toml", "30-b.toml"} {
		if err := os.Remove(filepath.Join(confd, name)); err != nil {
			t.Fatal(err)
		}
	}
	testsync.WaitFor(t, "source b to stop once its file was removed", 20*time.Second, func() bool {
		return h.d.pipeline.SourcePID("b") == nil && metric(t, h.d.Registry(), "ingestor_config_last_reload_successful") == 1
	})
	if h.d.pipeline.SourcePID("a") != aPID {
		t.Error("source a was restarted by edits that did not touch it")
	}
}
