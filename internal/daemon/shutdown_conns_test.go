package daemon

import (
	"net"
	"net/http"
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
	conn, err := net.Dial("tcp", h.d.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	// The server has the connection once it answers a request on
	// another: accepts are in order.
	resp, err := http.Get("http://" + h.d.HTTPAddr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := h.stop(); err != nil {
		t.Errorf("shutdown with a connection that sent nothing: %v", err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("shutdown took %v with a silent connection open", took)
	}
}
