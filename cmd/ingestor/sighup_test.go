package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestSIGHUPKeepsTheDaemonRunning sends SIGHUP to the built daemon, as a
// habit of operators (and of tools that rotate logs) does: Go's default
// for SIGHUP ends the process at once, without draining. The daemon must
// keep running, say that it cannot reload, and still drain on SIGTERM.
func TestSIGHUPKeepsTheDaemonRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	httpAddr := testsync.FreePort(t)
	cfgPath := filepath.Join(dir, "ingestor.toml")
	cfg := daemonTOML(dir, httpAddr, "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t), "", "")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testsync.LockedBuffer
	p := startProc(t, &logs, bin, "run", "-c", cfgPath)
	waitReady(t, httpAddr, p.cmd)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "the daemon to log the SIGHUP", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), "SIGHUP ignored")
	})
	waitReady(t, httpAddr, p.cmd) // still serving
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(); err != nil {
		t.Fatalf("exit after SIGHUP then SIGTERM: %v\n%s", err, tail(logs.String()))
	}
}
