package daemon

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// TestShutdownWithASilentConnection: a client connected to the ops
// listener that never sends a request (a TCP health check, a scraper's
// spare keep-alive connection) does not fail the daemon's shutdown.
// net/http's Shutdown counts such a connection as in use for its first 5
// seconds, longer than the listener's 2 s, and the daemon then exited 1
// ("stop http listener ...: context deadline exceeded"): seen under load
// in ingestor-bench's TestMemoryModeShort.
func TestShutdownWithASilentConnection(t *testing.T) {
	feed := testupstream.New(t, 5, 100)
	h := startDaemon(t, "", "", httpSource("api", feed.URL))
	stopWithSilentConn(t, h, h.d.HTTPAddr(), func() (*http.Response, error) {
		return http.Get("http://" + h.d.HTTPAddr() + "/healthz")
	})
}

// TestShutdownWithASilentPushConnection: the same on the push listener,
// where a load balancer's TCP health check or a webhook sender's spare
// keep-alive connection sends nothing. The listener waits for the
// requests under way, not for connections that never sent one: before,
// such a connection held the daemon's stop for 5 s of its grace (failing
// it when shutdown_grace was shorter), time that unacked frames need.
func TestShutdownWithASilentPushConnection(t *testing.T) {
	h := startDaemon(t, "", "", "[push]\naddr = \"127.0.0.1:0\"\n\n[source.hooks]\nkind = \"webhook\"\nid_field = \"id\"\n")
	stopWithSilentConn(t, h, h.d.PushAddr(), func() (*http.Response, error) {
		return http.Post("http://"+h.d.PushAddr()+"/ingest/hooks", "application/json", strings.NewReader(`{"id":"a"}`))
	})
}

// stopWithSilentConn opens a connection to addr that sends nothing, makes
// sure the server has accepted it (request, answered 2xx on another
// connection: accepts are in order), then stops h's daemon: the stop must
// succeed, and not wait net/http's 5 s for the silent connection.
func stopWithSilentConn(t *testing.T, h *harness, addr string, request func() (*http.Response, error)) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	resp, err := request()
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("request on another connection: %s (%v)", resp.Status, err)
	}
	start := time.Now()
	if err := h.stop(); err != nil {
		t.Errorf("shutdown with a connection to %s that sent nothing: %v", addr, err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("shutdown took %v with a silent connection to %s open", took, addr)
	}
}
