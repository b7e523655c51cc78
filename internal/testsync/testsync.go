// Package testsync holds what tests share to wait for a condition and to
// watch goroutines and processes: WaitFor polls a condition with a deadline
// instead of sleeping a guess, LockedBuffer collects output written from
// other goroutines, FreePort finds a loopback port to bind, StartProcess
// runs a server binary that dies with the test, Python3 finds
// the interpreter with pyzmq for the Python processor tests, and NewPKI
// makes a CA with server and client certificates for TLS tests, and
// MountTmpfs gives a test a small file system to fill.
package testsync

import (
	"bytes"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// pollInterval is how often WaitFor checks its condition.
const pollInterval = 5 * time.Millisecond

// WaitFor polls cond until it holds, failing t with what it waited for
// when timeout passes first.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pollInterval)
	}
}

// LockedBuffer is a bytes.Buffer that one goroutine may write (a logger,
// exec's output copier) while another reads it. The zero value is ready.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// FreePort returns a loopback address, "127.0.0.1:PORT", whose port was
// free a moment ago and that no earlier call in this process returned: the
// kernel may hand out a port it just freed again, and a harness asking for
// two endpoints must not get the same one twice. The port is taken below
// the kernel's ephemeral range where there is room, so that the outgoing
// connections and ":0" listeners of tests running in parallel (other
// packages' processes) cannot take it before the caller binds it. Another
// FreePort in another process still may, rarely; a caller that cannot bind
// should retry with a new one.
func FreePort(t testing.TB) string {
	t.Helper()
	low := ephemeralLow()
	for {
		want := "127.0.0.1:0"
		if low-firstFixedPort >= 1000 {
			want = "127.0.0.1:" + strconv.Itoa(firstFixedPort+rand.IntN(low-firstFixedPort))
		}
		ln, err := net.Listen("tcp", want)
		if err != nil {
			if want != "127.0.0.1:0" {
				continue // taken: try another
			}
			t.Fatalf("find a free port: %v", err)
		}
		addr := ln.Addr().String()
		if err := ln.Close(); err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		handedOut.Lock()
		fresh := !handedOut.ports[addr]
		if fresh {
			handedOut.ports[addr] = true
		}
		handedOut.Unlock()
		if fresh {
			return addr
		}
	}
}

// firstFixedPort is the lowest port FreePort hands out below the ephemeral
// range, above the ports services usually claim.
const firstFixedPort = 20000

// ephemeralLow is the first port of the kernel's ephemeral range, or 0
// when it cannot be read (FreePort then asks the kernel for any port).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return n
}

// handedOut holds every address FreePort returned in this process.
var handedOut = struct {
	sync.Mutex
	ports map[string]bool
}{ports: make(map[string]bool)}
