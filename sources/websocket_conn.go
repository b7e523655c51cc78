package sources

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/oauth2"

	"github.com/ingestorhq/ingestor/internal/backoff"
)

// wsReconnectBase is the ceiling of the first reconnect wait.
const wsReconnectBase = 100 * time.Millisecond

// run is the reader goroutine: it connects, reads until the connection
// breaks, and reconnects with capped exponential backoff and full jitter,
// until ctx ends. The failure count resets once a connection has stayed up
// for reconnect_max, so an upstream that accepts and then drops every
// connection is not hammered.
func (w *wsSource) run(ctx context.Context) {
	defer close(w.done)
	policy := backoff.Policy{Base: min(wsReconnectBase, w.reconnectMax), Max: w.reconnectMax}
	failures := 0
	for {
		connectedAt, err := w.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if !connectedAt.IsZero() && time.Since(connectedAt) >= w.reconnectMax {
			failures = 0
		}
		wait := policy.Delay(failures)
		if until := w.retryAfter(); time.Until(until) > wait {
			wait = time.Until(until) // the upstream's Retry-After
		}
		if failures == 0 {
			w.log.Warn("websocket connection failed; reconnecting", "err", err, "retry_in", wait)
		} else {
			w.log.Debug("websocket connection failed again", "err", err, "failures", failures+1, "retry_in", wait)
		}
		failures++
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// dial makes the handshake to target with header; with oauth2, with a
// token, and a handshake answered 401 drops it and is made once more with
// a new one before it counts as failed.
func (w *wsSource) dial(ctx context.Context, target string, header http.Header, wd *watchdog) (*websocket.Conn, *http.Response, error) {
	for attempt := 0; ; attempt++ {
		var tok *oauth2.Token
		if w.auth != nil {
			var err error
			if tok, err = w.auth.token(ctx); err != nil {
				return nil, nil, err
			}
			header = header.Clone()
			header.Set("Authorization", tok.Type()+" "+tok.AccessToken)
		}
		dctx, cancel := context.WithTimeout(ctx, w.readTimeout)
		conn, resp, err := websocket.Dial(dctx, target, &websocket.DialOptions{
			HTTPClient:     w.client,
			HTTPHeader:     header,
			Host:           w.host,
			OnPongReceived: func(context.Context, []byte) { wd.kick() },
		})
		cancel()
		if err == nil || tok == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized || attempt > 0 {
			return conn, resp, err
		}
		w.auth.invalidate(tok)
		w.log.Debug("websocket handshake answered 401; trying once more with a new oauth2 token")
	}
}

// session makes one connection: dial, subscribe, then read until it
// breaks. It returns when the connection was subscribed (zero if never) and
// why it ended.
func (w *wsSource) session(ctx context.Context) (connectedAt time.Time, err error) {
	began := time.Now()
	wd := &watchdog{d: w.readTimeout, paused: true}
	w.mu.Lock()
	cursor := w.cursor
	w.mu.Unlock()
	target, header := w.handshake(cursor)
	sent := w.sent
	conn, resp, err := w.dial(ctx, target, header, wd)
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	if err != nil {
		err = fmt.Errorf("dial: %w", unwrapURLError(err))
		w.refuse(TraceEvent{URL: sent, Status: status, Duration: time.Since(began), Err: err, Note: "handshake failed"}, resp, err, "handshake status")
		return time.Time{}, err
	}
	defer func() {
		if cerr := conn.CloseNow(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
			w.log.Debug("closing websocket connection", "err", cerr)
		}
	}()
	// max_message_bytes is enforced by readMessage, which skips an
	// oversized message instead of failing the connection (the upstream
	// would only send it again after the reconnect).
	conn.SetReadLimit(-1)

	note := "connected"
	if w.subscribe != "" {
		wctx, cancel := context.WithTimeout(ctx, w.readTimeout)
		err = conn.Write(wctx, websocket.MessageText, subscribeMessage(w.subscribe, cursor))
		cancel()
		if err != nil {
			err = fmt.Errorf("send subscribe message: %w", err)
			w.traceEvent(TraceEvent{URL: sent, Status: status, Duration: time.Since(began), Err: err, Note: "subscribe failed"})
			w.setDown(err, false)
			return time.Time{}, err
		}
		note = fmt.Sprintf("connected, subscribed from cursor %q", cursor)
	}
	connectedAt = time.Now()
	if w.insecure {
		note += "; TLS certificate NOT verified"
		w.log.Warn("websocket connected WITHOUT verifying the server's TLS certificate (tls_insecure_skip_verify)",
			"url", w.sent, "cursor", cursor)
	} else {
		w.log.Info("websocket connected", "url", w.sent, "cursor", cursor)
	}
	w.traceEvent(TraceEvent{URL: sent, Status: status, Duration: connectedAt.Sub(began), Note: note})
	w.setUp()

	kctx, stopKeepalive := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { w.keepalive(kctx, conn, wd) })
	wd.arm(func() {
		if cerr := conn.CloseNow(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
			w.log.Debug("closing dead websocket connection", "err", cerr)
		}
	})
	n, err := w.readLoop(ctx, conn, wd)
	wd.pause()
	stopKeepalive()
	wg.Wait()
	if wd.hasFired() {
		err = fmt.Errorf("no message or pong within read_timeout (%s)", w.readTimeout)
	}
	err = fmt.Errorf("connection lost after %d messages: %w", n, err)
	if ctx.Err() == nil {
		w.traceEvent(TraceEvent{URL: sent, Status: status, Duration: time.Since(connectedAt), Err: err, Note: "connection lost"})
		w.setDown(err, false)
	}
	return connectedAt, err
}

// handshake returns the URL and headers of a handshake from cursor: each
// {cursor} in the url is replaced URL-escaped, and in a header value as it
// is. It sets w.sent to the URL as traceURL shows it.
func (w *wsSource) handshake(cursor string) (string, http.Header) {
	target := fillURLCursor(w.url, cursor)
	w.sent = w.redacted
	if u, err := url.Parse(target); err == nil {
		w.sent = traceURL(u)
	}
	if !w.cursorHeaders {
		return target, w.header
	}
	header := w.header.Clone()
	for _, vals := range header {
		for i, v := range vals {
			vals[i] = strings.ReplaceAll(v, "{cursor}", cursor)
		}
	}
	return target, header
}

// subscribeMessage replaces each {cursor} in template with cursor, escaped
// as inside a JSON string (without the quotes): a number or a timestamp is
// unchanged, and a cursor with quotes or backslashes cannot break out of
// the string it is placed in.
func subscribeMessage(template, cursor string) []byte {
	return []byte(strings.ReplaceAll(template, "{cursor}", string(appendJSONStringBody(nil, cursor))))
}

// readLoop reads messages into buf until the connection fails or ctx ends,
// and returns how many it read.
func (w *wsSource) readLoop(ctx context.Context, conn *websocket.Conn, wd *watchdog) (int, error) {
	for n := 0; ; n++ {
		_, r, err := conn.Reader(ctx)
		if err != nil {
			return n, err
		}
		data, tooBig, err := readMessage(r, w.maxMessage, wd.kick)
		if err != nil {
			return n, err
		}
		wd.kick()
		m := wsMessage{data: data, at: time.Now()}
		if tooBig {
			m.bad = fmt.Sprintf("message larger than max_message_bytes (%d); its first %d bytes are kept", w.maxMessage, len(data))
		} else if m.records, err = w.parser.records(nil, data); err != nil {
			m.bad, m.records = "message is not valid JSON: "+err.Error(), nil
		}
		if !w.push(ctx, m, wd) {
			return n + 1, ctx.Err()
		}
	}
}

// readMessage reads one message of at most limit bytes, calling kick for
// every chunk so that a long message does not look like a dead connection.
// A larger message is read to its end and discarded, and its first limit
// bytes returned with tooBig set.
func readMessage(r io.Reader, limit int64, kick func()) (data []byte, tooBig bool, err error) {
	kr := kickReader{r: r, kick: kick}
	if data, err = io.ReadAll(io.LimitReader(kr, limit+1)); err != nil {
		return nil, false, err
	}
	if int64(len(data)) <= limit {
		return data, false, nil
	}
	if _, err := io.Copy(io.Discard, kr); err != nil {
		return nil, false, err
	}
	return data[:limit], true, nil
}

// keepalive pings every ping_interval while the connection is read; the
// pong kicks the watchdog through OnPongReceived.
func (w *wsSource) keepalive(ctx context.Context, conn *websocket.Conn, wd *watchdog) {
	t := time.NewTicker(w.pingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if wd.isPaused() {
			continue // nobody reads the pong now
		}
		pctx, cancel := context.WithTimeout(ctx, w.readTimeout)
		err := conn.Ping(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			w.log.Debug("websocket ping unanswered", "err", err)
		}
	}
}
