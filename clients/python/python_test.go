// Package python_test runs the Python processor client in clients/python
// as pip installs it: its unit tests, and its example processor (the
// console script ingestor-processor-py) against the real daemon binary
// through kill -9 loops and a poison event.
package python_test

import (
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/ingestorhq/ingestor/internal/etcdtest"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// consoleScript is the example processor's command, installed by pip.
const consoleScript = "ingestor-processor-py"

func TestMain(m *testing.M) {
	code := m.Run()
	if installDir != "" {
		_ = os.RemoveAll(installDir)
	}
	os.Exit(code)
}

// The package installed once per test binary, for every test here.
var (
	installOnce sync.Once
	installDir  string // removed by TestMain
	installed   *venv
	installErr  error
)

// venv is a fresh virtual environment the package is installed into.
type venv struct {
	dir    string // the environment (INGESTOR_TEST_VENV for the tests)
	python string // its interpreter
	script string // its ingestor-processor-py
	tests  string // a directory holding a copy of tests/ and nothing else
}

// installPackage installs this directory's package the way its README
// says, offline: into a fresh `python3 -m venv --system-site-packages`
// (pyzmq, setuptools and wheel come from Debian's packages),
// `pip install --no-build-isolation --no-index`. pip builds from a copy of
// this directory, as setuptools writes build/ and the egg-info into the
// folder it builds; and the unit tests run from a copy of tests/ in a
// directory of their own, so the source folder is never on sys.path.
func installPackage(t *testing.T) *venv {
	t.Helper()
	py := testsync.Python3(t)
	installOnce.Do(func() { installed, installErr = install(py) })
	if installErr != nil {
		t.Fatalf("installing the package: %v", installErr)
	}
	return installed
}

func install(py string) (*venv, error) {
	if out, err := exec.Command(py, "-c", "import ensurepip, setuptools, wheel").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s cannot make a virtual environment or build the package (%v: %s); run make test-deps, "+
			"which installs python3-venv, python3-setuptools and python3-wheel, or set PYTHON3", py, err, out)
	}
	dir, err := os.MkdirTemp("", "ingestor-python-")
	if err != nil {
		return nil, err
	}
	installDir = dir
	src, run := filepath.Join(dir, "src"), filepath.Join(dir, "run")
	if err := copySource(".", src); err != nil {
		return nil, err
	}
	if err := os.CopyFS(filepath.Join(run, "tests"), os.DirFS(filepath.Join(src, "tests"))); err != nil {
		return nil, err
	}
	v := &venv{dir: filepath.Join(dir, "venv"), tests: run}
	v.python, v.script = filepath.Join(v.dir, "bin", "python"), filepath.Join(v.dir, "bin", consoleScript)
	for _, args := range [][]string{
		{py, "-m", "venv", "--system-site-packages", v.dir},
		{v.python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-cache-dir", src},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir, cmd.Env = dir, pythonEnv()
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if _, err := os.Stat(v.script); err != nil {
		return nil, fmt.Errorf("pip did not install the console script: %v", err)
	}
	return v, nil
}

// copySource copies the package's directory as a clean checkout has it:
// without what a build or Python wrote into it.
func copySource(from, to string) error {
	return filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != from && (name == "build" || name == "__pycache__" || strings.HasSuffix(name, ".egg-info")) {
			return filepath.SkipDir
		}
		target := filepath.Join(to, path)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}

// pythonEnv is the environment for Python and pip: nothing from the
// caller's PYTHONPATH, user site-packages or pip settings (an index, a
// wheel folder) reaches them, and nothing writes bytecode.
func pythonEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "PYTHONPATH" || name == "PYTHONHOME" || name == "PYTHONUSERBASE" || strings.HasPrefix(name, "PIP_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PYTHONNOUSERSITE=1", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1",
		"PIP_CONFIG_FILE="+os.DevNull, "PIP_DISABLE_PIP_VERSION_CHECK=1")
}

// TestPythonUnitTests installs the package into a fresh virtual
// environment and runs the client's unittest suite against the installed
// package: frame decoding, ack batching, nacks, dedupe, exactly-once
// SQLite, CURVE and following a cluster, against real sockets, SQLite
// files and two real etcd servers (one for the test that turns
// authentication on); and the installation itself (the package imported
// from the environment's site-packages, its metadata, the console script).
func TestPythonUnitTests(t *testing.T) {
	v := installPackage(t)
	etcd, etcdAuth := etcdtest.Start(t), etcdtest.Start(t)
	cmd := exec.Command(v.python, "-m", "unittest", "-v")
	cmd.Dir = v.tests
	cmd.Env = append(pythonEnv(), "INGESTOR_TEST_VENV="+v.dir,
		"INGESTOR_TEST_ETCD="+etcd.Endpoint, "INGESTOR_TEST_ETCD_AUTH="+etcdAuth.Endpoint)
	out, err := cmd.CombinedOutput()
	if err != nil {
		// The failing tests' names last, where a cut log still shows them.
		t.Fatalf("python3 -m unittest: %v\n%s\nfailed: %s", err, out, strings.Join(failedUnitTests(string(out)), "; "))
	}
	if !strings.Contains(string(out), "\nOK") {
		t.Fatalf("python3 -m unittest did not report OK:\n%s", out)
	}
	for _, name := range []string{"test_imported_from_the_venv", "test_metadata", "test_console_script_help"} {
		if !strings.Contains(string(out), name+" (tests.test_installed.") {
			t.Errorf("python3 -m unittest did not run %s:\n%s", name, out)
		}
	}
	t.Logf("%s", lastLines(string(out), 3))
}

// TestPythonConsoleScript runs the installed example processor's --help:
// exit status 0 and its usage under its own name.
func TestPythonConsoleScript(t *testing.T) {
	v := installPackage(t)
	cmd := exec.Command(v.script, "--help")
	cmd.Dir, cmd.Env = t.TempDir(), pythonEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("%s --help exited %d, want 0:\n%s%s", consoleScript, exit.ExitCode(), out, stderr.String())
		}
		t.Fatalf("%s --help: %v", consoleScript, err)
	}
	if usage := "usage: " + consoleScript + " "; !strings.HasPrefix(string(out), usage) || !strings.Contains(string(out), "--sqlite SQLITE") {
		t.Errorf("%s --help, want a usage starting %q that names --sqlite:\n%s", consoleScript, usage, out)
	}
}

// TestPythonExactlyOnceUnderKill runs the example processor (run_tx into a
// table whose primary key is (source, key), with a plain INSERT) against
// the built daemon and a finite upstream, SIGKILLs the processor at random
// moments, 12 times, and the daemon with it every third time. At the end
// the table holds every upstream event exactly once.
func TestPythonExactlyOnceUnderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the daemon and kills it and the processor repeatedly")
	}
	const (
		total  = 4000
		cycles = 12
	)
	e := newEnv(t, testupstream.New(t, total, 20).URL+"/feed", "")
	d := e.startDaemon()
	p := e.startProcessor()
	midStream := 0
	for i := range cycles {
		// A random kill moment once this processor has connected: on a
		// busy machine its start alone can outlast a fixed delay.
		e.waitUntil("the processor to start", 30*time.Second, func() bool {
			return strings.Count(readFile(t, e.procLog), "processor started") > i
		})
		time.Sleep(time.Duration(rand.Int64N(int64(300*time.Millisecond))) + 100*time.Millisecond)
		if n := sinkCount(t, e.sink); n > 0 && n < total {
			midStream++
		}
		kill(p)
		if i%3 == 2 {
			kill(d)
			d = e.startDaemon()
		}
		p = e.startProcessor()
	}
	// Kills after the stream ended prove nothing; most must land in it.
	if midStream < cycles/4 {
		t.Fatalf("only %d of %d kills landed while events were being applied: the test did not test", midStream, cycles)
	}
	e.waitDone(total)
	// The last processor may not have installed its SIGTERM handler yet
	// when the events were all applied (by its predecessors): a SIGTERM
	// then kills it ("signal: terminated") instead of stopping it.
	e.waitUntil("the last processor to start", 30*time.Second, func() bool {
		return strings.Count(readFile(t, e.procLog), "processor started") > cycles
	})
	e.stop(p, "processor")
	e.stop(d, "daemon")
	e.checkSink(total, nil)
	t.Logf("%d of %d kills landed mid-stream", midStream, cycles)
}

// TestPythonPoisonBecomesDeadLetter runs the example processor over CURVE
// with two keys it fails permanently: the daemon lists both as dead
// letters with the processor's reason, and every other event is applied.
func TestPythonPoisonBecomesDeadLetter(t *testing.T) {
	const total = 300
	poison := []string{"ev-7", "ev-123"}
	e := newEnv(t, testupstream.New(t, total, 50).URL+"/feed", "^ev-(7|123)$")
	e.enableCurve()
	d := e.startDaemon()
	p := e.startProcessor()
	e.waitDone(total - len(poison))

	out, err := exec.Command(e.bin, "dlq", "list", "-c", e.cfg).CombinedOutput()
	if err != nil {
		t.Fatalf("ingestor dlq list: %v\n%s", err, out)
	}
	list := string(out)
	for _, k := range poison {
		if !strings.Contains(list, "/"+k+" ") {
			t.Errorf("dlq list does not list %s:\n%s", k, list)
		}
	}
	if !strings.Contains(list, "matches --fail-keys") || !strings.Contains(list, fmt.Sprintf("%d dead letter(s)", len(poison))) {
		t.Errorf("dlq list, want %d dead letters with the processor's reason:\n%s", len(poison), list)
	}
	e.stop(p, "processor")
	e.stop(d, "daemon")
	e.checkSink(total, poison)
	if logs := readFile(t, e.procLog); !strings.Contains(logs, "CURVE") {
		t.Errorf("the processor did not run with CURVE:\n%s", lastLines(logs, 20))
	}
}

// env is one test's daemon binary, config, processor database and logs.
type env struct {
	t                  *testing.T
	dir, bin, cfg      string
	httpAddr, pub, ack string
	sink, pollURL      string
	failKeys           string
	procArgs           []string
	daemonLog, procLog string
	venv               *venv
}

func newEnv(t *testing.T, pollURL, failKeys string) *env {
	v := installPackage(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "ingestor")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/ingestorhq/ingestor/cmd/ingestor").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/ingestor: %v\n%s", err, out)
	}
	e := &env{t: t, dir: dir, bin: bin, cfg: filepath.Join(dir, "ingestor.toml"), httpAddr: testsync.FreePort(t),
		pub: "tcp://" + testsync.FreePort(t), ack: "tcp://" + testsync.FreePort(t), sink: filepath.Join(dir, "sink.db"), pollURL: pollURL, failKeys: failKeys,
		daemonLog: filepath.Join(dir, "daemon.log"), procLog: filepath.Join(dir, "processor.log"), venv: v}
	e.writeConfig("")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s\nprocessor log:\n%s", lastLines(readFile(t, e.daemonLog), 30), lastLines(readFile(t, e.procLog), 30))
		}
	})
	return e
}

// writeConfig writes the daemon's config, with publishExtra as more
// publish keys.
func (e *env) writeConfig(publishExtra string) {
	testconfig.Daemon{
		Dir: e.dir, HTTPAddr: e.httpAddr, ShutdownGrace: "5s", Publish: e.pub, Ack: e.ack,
		PublishKeys: "ack_timeout = \"1s\"\nevents_per_frame = 10\n" + publishExtra,
		Rest: fmt.Sprintf(`[source.seq]
kind = "http_poll"
poll_url = %q
interval = "30ms"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
`, e.pollURL),
	}.Write(e.t, e.cfg)
}

// enableCurve makes key pairs with `ingestor curve-keygen` and has the
// daemon require CURVE and the processor use it.
func (e *env) enableCurve() {
	for _, name := range []string{"daemon", "processor"} {
		if out, err := exec.Command(e.bin, "curve-keygen", filepath.Join(e.dir, name)).CombinedOutput(); err != nil {
			e.t.Fatalf("curve-keygen %s: %v\n%s", name, err, out)
		}
	}
	e.writeConfig(fmt.Sprintf("curve_secret_key_file = %q\ncurve_authorized_keys_file = %q",
		filepath.Join(e.dir, "daemon.key"), filepath.Join(e.dir, "processor.pub")))
	e.procArgs = []string{"--curve-server-key", filepath.Join(e.dir, "daemon.pub"),
		"--curve-secret-key", filepath.Join(e.dir, "processor.key")}
}

// logFile opens path for appending a child's output.
func (e *env) logFile(path string) *os.File {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = f.Close() })
	return f
}

// startDaemon starts the daemon and waits until it is ready.
func (e *env) startDaemon() *exec.Cmd {
	cmd := exec.Command(e.bin, "run", "-c", e.cfg)
	cmd.Stderr = e.logFile(e.daemonLog)
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { kill(cmd) })
	e.waitUntil("the daemon to be ready", 30*time.Second, func() bool {
		resp, err := http.Get("http://" + e.httpAddr + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return cmd
}

// startProcessor starts the Python example processor, the installed
// console script.
func (e *env) startProcessor() *exec.Cmd {
	args := append([]string{"--connect", e.pub, "--ack", e.ack, "--sqlite", e.sink}, e.procArgs...)
	if e.failKeys != "" {
		args = append(args, "--fail-keys", e.failKeys)
	}
	cmd := exec.Command(e.venv.script, args...)
	cmd.Dir, cmd.Env = e.dir, pythonEnv()
	out := e.logFile(e.procLog)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { kill(cmd) })
	return cmd
}

// kill SIGKILLs cmd, if it still runs, and reaps it.
func kill(cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL) // it may have exited already
	_ = cmd.Wait()                          // killed: its status is the signal
}

// stop SIGTERMs cmd and checks it exits cleanly.
func (e *env) stop(cmd *exec.Cmd, name string) {
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		e.t.Fatalf("SIGTERM the %s: %v", name, err)
	}
	if err := cmd.Wait(); err != nil {
		e.t.Errorf("graceful stop of the %s: %v", name, err)
	}
}

// waitDone waits until the processor's table holds want events and the
// daemon has no event pending.
func (e *env) waitDone(want int) {
	e.waitUntil(fmt.Sprintf("%d events in the processor's table and none pending", want), 2*time.Minute, func() bool {
		return sinkCount(e.t, e.sink) >= want && pendingEvents(e.httpAddr) == 0
	})
}

// waitUntil polls cond until it holds, failing the test after timeout.
func (e *env) waitUntil(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	testsync.WaitFor(e.t, what, timeout, cond)
}

// checkSink checks that the processor's table holds every upstream event
// but the poison ones, once each, each with its processed key, and that
// the processor reported no double application.
func (e *env) checkSink(total int, poison []string) {
	t := e.t
	db, err := sql.Open("sqlite3", "file:"+e.sink+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	got := map[string]int{}
	rows, err := db.Query(`SELECT key FROM events WHERE source = 'seq'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		got[k]++
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	skip := map[string]bool{}
	for _, k := range poison {
		skip[k] = true
	}
	for n := 1; n <= total; n++ {
		id := testupstream.ID(n)
		if want := map[bool]int{true: 0, false: 1}[skip[id]]; got[id] != want {
			t.Errorf("event %s is in the processor's table %d times, want %d", id, got[id], want)
		}
	}
	var rowCount, processed int
	if err := db.QueryRow(`SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM processed)`).Scan(&rowCount, &processed); err != nil {
		t.Fatal(err)
	}
	if want := total - len(poison); rowCount != want || processed != want {
		t.Errorf("the table holds %d events and %d processed keys, want %d of each", rowCount, processed, want)
	}
	if logs := readFile(t, e.procLog); strings.Contains(logs, "BUG") || !strings.Contains(logs, "double applications 0") {
		t.Errorf("the processor reported a double application or no summary:\n%s", lastLines(logs, 20))
	}
}

// sinkCount returns the rows of the processor's table, 0 before it exists.
func sinkCount(t *testing.T, path string) int {
	if _, err := os.Stat(path); err != nil {
		return 0
	}
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM events`).Scan(&n); err != nil {
		return 0 // the table is not created yet
	}
	return n
}

// pendingEvents reads ingestor_queue_pending_events from /metrics (-1 if
// unavailable).
func pendingEvents(addr string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "ingestor_queue_pending_events "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}

func readFile(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// failedUnitTests returns unittest's "ERROR: test (module.Class)" and
// "FAIL: ..." headers in out, each with the last line of its traceback
// (the exception).
func failedUnitTests(out string) []string {
	var failed []string
	blocks := strings.Split(out, "\n======================================================================\n")
	for _, b := range blocks[1:] {
		head, rest, _ := strings.Cut(b, "\n")
		if !strings.HasPrefix(head, "ERROR: ") && !strings.HasPrefix(head, "FAIL: ") {
			continue
		}
		rest, _, _ = strings.Cut(rest, "\n----------------------------------------------------------------------\nRan ")
		failed = append(failed, head+": "+lastLines(rest, 1))
	}
	return failed
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
