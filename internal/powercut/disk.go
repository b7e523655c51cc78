package powercut

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Disk is a power-cut FS mounted for one test over a fresh temporary
// directory, served by the powercutfs command in a process of its own
// (serving FUSE from the test's process can deadlock the Go runtime
// against the test's own use of the mount), and unmounted when the test
// ends.
type Disk struct {
	// Dir is the mount point: what the program under test uses.
	Dir string

	t       testing.TB
	backing string // what a power cut leaves
	state   string
	server  *exec.Cmd
	stdin   io.WriteCloser
	answers chan string
}

// answerTimeout bounds the wait for the server to mount, cut or unmount.
const answerTimeout = 60 * time.Second

// NewDisk mounts a power-cut FS over a fresh empty directory. It fails the
// test when the FS cannot be mounted (no /dev/fuse, no fusermount3 and not
// root): a power-loss test that skipped would hide what it guards. `make
// test-deps` installs Debian's fuse3.
func NewDisk(t testing.TB) *Disk {
	t.Helper()
	dir := t.TempDir()
	d := &Disk{
		Dir:     filepath.Join(dir, "mnt"),
		t:       t,
		backing: filepath.Join(dir, "backing"),
		state:   filepath.Join(dir, "state"),
	}
	for _, p := range []string{d.Dir, d.backing} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatalf("powercut: %v", err)
		}
	}
	d.mount()
	t.Cleanup(func() {
		if d.server != nil {
			d.unmount()
		}
	})
	return d
}

// Backing is the directory the FS passes operations through to, which a
// power cut leaves holding what was durable. Read it only while nothing
// writes under Dir.
func (d *Disk) Backing() string { return d.backing }

// PowerCut cuts the power, calls kill, unmounts the FS and mounts it
// again, as a machine that lost power and booted: files read back what
// was durable at the cut. Freeze every process that writes under Dir
// first (SIGSTOP) and make kill end every process that has files open
// under Dir, or the unmount fails.
func (d *Disk) PowerCut(kill func()) {
	d.t.Helper()
	d.command("cut", "cut")
	kill()
	d.unmount()
	d.mount()
}

// Reboot unmounts the FS cleanly (everything written so far stays, as a
// clean shutdown writes it out) and mounts it again.
func (d *Disk) Reboot() {
	d.t.Helper()
	d.unmount()
	d.mount()
}

// mount starts the server and waits until the FS is mounted.
func (d *Disk) mount() {
	d.t.Helper()
	bin, err := serverBinary()
	if err != nil {
		d.t.Fatalf("powercut: %v", err)
	}
	cmd := exec.Command(bin, "-mount", d.Dir, "-backing", d.backing, "-state", d.state)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if d.stdin, err = cmd.StdinPipe(); err != nil {
		d.t.Fatalf("powercut: %v", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		d.t.Fatalf("powercut: %v", err)
	}
	if err := cmd.Start(); err != nil {
		d.t.Fatalf("powercut: %v", err)
	}
	d.server = cmd
	d.answers = make(chan string, 1)
	go func(answers chan<- string) {
		lines := bufio.NewScanner(out)
		for lines.Scan() {
			answers <- lines.Text()
		}
		close(answers)
	}(d.answers)
	d.await("mounted")
}

// unmount asks the server to unmount and waits for it to exit.
func (d *Disk) unmount() {
	d.t.Helper()
	d.command("unmount", "unmounted")
	err := d.server.Wait()
	d.server = nil
	if err != nil {
		d.t.Fatalf("powercut: the server exited with %v after unmounting", err)
	}
}

// command sends cmd to the server and waits for the answer want.
func (d *Disk) command(cmd, want string) {
	d.t.Helper()
	if _, err := fmt.Fprintln(d.stdin, cmd); err != nil {
		d.t.Fatalf("powercut: %s: %v", cmd, err)
	}
	d.await(want)
}

// await waits for the server's next answer, which must be want.
func (d *Disk) await(want string) {
	d.t.Helper()
	select {
	case got, ok := <-d.answers:
		if !ok {
			d.t.Fatalf("powercut: the server exited before answering %q", want)
		}
		if got != want {
			d.t.Fatalf("powercut: the server answered %q, want %q (make test-deps installs fuse3; the FS needs /dev/fuse)", got, want)
		}
	case <-time.After(answerTimeout):
		d.t.Fatalf("powercut: no %q from the server within %v", want, answerTimeout)
	}
}

var build struct {
	once sync.Once
	bin  string
	err  error
}

// serverBinary builds the powercutfs command once per test process, into
// the bin directory of the module (ignored by git; `go build` reuses its
// cache, so a build of unchanged code only links), under a lock against
// the test processes of other packages building it at the same time.
func serverBinary() (string, error) {
	build.once.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			build.err = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		gomod := strings.TrimSpace(string(out))
		if gomod == "" || gomod == os.DevNull {
			build.err = fmt.Errorf("not in the ingestor module: cannot build powercutfs")
			return
		}
		dir := filepath.Join(filepath.Dir(gomod), "bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			build.err = err
			return
		}
		lock, err := os.OpenFile(filepath.Join(dir, ".powercutfs.lock"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			build.err = err
			return
		}
		defer func() { _ = lock.Close() }() // closing drops the lock
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			build.err = err
			return
		}
		bin := filepath.Join(dir, "powercutfs")
		cmd := exec.Command("go", "build", "-o", bin, "./internal/powercut/powercutfs")
		cmd.Dir = filepath.Dir(gomod)
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build powercutfs: %v\n%s", err, out)
			return
		}
		build.bin = bin
	})
	return build.bin, build.err
}
