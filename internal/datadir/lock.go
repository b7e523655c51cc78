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
func Lock(dir string) (unlock func() error, err error) {
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
