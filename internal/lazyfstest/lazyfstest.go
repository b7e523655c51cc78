// Package lazyfstest mounts LazyFS (https://github.com/dsrhaslab/lazyfs)
// for tests that cut the power under a program: a FUSE file system that
// keeps every write in its own page cache until the file is fsynced, and
// drops whatever is not fsynced yet when told to. Creating, renaming and
// removing files pass through to the backing directory at once; only file
// contents (and the size they give a file) wait for fsync.
//
// `make test` builds LazyFS from the source vendored in internal/lazyfstest/lazyfs
// into the project's .tools directory and points $LAZYFS at it; by hand,
// `make test-deps`. It needs /dev/fuse and the right to mount (root, or
// fusermount3). Without the binary, Mount fails the test: a power-loss test
// that skipped would hide what it guards.
package lazyfstest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// Commit is the LazyFS commit vendored in internal/lazyfstest/lazyfs; the
// Makefile's LAZYFS_COMMIT builds the same one.
const Commit = "a47a5baea559020f29902662de77764b0cbd62ce"

// installHint tells how to get the binary.
const installHint = "run make test-deps, which builds it into .tools/lazyfs-" + Commit + " (or set $LAZYFS to its path)"

// powerCutTimeout bounds the wait for LazyFS to report its cache cleared.
const powerCutTimeout = 30 * time.Second

// FS is a mounted LazyFS. Files written under Dir stay in LazyFS's memory
// until fsynced; PowerCut drops what is not.
type FS struct {
	// Dir is the mount point.
	Dir string

	t       testing.TB
	bin     string
	dir     string // holds the config, the fifos, the mount point and root
	root    string // the backing directory: what a power cut leaves
	config  string
	faults  string   // the fifo LazyFS reads commands from
	done    *os.File // the fifo LazyFS reports finished commands on
	doneBuf *bufio.Reader
	svc     *testsync.Service
}

// Mount mounts a LazyFS over a fresh empty directory, waits until it is
// mounted, and registers a cleanup that unmounts it.
func Mount(t testing.TB) *FS {
	t.Helper()
	bin, err := findBinary()
	if err != nil {
		t.Fatalf("lazyfstest: %v; %s", err, installHint)
	}
	dir := t.TempDir()
	f := &FS{
		Dir:    filepath.Join(dir, "mnt"),
		t:      t,
		bin:    bin,
		dir:    dir,
		root:   filepath.Join(dir, "root"),
		config: filepath.Join(dir, "lazyfs.toml"),
		faults: filepath.Join(dir, "faults.fifo"),
	}
	for _, d := range []string{f.Dir, f.root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatalf("lazyfstest: %v", err)
		}
	}
	done := filepath.Join(dir, "done.fifo")
	for _, p := range []string{f.faults, done} {
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatalf("lazyfstest: mkfifo %s: %v", p, err)
		}
	}
	// LazyFS opens the completion fifo for writing when it starts, which
	// blocks until a reader has it open: the test holds it open, read and
	// write, for the FS's lifetime.
	if f.done, err = os.OpenFile(done, os.O_RDWR, 0); err != nil {
		t.Fatalf("lazyfstest: %v", err)
	}
	f.doneBuf = bufio.NewReader(f.done)
	// The cache holds every unsynced write of a mount's lifetime without
	// eviction (which would write pages out, and make them survive a power
	// cut); LazyFS allocates it whole at start.
	config := fmt.Sprintf(`[faults]
fifo_path = %q
fifo_path_completed = %q
[cache]
apply_eviction = false
[cache.simple]
custom_size = "128mb"
blocks_per_page = 1
[filesystem]
log_all_operations = false
logfile = ""
`, f.faults, done)
	if err := os.WriteFile(f.config, []byte(config), 0o600); err != nil {
		t.Fatalf("lazyfstest: %v", err)
	}
	f.svc = testsync.NewService(t, "lazyfstest: "+bin, f.launch, f.mounted)
	t.Cleanup(func() {
		f.svc.Stop()
		if err := f.done.Close(); err != nil {
			t.Errorf("lazyfstest: %v", err)
		}
	})
	if err := f.svc.Start(); err != nil {
		t.Fatalf("%v", err)
	}
	return f
}

// PowerCut drops every write LazyFS holds that was not fsynced, calls
// kill, then unmounts LazyFS and mounts it again, as a machine that lost
// power and booted: files read back what was fsynced before the cut. Stop
// every process that writes under Dir before the cut (SIGSTOP), or its
// writes after the drop would survive; kill must end every process that
// has files open under Dir, or the unmount fails.
func (f *FS) PowerCut(kill func()) {
	f.t.Helper()
	if err := f.command("lazyfs::clear-cache", "finished::clear-cache"); err != nil {
		f.t.Fatalf("lazyfstest: power cut: %v", err)
	}
	kill()
	f.svc.Stop()
	if f.mounted() == nil {
		f.t.Fatalf("lazyfstest: %s is still mounted after LazyFS stopped: does a process still have files open under it?", f.Dir)
	}
	if err := f.svc.Start(); err != nil {
		f.t.Fatalf("%v", err)
	}
}

// command writes cmd to LazyFS's fifo and waits for it to report want on
// the completion fifo.
func (f *FS) command(cmd, want string) error {
	w, err := os.OpenFile(f.faults, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := w.WriteString(cmd + "\n"); err != nil {
		return errors.Join(fmt.Errorf("send %s: %w", cmd, err), w.Close())
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := f.done.SetReadDeadline(time.Now().Add(powerCutTimeout)); err != nil {
		return err
	}
	line, err := f.doneBuf.ReadString('\n')
	if err != nil {
		return fmt.Errorf("wait for %s: %w", want, err)
	}
	if got := strings.TrimSpace(line); got != want {
		return fmt.Errorf("LazyFS answered %q to %s, want %q", got, cmd, want)
	}
	return nil
}

// launch starts LazyFS in the foreground on f.Dir, over f.root, through
// prlimit with core dumps off: LazyFS aborts as it exits after an unmount
// (its fault thread is never joined), and where core dumps are on each
// remount would write one the size of its cache.
func (f *FS) launch() (*testsync.Process, error) {
	cmd := exec.Command("prlimit", "--core=0", "--", f.bin, f.Dir, "--config-path", f.config, "-o", "modules=subdir", "-o", "subdir="+f.root, "-f")
	cmd.Dir = f.dir
	return testsync.StartProcess(cmd)
}

// mounted reports whether a LazyFS is mounted on f.Dir.
func (f *FS) mounted() error {
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(info), "\n") {
		// Fields: id parent major:minor root mountpoint options ... - fstype source superoptions.
		fields := strings.Fields(line)
		sep := -1
		for i, fl := range fields {
			if fl == "-" {
				sep = i
				break
			}
		}
		if len(fields) > 4 && sep > 0 && sep+1 < len(fields) && fields[4] == f.Dir && fields[sep+1] == "fuse.lazyfs" {
			return nil
		}
	}
	return fmt.Errorf("%s is not mounted", f.Dir)
}

// findBinary looks for LazyFS in $LAZYFS, then in the project's .tools
// directory where make test-deps builds it.
func findBinary() (string, error) {
	if p := os.Getenv("LAZYFS"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$LAZYFS: %w", err)
		}
		return p, nil
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not in the ingestor module, and $LAZYFS is not set")
	}
	p := filepath.Join(filepath.Dir(gomod), ".tools", "lazyfs-"+Commit, "lazyfs")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("LazyFS not found in $LAZYFS or %s", p)
	}
	return p, nil
}
