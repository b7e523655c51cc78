package diskspace

import (
	_ "github.com/mattn/go-sqlite3" // SQLite for the SQLITE_FULL case

	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestIsFullOnRealErrors checks IsFull against the errors a full disk
// really gives: a write to /dev/full (ENOSPC, wrapped as the raw store
// wraps it) and an insert into a SQLite database at its max_page_count
// (SQLITE_FULL, wrapped as the queue wraps it); other errors are not.
func TestIsFullOnRealErrors(t *testing.T) {
	f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, werr := f.Write([]byte("x"))
	if !IsFull(fmt.Errorf("raw store: append a page: %w", werr)) {
		t.Errorf("a write to /dev/full (%v) is not seen as full", werr)
	}

	db, err := sql.Open("sqlite3", filepath.Join(t.TempDir(), "q.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var serr error
	for _, q := range []string{"PRAGMA max_page_count = 4", "CREATE TABLE t (b BLOB)"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for i := 0; serr == nil && i < 100; i++ {
		_, serr = db.Exec("INSERT INTO t VALUES (randomblob(4000))")
	}
	if serr == nil || !IsFull(fmt.Errorf("commit: %w", serr)) {
		t.Errorf("SQLite at max_page_count gave %v, not seen as full", serr)
	}

	_, nerr := os.Open(filepath.Join(t.TempDir(), "missing"))
	for _, e := range []error{nil, nerr, errors.New("no space left on device"), syscall.EIO} {
		if IsFull(e) {
			t.Errorf("IsFull(%v) = true", e)
		}
	}
}

// fakeDisks stands in for statfs: the free bytes of each path, set by
// the test. Only the transitions are faked; TestDaemonDiskFull in
// internal/daemon fills a real tmpfs.
type fakeDisks struct {
	mu   sync.Mutex
	free map[string]int64
}

func (f *fakeDisks) set(path string, free int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.free[path] = free
}

func (f *fakeDisks) statfs(path string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.free[path]
	if !ok {
		return 0, fmt.Errorf("no such disk %s", path)
	}
	return v, nil
}

func TestGuardWatermarkAndFailures(t *testing.T) {
	disks := &fakeDisks{free: map[string]int64{"/data": 1 << 30, "/raw": 1 << 30}}
	logs := &testsync.LockedBuffer{}
	reg := prometheus.NewRegistry()
	g, err := New(Options{Paths: []string{"/raw", "/data", "/data"}, MinFree: 100 << 20, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), statfs: disks.statfs})
	if err != nil {
		t.Fatal(err)
	}
	low := func() bool {
		_, l := g.Low()
		return l
	}
	if low() || testutil.ToFloat64(g.low) != 0 {
		t.Fatal("low with 1 GiB free on both disks")
	}

	// Below the watermark on one disk: low, naming it.
	disks.set("/raw", 99<<20)
	g.Check()
	if why, l := g.Low(); !l || !strings.Contains(why, "/raw has 103809024 bytes free, below daemon.min_free_bytes 104857600") {
		t.Fatalf("Low() = %q, %v with /raw below the watermark", why, l)
	}
	if testutil.ToFloat64(g.low) != 1 || testutil.ToFloat64(g.freeBytes.WithLabelValues("/raw")) != 99<<20 {
		t.Error("metrics do not show the low disk")
	}
	g.Check() // no change: no second log line
	disks.set("/raw", 100<<20)
	g.Check()
	if low() {
		t.Fatal("still low at the watermark")
	}
	if n := strings.Count(logs.String(), "disk space low"); n != 1 {
		t.Errorf("logged the low disk %d times, want once:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "disk space is back") {
		t.Errorf("the recovery is not logged:\n%s", logs)
	}

	// A disk whose statfs fails keeps its last reading.
	delete(disks.free, "/raw")
	g.Check()
	if low() || g.State().Free["/raw"] != 100<<20 {
		t.Errorf("a failed statfs changed the state: %+v", g.State())
	}
}

// TestGuardAfterAFailedWrite: without a watermark, a write that failed
// for lack of space makes the guard low until every disk has
// ResumeAfterFull free; other errors do nothing.
func TestGuardAfterAFailedWrite(t *testing.T) {
	disks := &fakeDisks{free: map[string]int64{"/data": 10 << 20, "/raw": 10 << 20}}
	g, err := New(Options{Paths: []string{"/raw", "/data"}, MinFree: 0, Registerer: prometheus.NewRegistry(), statfs: disks.statfs})
	if err != nil {
		t.Fatal(err)
	}
	low := func() bool {
		_, l := g.Low()
		return l
	}
	if low() {
		t.Fatal("low without a watermark or a failed write")
	}
	if g.Failed(errors.New("some other failure")) || g.Failed(nil) || low() {
		t.Fatal("an error that is not a full disk made the guard low")
	}
	if !g.Failed(fmt.Errorf("append: %w", syscall.ENOSPC)) || !low() {
		t.Fatal("ENOSPC did not make the guard low")
	}
	if why, _ := g.Low(); !strings.Contains(why, "a write failed for lack of space") || !strings.Contains(why, "no space left on device") {
		t.Errorf("reason after ENOSPC: %q", why)
	}
	disks.set("/raw", ResumeAfterFull)
	disks.set("/data", ResumeAfterFull-1)
	g.Check()
	if !low() {
		t.Fatal("resumed with /data below ResumeAfterFull after a failed write")
	}
	disks.set("/data", ResumeAfterFull)
	g.Check()
	if low() {
		t.Fatal("still low with ResumeAfterFull free on both disks")
	}
	if got := testutil.ToFloat64(g.failures); got != 1 {
		t.Errorf("ingestor_disk_full_errors_total = %v, want 1", got)
	}
	// With room on every disk (the space came back meanwhile), a failed
	// write does not pause anything.
	if !g.Failed(syscall.EDQUOT) || low() {
		t.Fatal("a quota error with ResumeAfterFull free on every disk made the guard low")
	}
}

// TestGuardWatchesAPathNotMadeYet: a spill dir that does not exist yet is
// read through its parent.
func TestGuardWatchesAPathNotMadeYet(t *testing.T) {
	dir := t.TempDir()
	g, err := New(Options{Paths: []string{filepath.Join(dir, "spill", "later")}})
	if err != nil {
		t.Fatal(err)
	}
	if free := g.State().Free[filepath.Join(dir, "spill", "later")]; free <= 0 {
		t.Errorf("free bytes of a path not made yet: %d", free)
	}
}

// TestGuardOnAFileSystemWithoutSize: a file system that reports no size
// (some FUSE file systems: zero blocks) is not judged by the
// watermark, which it would always fail; a write that fails there for
// lack of space pauses work for UnsizedRetry, then it tries again.
func TestGuardOnAFileSystemWithoutSize(t *testing.T) {
	disks := &fakeDisks{free: map[string]int64{"/fuse": unknownFree, "/data": 1 << 30}}
	logs := &testsync.LockedBuffer{}
	g, err := New(Options{Paths: []string{"/fuse", "/data"}, MinFree: 256 << 20, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(logs, nil)), statfs: disks.statfs})
	if err != nil {
		t.Fatal(err)
	}
	if why, low := g.Low(); low {
		t.Fatalf("low on a file system without a size: %s", why)
	}
	g.Check()
	if n := strings.Count(logs.String(), "reports no size"); n != 1 {
		t.Errorf("the file system without a size was logged %d times, want once:\n%s", n, logs)
	}
	if !g.Failed(syscall.ENOSPC) {
		t.Fatal("ENOSPC not seen as full")
	}
	g.Check()
	if _, low := g.Low(); !low {
		t.Fatal("resumed at once after ENOSPC on a file system that cannot show space came back")
	}
	g.mu.Lock()
	g.fullAt = g.fullAt.Add(-UnsizedRetry)
	g.mu.Unlock()
	g.Check()
	if why, low := g.Low(); low {
		t.Fatalf("still low UnsizedRetry after the failure: %s", why)
	}
}
