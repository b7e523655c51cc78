package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenReplacesAStaleSocketAndRefusesALiveOne listens where a dead
// process left its socket file, checks the mode, and then that a second
// listener on a live socket is refused.
func TestListenReplacesAStaleSocketAndRefusesALiveOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false) // as a process killed with -9 leaves it
	if err := stale.Close(); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(path)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	defer func() {
		if err := ln.Close(); err != nil {
			t.Error(err)
		}
	}()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept() // the probe of the second Listen
		if err == nil {
			err = c.Close()
		}
		accepted <- err
	}()
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("second listen on a live socket: %v, want in use", err)
	}
	if err := <-accepted; err != nil {
		t.Errorf("accept the probe: %v", err)
	}
}
