package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestSIGHUPReloadsTheConfig drives the built daemon's reload the ways an
// operator does: SIGHUP (systemd's ExecReload) and `ingestor reload`. A
// source added starts, an invalid edit and a change to a setting that
// cannot change live are refused with file:line while the old config keeps
// running, a source removed stops, and the daemon still drains on SIGTERM.
func TestSIGHUPReloadsTheConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	httpAddr := testsync.FreePort(t)
	cfgPath := filepath.Join(dir, "ingestor.toml")
	base := daemonTOML(dir, httpAddr, "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t), "", "")
	demo := func(name, interval string) string {
		return fmt.Sprintf("\n[source.%s]\nkind = \"demo\"\ninterval = %q\nevents_per_tick = 1\n", name, interval)
	}
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(cfgPath, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(base + demo("a", "100ms"))
	var logs testsync.LockedBuffer
	p := startProc(t, &logs, bin, "run", "-c", cfgPath)
	waitReady(t, httpAddr, p.cmd)
	reload := func(args ...string) (code int, stdout, stderr string) {
		var out, errOut bytes.Buffer
		code = run(append([]string{"reload", "-c", cfgPath}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}

	// SIGHUP with a source added: it starts.
	write(base + demo("a", "100ms") + demo("b", "100ms"))
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "source b to start after SIGHUP", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), `"msg":"source started","source":"b"`) ||
			strings.Contains(logs.String(), `"source":"b","msg":"source started"`) ||
			(strings.Contains(logs.String(), `"config reloaded"`) && strings.Contains(logs.String(), `"start":["b"]`))
	})
	if code, out, errOut := reload("-dry-run"); code != 0 || !strings.Contains(out, "dry run of") || !strings.Contains(out, "stay       2  a, b") {
		t.Fatalf("reload -dry-run = %d\n%s%s", code, out, errOut)
	}

	// An invalid edit: `ingestor reload` refuses it before asking the
	// daemon; SIGHUP makes the daemon refuse it and log where.
	write(base + demo("a", "100ms") + demo("b", "soon"))
	code, _, errOut := reload()
	if code != 1 || !strings.Contains(errOut, `ingestor.toml:24: source "b": interval: must be a duration`) {
		t.Fatalf("reload of an invalid file = %d\n%s", code, errOut)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "the refused reload to be logged and counted", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), `ingestor.toml:24: source \"b\": interval: must be a duration`) &&
			scrapeMetric(httpAddr, "ingestor_config_last_reload_successful") == 0
	})
	waitReady(t, httpAddr, p.cmd)

	// A setting that cannot change live: the daemon refuses the reload.
	write(strings.Replace(base, "shutdown_grace = \"10s\"", "shutdown_grace = \"11s\"", 1) + demo("a", "100ms"))
	code, _, errOut = reload()
	if code != 1 || !strings.Contains(errOut, `ingestor.toml:6: daemon.shutdown_grace: changed, but it cannot change while the daemon runs`) {
		t.Fatalf("reload of a fixed setting = %d\n%s", code, errOut)
	}

	// A source removed: it stops, and the reload succeeds again.
	write(base + demo("a", "100ms"))
	code, out, errOut := reload()
	if code != 0 || !strings.Contains(out, "reloaded ") || !strings.Contains(out, "stop       1  b") || !strings.Contains(out, "stay       1  a") {
		t.Fatalf("reload = %d\n%s%s", code, out, errOut)
	}
	if v := scrapeMetric(httpAddr, "ingestor_config_last_reload_successful"); v != 1 {
		t.Errorf("ingestor_config_last_reload_successful = %v after a good reload, want 1", v)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(); err != nil {
		t.Fatalf("exit after the reloads then SIGTERM: %v\n%s", err, tail(logs.String()))
	}
}
