package datadir

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// InUseError reports that another process holds a data dir's lock: a
// running daemon, a replay or an offline dlq command.
type InUseError struct {
	// Dir is the data dir.
	Dir string
	// PID is the holder's process id as it wrote it in the lock file, or 0
	// when the file holds none.
	PID int
}

func (e *InUseError) Error() string {
	pid := "unknown"
	if e.PID > 0 {
		pid = strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("data dir %s is in use by another ingestor (pid %s)", e.Dir, pid)
}

// Lock takes the exclusive lock on dir (which must exist): a flock on
// dir/LOCK, which holds the holder's pid. It fails at once with an
// *InUseError when another process holds it. The kernel drops the
// lock when the process exits, even on kill -9, so a stale LOCK file never
// blocks a start. unlock releases it.
//
// A dir this process may not write in is refused before anything in it is
// touched, the LOCK file's pid included.
func Lock(dir string) (unlock func() error, err error) {
	if err := writable(dir); err != nil {
		return nil, err
	}
	p := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock data dir %s: %w", dir, err)
	}
	if err := flock(f); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errors.Join(&InUseError{Dir: dir, PID: readPID(f)}, f.Close())
		}
		return nil, fmt.Errorf("lock data dir %s: %w", dir, errors.Join(err, f.Close()))
	}
	if err := writePID(f); err != nil {
		return nil, fmt.Errorf("lock data dir %s: write pid: %w", dir, errors.Join(err, f.Close()))
	}
	return func() error {
		if err := f.Close(); err != nil { // closing the only descriptor drops the flock
			return fmt.Errorf("unlock data dir %s: %w", dir, err)
		}
		return nil
	}, nil
}

// flock takes an exclusive, non-blocking flock on f, retrying when a
// signal interrupts the call.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// readPID returns the pid written in the lock file, or 0.
func readPID(f *os.File) int {
	b := make([]byte, 32)
	n, err := f.ReadAt(b, 0)
	if n == 0 && err != nil {
		return 0
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:n])))
	if err != nil {
		return 0
	}
	return pid
}

// writePID replaces the lock file's contents with this process's pid.
func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

// writable checks that this process may create and change files in dir,
// and says whose dir it is when it may not. Other failures of the check
// are left to Lock's open of the LOCK file to report.
func writable(dir string) error {
	err := syscall.Access(dir, wOK|xOK)
	if !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EPERM) {
		return nil // a missing dir, say: opening LOCK reports it
	}
	owner := ""
	if fi, serr := os.Stat(dir); serr == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			owner = fmt.Sprintf(", owned by uid %d with mode %o", st.Uid, fi.Mode().Perm())
		}
	}
	return fmt.Errorf("data dir %s is not writable by this process (uid %d%s): %w: "+
		"run ingestor as the dir's owner, or give the dir to the daemon's user (chown, chmod u+rwx)",
		dir, os.Geteuid(), owner, err)
}

// wOK and xOK are access(2)'s W_OK and X_OK.
const (
	wOK = 2
	xOK = 1
)
