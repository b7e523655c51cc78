package testsync

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	var mu sync.Mutex
	done := false
	go func() {
		mu.Lock()
		defer mu.Unlock()
		done = true
	}()
	polls := 0
	WaitFor(t, "the goroutine", 10*time.Second, func() bool {
		polls++
		mu.Lock()
		defer mu.Unlock()
		return done
	})
	if polls == 0 {
		t.Fatal("the condition was never checked")
	}
}

// recorder is a testing.TB that records Fatalf instead of stopping the
// test, so that WaitFor's timeout can be observed.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}

func TestWaitForFailsAfterTheTimeout(t *testing.T) {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != r {
				t.Fatalf("WaitFor returned instead of failing (recovered %v)", p)
			}
		}()
		WaitFor(r, "nothing", 20*time.Millisecond, func() bool { return false })
	}()
	if want := "timed out after 20ms waiting for nothing"; r.failed != want {
		t.Errorf("failure %q, want %q", r.failed, want)
	}
}

func TestLockedBufferUnderConcurrentWrites(t *testing.T) {
	var b LockedBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if _, err := b.Write([]byte("x")); err != nil {
					t.Error(err)
				}
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 800 {
		t.Errorf("%d bytes written, want 800", n)
	}
}

func TestFreePortCanBeBound(t *testing.T) {
	addr := FreePort(t)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("bind %s: %v", addr, err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFreePortNeverRepeats pins the CI failure of
// TestBodyCursorCatchUpThroughTheDaemon: a harness asks FreePort for the
// event and the ack endpoints one after the other, and the kernel may hand
// out the port it just freed again, so both endpoints were the same and the
// config was refused. Within one process FreePort must never return a port
// twice.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := make(map[string]bool)
	low := ephemeralLow()
	for range 3000 {
		addr := FreePort(t)
		if seen[addr] {
			t.Fatalf("FreePort returned %s twice", addr)
		}
		seen[addr] = true
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := strconv.Atoi(port); low-firstFixedPort >= 1000 && (n < firstFixedPort || n >= low) {
			t.Fatalf("FreePort returned %s, want a port in [%d, %d) below the ephemeral range", addr, firstFixedPort, low)
		}
	}
}
