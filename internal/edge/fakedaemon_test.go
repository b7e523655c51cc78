package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ingestorhq/ingestor/internal/edge/edgeconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// testToken is the bearer token the fake daemon wants.
const testToken = "edge-test-token-0123456789"

// fakeDaemon is a stand-in for the daemon's ws_ingress endpoint that
// follows WSPROTO.md (PROTOCOL.md, "Device ingress (ws_ingress)"): bearer
// token on the handshake (401 otherwise), one text message per envelope,
// one JSON answer per envelope matched by event_id. It is a real WebSocket
// server (httptest and coder/websocket), enough for the forwarder's own
// tests; the tests against the real daemon come with the end-to-end
// acceptance test.
type fakeDaemon struct {
	t   testing.TB
	srv *httptest.Server

	// wg counts the handlers and the goroutines started by spawn; done is
	// closed when the test ends, so that none outlives it.
	wg   sync.WaitGroup
	done chan struct{}

	mu sync.Mutex
	// onEnvelope decides the answer to each envelope; nil stores and acks.
	onEnvelope func(c *fakeConn, env fakeEnvelope)
	stored     map[string][]byte // event_id -> the bytes first stored
	received   []fakeEnvelope    // every envelope, resends included
	conns      []*fakeConn
	handshakes int
}

// fakeEnvelope is one envelope as the fake daemon received it.
type fakeEnvelope struct {
	raw     []byte
	EventID string          `json:"event_id"`
	Type    string          `json:"type"`
	TS      string          `json:"ts"`
	Session string          `json:"session_id"`
	Device  string          `json:"device_id"`
	Seq     int64           `json:"seq"`
	Payload json.RawMessage `json:"payload"`
	at      time.Time
}

// fakeConn is one device connection to the fake daemon.
type fakeConn struct {
	d    *fakeDaemon
	conn *websocket.Conn
	wmu  sync.Mutex
}

func newFakeDaemon(t testing.TB) *fakeDaemon {
	d := &fakeDaemon{t: t, stored: map[string][]byte{}, done: make(chan struct{})}
	d.srv = httptest.NewServer(http.HandlerFunc(d.handle))
	// Registered first, this runs after the forwarder's cleanup: it stops
	// the server, drops the WebSocket connections (which Close does not
	// track) and waits for every goroutine that could still log.
	t.Cleanup(func() {
		d.srv.Close()
		close(d.done)
		d.mu.Lock()
		for _, c := range d.conns {
			if err := c.conn.CloseNow(); err != nil && !strings.Contains(err.Error(), "closed") {
				t.Logf("fake daemon: close: %v", err)
			}
		}
		d.mu.Unlock()
		d.wg.Wait()
	})
	return d
}

// spawn runs fn in a goroutine that the end of the test waits for.
func (d *fakeDaemon) spawn(fn func()) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		fn()
	}()
}

// url is the ws:// URL of the endpoint.
func (d *fakeDaemon) url() string {
	return "ws" + strings.TrimPrefix(d.srv.URL, "http") + "/ingest/devices/ws"
}

func (d *fakeDaemon) handle(w http.ResponseWriter, r *http.Request) {
	d.wg.Add(1)
	defer d.wg.Done()
	d.mu.Lock()
	d.handshakes++
	d.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+testToken {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		d.t.Errorf("fake daemon: accept: %v", err)
		return
	}
	c := &fakeConn{d: d, conn: conn}
	d.mu.Lock()
	d.conns = append(d.conns, c)
	d.mu.Unlock()
	defer func() {
		if err := conn.CloseNow(); err != nil && !strings.Contains(err.Error(), "closed") {
			d.t.Logf("fake daemon: close: %v", err)
		}
	}()
	for {
		typ, data, err := conn.Read(context.Background())
		if err != nil {
			return
		}
		var env fakeEnvelope
		if typ != websocket.MessageText || json.Unmarshal(data, &env) != nil {
			d.t.Errorf("fake daemon: not a JSON text message: %q", data)
			return
		}
		env.raw, env.at = data, time.Now()
		d.mu.Lock()
		d.received = append(d.received, env)
		decide := d.onEnvelope
		d.mu.Unlock()
		if decide == nil {
			c.store(env)
			continue
		}
		decide(c, env)
	}
}

// store keeps env (checking that a resent event_id carries the same
// bytes) and acks it.
func (c *fakeConn) store(env fakeEnvelope) {
	c.d.mu.Lock()
	if prev, ok := c.d.stored[env.EventID]; ok && !bytes.Equal(prev, env.raw) {
		c.d.t.Errorf("event %s resent with other bytes:\n first %s\n now   %s", env.EventID, prev, env.raw)
	} else if !ok {
		c.d.stored[env.EventID] = env.raw
	}
	c.d.mu.Unlock()
	c.answer(map[string]any{"event_id": env.EventID, "status": "stored", "ack_ts": time.Now().UTC().Format(time.RFC3339Nano)})
}

// answer writes one JSON message; a connection already gone is ignored
// (the device resends what was not answered).
func (c *fakeConn) answer(v any) {
	data, err := json.Marshal(v)
	if err != nil {
		c.d.t.Errorf("fake daemon: %v", err)
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.conn.Write(context.Background(), websocket.MessageText, data); err != nil {
		c.d.t.Logf("fake daemon: answer: %v", err)
	}
}

// drop closes the connection without a close handshake, as a crash does.
func (c *fakeConn) drop() {
	if err := c.conn.CloseNow(); err != nil {
		c.d.t.Logf("fake daemon: drop: %v", err)
	}
}

// setOnEnvelope replaces how envelopes are answered.
func (d *fakeDaemon) setOnEnvelope(fn func(c *fakeConn, env fakeEnvelope)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.onEnvelope = fn
}

// storedCount returns how many distinct event_ids are stored.
func (d *fakeDaemon) storedCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.stored)
}

// receivedOf returns the envelopes received with eventID, in order.
func (d *fakeDaemon) receivedOf(eventID string) []fakeEnvelope {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []fakeEnvelope
	for _, e := range d.received {
		if e.EventID == eventID {
			out = append(out, e)
		}
	}
	return out
}

// storedPayloads returns the payloads of the stored envelopes.
func (d *fakeDaemon) storedPayloads() map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]bool{}
	for _, raw := range d.stored {
		var env fakeEnvelope
		if err := json.Unmarshal(raw, &env); err != nil {
			d.t.Errorf("stored envelope %s: %v", raw, err)
			continue
		}
		out[string(env.Payload)] = true
	}
	return out
}

// testOptions returns options for a forwarder of d with its outbox in a
// new temporary directory and the HTTP input on a free loopback port.
func testOptions(t testing.TB, d *fakeDaemon) Options {
	return Options{
		Config: edgeconfig.Config{
			URL:           d.url(),
			Token:         testToken,
			DeviceID:      "dev-1",
			Outbox:        filepath.Join(t.TempDir(), "outbox.db"),
			HTTPAddr:      "127.0.0.1:0",
			ReconnectBase: 10 * time.Millisecond,
			ReconnectMax:  200 * time.Millisecond,
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// startForwarder starts a forwarder with o, stopped at the end of the test.
func startForwarder(t testing.TB, o Options) *Forwarder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f, err := Start(ctx, o)
	if err != nil {
		cancel()
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := f.Wait(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return f
}

// post sends body to the HTTP input at addr and returns the status and
// the decoded reply.
func post(t testing.TB, addr, body string) (int, reply) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/events", "application/x-ndjson", strings.NewReader(body))
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	defer func() {
		if err := resp.Body.Close(); err != nil {
			t.Error(err)
		}
	}()
	var r reply
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("post: decode the reply: %v", err)
	}
	return resp.StatusCode, r
}

// waitEmpty waits until f's outbox holds no envelope.
func waitEmpty(t testing.TB, f *Forwarder) {
	t.Helper()
	testsync.WaitFor(t, "an empty outbox", 20*time.Second, func() bool {
		n, _ := f.ob.backlog()
		return n == 0
	})
}

// fileExists reports whether path exists.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
