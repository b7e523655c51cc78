package httpstop

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve starts srv on a loopback port and returns its address and a
// channel that receives Serve's result.
func serve(t *testing.T, h http.Handler) (*http.Server, *Conns, string, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	c := Track(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return srv, c, ln.Addr().String(), served
}

// silent opens a connection to addr that sends nothing, once the server
// has accepted it (accepts are in order: a request on another connection
// answered after it).
func silent(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	resp, err := http.Get("http://" + addr + "/quick")
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestShutdownWaitsForTheRequestNotTheSilentConnection: a request under
// way when the stop begins gets its answer; a connection that sent
// nothing is closed as soon as no request runs, not after net/http's
// 5 s, and the stop is no failure.
func TestShutdownWaitsForTheRequestNotTheSilentConnection(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/quick", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		_, _ = io.WriteString(w, "answered")
	})
	srv, c, addr, _ := serve(t, mux)
	conn := silent(t, addr)
	answer := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/slow")
		if err != nil {
			answer <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		answer <- string(b)
	}()
	<-entered
	stopped := make(chan error, 1)
	start := time.Now()
	go func() { stopped <- Shutdown(context.Background(), srv, c) }()
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned %v while a request ran", err)
	case <-time.After(100 * time.Millisecond): // it waits: nothing can end it but the release
	}
	close(release)
	if got := <-answer; got != "answered" {
		t.Errorf("the request under way got %q", got)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("Shutdown took %v: it waited for the silent connection", took)
	}
	// The silent connection is closed: a read sees the end.
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("read on the silent connection after the stop: %v, want EOF", err)
	}
}

// TestShutdownCutShortFails: a request still running when the stop's
// context ends is cut, and the stop says so.
func TestShutdownCutShortFails(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(http.ResponseWriter, *http.Request) {
		close(entered)
		<-release
	})
	srv, c, addr, _ := serve(t, mux)
	go func() {
		if resp, err := http.Get("http://" + addr + "/slow"); err == nil {
			_ = resp.Body.Close()
		}
	}()
	<-entered
	err := ShutdownWithin(srv, c, 200*time.Millisecond)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 requests still running were cut") {
		t.Errorf("Shutdown with a request running past its context: %v", err)
	}
}

// TestShutdownIdle: with nothing connected the stop returns at once and
// Serve ends.
func TestShutdownIdle(t *testing.T) {
	srv, c, _, served := serve(t, http.NotFoundHandler())
	if err := ShutdownWithin(srv, c, time.Second); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve: %v", err)
	}
}
