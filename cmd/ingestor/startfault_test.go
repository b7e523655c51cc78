package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestSIGTERMDuringStartExitsZero sends SIGTERM to the built daemon while
// its start waits on the raw store (an S3 endpoint that does not answer
// until the request is cancelled): the daemon exits 0 and releases the
// data dir's lock, so a second start can take it.
func TestSIGTERMDuringStartExitsZero(t *testing.T) {
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	asked := make(chan struct{}, 1)
	s3 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case asked <- struct{}{}:
		default:
		}
		<-r.Context().Done() // the daemon gives up the request when it stops
	}))
	defer s3.Close()
	data := filepath.Join(dir, "data")
	pub, ack := testconfig.FreeEndpoints(t)
	cfgPath := testconfig.Daemon{
		Dir: dir, HTTPAddr: testsync.FreePort(t), JSONLogs: true, Publish: pub, Ack: ack,
		RawStore: fmt.Sprintf(`url = "s3://bucket/raw"
endpoint = %q
path_style = true
region = "us-east-1"
max_attempts = 1`, s3.URL),
	}.Write(t, filepath.Join(dir, "ingestor.toml"))
	cmd := exec.Command(bin, "run", "-c", cfgPath)
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true")
	p, err := testsync.StartProcess(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop(10 * time.Second) }()
	select {
	case <-asked:
	case <-p.Done():
		t.Fatalf("the daemon exited before it asked the raw store: %v\n%s", p.Err(), tail(p.Out.String()))
	case <-time.After(30 * time.Second):
		t.Fatalf("the daemon did not ask the raw store within 30s\n%s", tail(p.Out.String()))
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("the daemon did not exit within 30s of SIGTERM\n%s", tail(p.Out.String()))
	}
	if err := p.Err(); err != nil {
		t.Fatalf("a SIGTERM during start: %v, want exit 0\n%s", err, tail(p.Out.String()))
	}
	if out := p.Out.String(); strings.Contains(out, "start failed") {
		t.Errorf("a SIGTERM during start was logged as a failure:\n%s", tail(out))
	}
	unlock, err := datadir.Lock(data)
	if err != nil {
		t.Fatalf("the data dir's lock after a SIGTERM during start: %v", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
}

// nobody is the uid and gid the foreign data dir tests run the daemon as:
// the tests run as root, which no file mode stops.
const nobody = 65534

// sharedDir returns a directory that the nobody user can read and
// traverse (t.TempDir's are 0700), removed when the test ends.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", strings.ReplaceAll(t.Name(), "/", "_"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Error(err)
		}
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// previousRun fills data (created if needed) with what a stopped daemon
// leaves: its LOCK file and an empty queue.
func previousRun(t *testing.T, data string) {
	t.Helper()
	if err := os.MkdirAll(data, 0o750); err != nil {
		t.Fatal(err)
	}
	unlock, err := datadir.Lock(data)
	if err != nil {
		t.Fatal(err)
	}
	q, err := queue.Open(queue.Options{Path: filepath.Join(data, "queue.db"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(q.Close(), unlock()); err != nil {
		t.Fatal(err)
	}
}

// snapshot lists every file under dir with its mode, size and mtime.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v %d %d\n", p, fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// refusedStart runs the daemon on the config cfgPath as uid (0 for this
// process's user) and checks that it exits non-zero at once, with want in
// its output, and leaves data as it was.
func refusedStart(t *testing.T, bin, cfgPath, data string, uid uint32, want ...string) {
	t.Helper()
	before := snapshot(t, data)
	cmd := exec.Command(bin, "run", "-c", cfgPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if uid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid}
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("the daemon on data dir %s: %v, want a non-zero exit\n%s", data, err, tail(string(out)))
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Errorf("the daemon's output lacks %q:\n%s", w, tail(string(out)))
		}
	}
	if after := snapshot(t, data); after != before {
		t.Errorf("the refused start changed the data dir:\nbefore:\n%safter:\n%s", before, after)
	}
}

// foreignSetup builds the daemon into base, a dir the nobody user can
// read, writes base/ingestor.toml (its data dir base/data, raw store
// base/raw), and leaves in the data dir what an earlier run leaves.
func foreignSetup(t *testing.T) (bin, cfgPath, data string) {
	t.Helper()
	base := sharedDir(t)
	bin = buildBinary(t, base)
	cfgPath, cfg := writeDaemonConfig(t, base, "", "", "")
	previousRun(t, cfg.Daemon.DataDir)
	return bin, cfgPath, cfg.Daemon.DataDir
}

// chownTree gives dir and everything under it to uid.
func chownTree(t *testing.T, dir string, uid int) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestForeignDataDirReadOnlyRefusesToStart runs the daemon as the owner
// of a data dir left by an earlier run and made read-only (mode 0500):
// it exits non-zero naming the dir, and writes nothing, not even the
// LOCK file's pid.
func TestForeignDataDirReadOnlyRefusesToStart(t *testing.T) {
	bin, cfgPath, data := foreignSetup(t)
	chownTree(t, data, nobody)
	if err := os.Chmod(data, 0o500); err != nil {
		t.Fatal(err)
	}
	refusedStart(t, bin, cfgPath, data, nobody, "data dir "+data, "not writable")
}

// TestForeignDataDirOwnedByAnotherUserRefusesToStart runs the daemon as
// nobody on a data dir that root owns (mode 0755): it exits non-zero
// naming the dir and its owner, and touches nothing.
func TestForeignDataDirOwnedByAnotherUserRefusesToStart(t *testing.T) {
	bin, cfgPath, data := foreignSetup(t)
	refusedStart(t, bin, cfgPath, data, nobody, "data dir "+data, "not writable", "owned by uid 0")
}

// TestForeignDataDirLockedRefusesToStart starts the daemon on a data dir
// whose lock another ingestor holds: it exits non-zero naming the dir and
// the holder's pid, and touches nothing.
func TestForeignDataDirLockedRefusesToStart(t *testing.T) {
	bin, cfgPath, data := foreignSetup(t)
	unlock, err := datadir.Lock(data)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unlock(); err != nil {
			t.Error(err)
		}
	}()
	refusedStart(t, bin, cfgPath, data, 0, fmt.Sprintf("data dir %s is in use by another ingestor (pid %d)", data, os.Getpid()))
}

// TestSIGTERMJustAfterExecExitsZero: a SIGTERM moments after `ingestor
// run` starts, while Go initialises the packages (tens of ms: gRPC, etcd,
// the AWS SDK) and while the config loads, is a clean stop: exit 0, never
// 143 (Go's default action). Before, the handler was installed only after
// the config loaded, some 60-90 ms in: 15 of 15 tries within that window
// exited 143. The child runs with GODEBUG=inittrace=1, which prints a line
// as each package finishes its initialisation, and the signal goes out
// just after one of ours: early (internal/wire), the config package, and
// the last (internal/daemon, then main runs and loads the config), three
// times each. A SIGTERM before the Go runtime has initialised os/signal
// (internal/earlysignal follows it at once: the dynamic loader, the
// runtime and a few standard packages before it) still ends the process
// the default way: no Go code runs before then.
func TestSIGTERMJustAfterExecExitsZero(t *testing.T) {
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	cfgPath := filepath.Join(dir, "ingestor.toml")
	if err := os.WriteFile(cfgPath, []byte(daemonTOML(dir, testsync.FreePort(t), "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t), "", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	var failed []string
	for _, pkg := range []string{"internal/wire", "config", "internal/daemon"} {
		for range 3 {
			if err := sigtermAfterInit(t, bin, cfgPath, "github.com/ingestorhq/ingestor/"+pkg); err != nil {
				failed = append(failed, fmt.Sprintf("after %s: %v", pkg, err))
			}
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of 9 SIGTERMs during start-up did not stop the daemon cleanly: %s", len(failed), strings.Join(failed, "; "))
	}
}

// sigtermAfterInit starts `bin run -c cfgPath`, sends it SIGTERM as soon as
// the package pkg has been initialised, and returns how it exited if not
// with status 0.
func sigtermAfterInit(t *testing.T, bin, cfgPath, pkg string) error {
	t.Helper()
	cmd := exec.Command(bin, "run", "-c", cfgPath)
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	seen := false
	for !seen && lines.Scan() {
		seen = strings.HasPrefix(lines.Text(), "init "+pkg+" ")
	}
	if !seen {
		_ = cmd.Process.Kill() // the test failed already
		_ = cmd.Wait()         // killed: its status is the signal
		t.Fatalf("the daemon never reported initialising %s (%v)", pkg, lines.Err())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, stderr); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		return err
	}
	return nil
}
