package testsync

import (
	"fmt"
	"syscall"
	"testing"
)

// Tmpfs is a tmpfs mounted for one test, for the disk-full tests.
type Tmpfs struct {
	// Dir is where it is mounted.
	Dir string
	t   testing.TB
}

// MountTmpfs mounts a tmpfs of size bytes on a new directory and
// unmounts it when the test ends; register it before what writes into
// it (a daemon), so that its cleanup runs after theirs. It needs root,
// which make test and CI have; elsewhere it fails rather than skip, so
// that the disk-full path is never silently untested.
func MountTmpfs(t testing.TB, size int64) *Tmpfs {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0750", size)); err != nil {
		t.Fatalf("mount a %d-byte tmpfs on %s (the disk-full tests need root, as make test runs): %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return &Tmpfs{Dir: dir, t: t}
}

// Resize grows (or shrinks) the tmpfs in place, as mount -o remount,size=
// does.
func (m *Tmpfs) Resize(size int64) {
	m.t.Helper()
	if err := syscall.Mount("tmpfs", m.Dir, "tmpfs", syscall.MS_REMOUNT, fmt.Sprintf("size=%d", size)); err != nil {
		m.t.Fatalf("resize the tmpfs on %s to %d bytes: %v", m.Dir, size, err)
	}
}
