package testupstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// WSMalformed is the message a WSFeed sends when told to send a malformed
// one.
const WSMalformed = `{"id":"broken","seq":`

// WSOptions configures a WSFeed. The zero value streams nothing.
type WSOptions struct {
	// Total is the number of records, seq 1..Total.
	Total int
	// OAuth2, when set, serves a token endpoint at TokenPath (over http)
	// and answers 401 to a handshake without a valid token (see OAuth2).
	OAuth2 *OAuth2
	// SinceField is the field of the subscribe message that holds the
	// cursor, a string or a number; "" means "since". A missing or empty
	// value means from the start.
	SinceField string
	// SinceInURL takes the cursor from the handshake URL's query parameter
	// SinceField instead, and reads no subscribe message. The parameter is
	// then required: a handshake without it, or whose value is not a
	// sequence number (such as a literal "{cursor}"), is answered 400.
	SinceInURL bool
	// OnDrop, when set, is called just before the feed drops a connection
	// (see DropAfter), while the client has not yet noticed.
	OnDrop func()
	// BodySize pads each record's "body" field to about this many bytes.
	BodySize int
	// DropAfter and Drops make each of the first Drops connections end
	// abruptly (the underlying net.Conn is closed with no close frame)
	// after DropAfter messages have been sent on it.
	DropAfter, Drops int
	// MalformedAt sends WSMalformed just before record MalformedAt, once
	// (not again when a later connection streams that record anew).
	MalformedAt int
	// NoPong makes the feed ignore pings, so that a client relying on
	// pongs sees a dead connection once the records are sent.
	NoPong bool
	// TLS serves wss:// with httptest's self-signed certificate.
	TLS bool
	// TLSMaxVersion, with TLS, caps the TLS version the feed speaks (e.g.
	// tls.VersionTLS11, to check that a client refuses an old server).
	// 0 leaves Go's defaults.
	TLSMaxVersion uint16
}

// WSConn describes one connection to a WSFeed that subscribed.
type WSConn struct {
	// Since is the cursor the subscribe message (or, with SinceInURL, the
	// handshake URL) asked for ("" for none).
	Since string
	// Header is the handshake request's header.
	Header http.Header
	// Sent is the number of messages sent on the connection so far.
	Sent int
	// Dropped reports that the feed ended the connection abruptly.
	Dropped bool
}

// WSFeed is a WebSocket upstream for tests. On each connection it reads
// one subscribe message (or the handshake URL, with SinceInURL), takes the
// cursor from it, and streams the records
// {"id":"ws-<n>","seq":<n>,"ts":"...","body":"..."} with seq greater than
// the cursor, one per text message; then it stays connected, silent, until
// the client or the test ends. Writes block when the client does not read,
// as a real server's would.
type WSFeed struct {
	// URL is the feed's ws:// address.
	URL string

	opts WSOptions
	srv  *httptest.Server
	// ctx ends every connection when the test ends.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sent   atomic.Int64
	pings  atomic.Int64

	mu            sync.Mutex
	conns         []*WSConn
	refused       []string
	live          map[*websocket.Conn]bool
	malformedSent bool
	// script holds the faults the next handshakes get (ws_handshake.go);
	// handshakes records every handshake request.
	script     []Fault
	handshakes []Request
}

// NewWS starts a WebSocket feed; it stops when the test ends.
func NewWS(t testing.TB, opts WSOptions) *WSFeed {
	if opts.SinceField == "" {
		opts.SinceField = "since"
	}
	f := &WSFeed{opts: opts, live: make(map[*websocket.Conn]bool)}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	// Clients that refuse the test certificate are expected: do not log them.
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if opts.TLS {
		if opts.TLSMaxVersion != 0 {
			f.srv.TLS = &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: opts.TLSMaxVersion}
		}
		f.srv.StartTLS()
	} else {
		f.srv.Start()
	}
	f.URL = "ws" + strings.TrimPrefix(f.srv.URL, "http")
	t.Cleanup(f.close)
	return f
}

// Certificate returns a TLS feed's certificate, which is its own CA, or
// nil.
func (f *WSFeed) Certificate() *x509.Certificate {
	if f.srv.TLS == nil {
		return nil
	}
	return f.srv.Certificate()
}

// WSID returns the id of record n of a WSFeed.
func WSID(n int) string { return "ws-" + strconv.Itoa(n) }

// Connections returns every connection subscribed so far, oldest first.
func (f *WSFeed) Connections() []WSConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]WSConn, len(f.conns))
	for i, c := range f.conns {
		out[i] = *c
	}
	return out
}

// Refused returns the cursor of every handshake answered 400 because its
// URL had no valid cursor (SinceInURL), oldest first.
func (f *WSFeed) Refused() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.refused...)
}

// Sent returns the number of messages sent on all connections.
func (f *WSFeed) Sent() int { return int(f.sent.Load()) }

// Pings returns the number of pings received on all connections.
func (f *WSFeed) Pings() int { return int(f.pings.Load()) }

// Drop ends every open connection abruptly, with no close frame.
func (f *WSFeed) Drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.live {
		// CloseNow closes the net.Conn without a close handshake; its
		// error only says the connection was closed already.
		_ = c.CloseNow()
	}
}

// close ends every connection and the server, and waits for the handlers.
func (f *WSFeed) close() {
	f.cancel()
	f.Drop()
	f.srv.Close() // hijacked connections are not waited for here
	f.wg.Wait()
}

func (f *WSFeed) serve(w http.ResponseWriter, r *http.Request) {
	f.wg.Add(1)
	defer f.wg.Done()
	if f.opts.OAuth2.intercept(w, r) {
		return
	}
	if f.handshake(w, r) {
		return // answered with a scripted fault
	}
	var since string
	var from int
	if f.opts.SinceInURL {
		var err error
		since = r.URL.Query().Get(f.opts.SinceField)
		if from, err = sequence(since); err != nil || since == "" {
			f.mu.Lock()
			f.refused = append(f.refused, since)
			f.mu.Unlock()
			http.Error(w, fmt.Sprintf("query parameter %s must be a sequence number, not %q", f.opts.SinceField, since), http.StatusBadRequest)
			return
		}
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		OnPingReceived: func(context.Context, []byte) bool {
			f.pings.Add(1)
			return !f.opts.NoPong
		},
	})
	if err != nil {
		return // Accept has answered the request with an error
	}
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	f.mu.Lock()
	f.live[c] = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.live, c)
		f.mu.Unlock()
		_ = c.CloseNow() // the connection is done with either way
	}()

	if !f.opts.SinceInURL {
		if since, from, err = f.subscription(ctx, c); err != nil {
			_ = c.Close(websocket.StatusPolicyViolation, "bad subscribe message")
			return
		}
	}
	// A connection is listed once its subscribe message has been read.
	f.mu.Lock()
	info := &WSConn{Since: since, Header: r.Header.Clone()}
	f.conns = append(f.conns, info)
	index := len(f.conns) - 1
	f.mu.Unlock()
	// Keep reading, so that pings are answered and a closed client is
	// noticed; the client sends nothing else.
	go func() {
		defer cancel()
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
		}
	}()
	for n := from + 1; n <= f.opts.Total; n++ {
		if f.opts.MalformedAt == n && f.claimMalformed() {
			if !f.send(ctx, c, info, index, []byte(WSMalformed)) {
				return
			}
		}
		if !f.send(ctx, c, info, index, f.record(n)) {
			return
		}
	}
	<-ctx.Done()
}

// subscription reads the subscribe message and returns its cursor, as
// written and as a sequence number.
func (f *WSFeed) subscription(ctx context.Context, c *websocket.Conn) (string, int, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, msg, err := c.Read(rctx)
	if err != nil {
		return "", 0, err
	}
	val, kind, ok := jsonscan.Field(msg, f.opts.SinceField)
	since := ""
	switch {
	case ok && kind == jsonscan.String:
		if since, err = jsonscan.Unquote(val); err != nil {
			return "", 0, err
		}
	case ok && kind == jsonscan.Number:
		since = string(val)
	case ok && kind != jsonscan.Null:
		return "", 0, fmt.Errorf("%s is a %s", f.opts.SinceField, kind)
	}
	n, err := sequence(since)
	if err != nil {
		return "", 0, err
	}
	return since, n, nil
}

// sequence parses a cursor of the feed: "" (from the start) or a
// sequence number.
func sequence(since string) (int, error) {
	if since == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(since)
	if err != nil || n < 0 {
		return 0, errors.New("since is not a sequence number")
	}
	return n, nil
}

// claimMalformed reports whether the malformed message is still to be sent,
// and marks it sent.
func (f *WSFeed) claimMalformed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.malformedSent {
		return false
	}
	f.malformedSent = true
	return true
}

// send writes one message, then drops the connection if it is one of the
// first Drops and has reached DropAfter messages. It reports whether to go
// on.
func (f *WSFeed) send(ctx context.Context, c *websocket.Conn, info *WSConn, index int, msg []byte) bool {
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		return false
	}
	f.sent.Add(1)
	f.mu.Lock()
	info.Sent++
	drop := index < f.opts.Drops && info.Sent >= f.opts.DropAfter
	info.Dropped = drop
	f.mu.Unlock()
	if drop {
		if f.opts.OnDrop != nil {
			f.opts.OnDrop()
		}
		_ = c.CloseNow() // abrupt on purpose: no close frame
		return false
	}
	return true
}

// record returns the JSON of record n.
func (f *WSFeed) record(n int) []byte {
	body := fmt.Sprintf("record number %d", n)
	if pad := f.opts.BodySize - len(body); pad > 0 {
		body += strings.Repeat(".", pad)
	}
	return fmt.Appendf(nil, `{"id":%q,"seq":%d,"ts":"2026-11-22T00:%02d:%02dZ","body":%q}`,
		WSID(n), n, n/60%60, n%60, body)
}
