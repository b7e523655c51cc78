package datadir

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestLock(t *testing.T) {
	dir := t.TempDir()
	unlock, err := Lock(dir)
	if err != nil {
		t.Fatalf("first lock: %v", err)
	}
	// flock locks belong to an open file, so a second lock in the same
	// process conflicts just as another process's would.
	_, err = Lock(dir)
	want := fmt.Sprintf("data dir %s is in use by another ingestor (pid %d)", dir, os.Getpid())
	if err == nil || err.Error() != want {
		t.Fatalf("second lock: %v, want %q", err, want)
	}
	var inUse *InUseError
	if !errors.As(err, &inUse) || inUse.PID != os.Getpid() {
		t.Fatalf("second lock: %#v, want an *InUseError with this pid", err)
	}
	if err := unlock(); err != nil {
		t.Fatalf("unlock: %v", err)
	}
	// The LOCK file stays; the lock itself is gone.
	unlock, err = Lock(dir)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	if err := unlock(); err != nil {
		t.Fatalf("unlock: %v", err)
	}
}

// TestLockMissingDir checks that a data dir that does not exist is an
// error naming it, not an *InUseError.
func TestLockMissingDir(t *testing.T) {
	dir := t.TempDir() + "/missing"
	_, err := Lock(dir)
	var inUse *InUseError
	if err == nil || errors.As(err, &inUse) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lock %s: %v, want a not-exist error", dir, err)
	}
	if want := "lock data dir " + dir + ": "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q does not start with %q", err, want)
	}
}
