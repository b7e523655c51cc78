package sources

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/ingestorhq/ingestor/internal/backoff"
)

// sseReconnectBase is the ceiling of the first reconnect wait.
const sseReconnectBase = 100 * time.Millisecond

// errNoContent is why a stream answered 204 is not read.
var errNoContent = errors.New("the upstream answered 204 No Content: no stream for now")

// run is the reader goroutine: it opens the stream, reads it until it
// breaks or ends, and reopens it with capped exponential backoff and full
// jitter, until ctx ends. The stream's retry field is a floor under every
// wait, a Retry-After one too, and a 204 waits reconnect_max. The failure
// count resets once a stream has stayed open for reconnect_max, so an
// upstream that accepts and then drops every stream is not hammered.
func (w *sseSource) run(ctx context.Context) {
	defer close(w.done)
	policy := backoff.Policy{Base: min(sseReconnectBase, w.reconnectMax), Max: w.reconnectMax}
	failures := 0
	for {
		connectedAt, stopped, err := w.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if !connectedAt.IsZero() && time.Since(connectedAt) >= w.reconnectMax {
			failures = 0
		}
		wait := max(policy.Delay(failures), w.reconnectionTime())
		if stopped {
			wait = max(wait, w.reconnectMax)
		}
		if until := w.retryAfter(); time.Until(until) > wait {
			wait = time.Until(until) // the upstream's Retry-After
		}
		switch {
		case stopped:
			w.log.Info("sse stream answered 204; trying again later", "retry_in", wait)
		case failures == 0:
			w.log.Warn("sse stream failed; reconnecting", "err", err, "retry_in", wait)
		default:
			w.log.Debug("sse stream failed again", "err", err, "failures", failures+1, "retry_in", wait)
		}
		failures++
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// session opens the stream once and reads it until it breaks. It returns
// when the stream was opened (zero if never), whether the upstream
// answered 204, and why the session ended. The watchdog cancels the
// request when read_timeout passes without a byte, headers included.
func (w *sseSource) session(ctx context.Context) (connectedAt time.Time, stopped bool, err error) {
	began := time.Now()
	w.mu.Lock()
	lastID := w.cursor
	w.mu.Unlock()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wd := &watchdog{d: w.readTimeout}
	wd.arm(cancel)
	defer wd.pause()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, w.url, nil)
	var resp *http.Response
	if err == nil {
		req.Header = w.header.Clone()
		req.Host = w.host
		if lastID != "" {
			req.Header.Set(sseLastEventID, lastID)
		}
		resp, err = w.open(req)
	}
	if err != nil {
		if wd.hasFired() && errors.Is(err, context.Canceled) {
			err = fmt.Errorf("no answer within read_timeout (%s)", w.readTimeout)
		}
		err = fmt.Errorf("request: %w", unwrapURLError(err))
		if ctx.Err() == nil {
			w.traceEvent(TraceEvent{Duration: time.Since(began), Err: err, Note: "request failed"})
			w.setDown(err, false)
		}
		return time.Time{}, false, err
	}
	wd.kick()
	defer func() {
		if cerr := resp.Body.Close(); cerr != nil && ctx.Err() == nil {
			w.log.Debug("closing sse stream", "err", cerr)
		}
	}()
	if stopped, err := w.refused(resp, began); err != nil {
		return time.Time{}, stopped, err
	}
	connectedAt = time.Now()
	note := fmt.Sprintf("connected, Last-Event-ID %q", lastID)
	if w.insecure {
		note += "; TLS certificate NOT verified"
		w.log.Warn("sse connected WITHOUT verifying the server's TLS certificate (tls_insecure_skip_verify)",
			"url", w.sent, "last_event_id", lastID)
	} else {
		w.log.Info("sse connected", "url", w.sent, "last_event_id", lastID)
	}
	w.traceEvent(TraceEvent{Status: resp.StatusCode, Duration: connectedAt.Sub(began), Note: note})
	w.setUp()

	sc := newSSEScanner(kickReader{r: resp.Body, kick: wd.kick}, w.maxEvent, lastID)
	n, err := w.readLoop(ctx, sc, wd)
	wd.pause()
	if retry, ok := sc.reconnection(); ok {
		w.setRetry(retry)
	}
	switch {
	case wd.hasFired():
		err = fmt.Errorf("no byte within read_timeout (%s)", w.readTimeout)
	case errors.Is(err, io.EOF):
		err = errors.New("the upstream ended the stream")
	}
	err = fmt.Errorf("stream lost after %d events: %w", n, err)
	if ctx.Err() == nil {
		w.traceEvent(TraceEvent{Status: resp.StatusCode, Duration: time.Since(connectedAt), Err: err, Note: "stream lost"})
		w.setDown(err, false)
	}
	return connectedAt, false, err
}

// open sends req; with oauth2, with a token, and an answer 401 drops it
// and sends req once more with a new one before the answer counts.
func (w *sseSource) open(req *http.Request) (*http.Response, error) {
	if w.auth == nil {
		return w.client.Do(req)
	}
	resp, _, err := w.auth.send(w.client, req, func(r *http.Response) { _ = r.Body.Close() })
	return resp, err
}

// refused checks the answer: it returns nil for a 200 text/event-stream,
// stopped for a 204, and otherwise the error, having traced it and
// recorded the failure. A 429 or 503 with Retry-After sets the wait; a 4xx
// other than 408 and 429 is permanent.
func (w *sseSource) refused(resp *http.Response, began time.Time) (stopped bool, err error) {
	status := resp.StatusCode
	ev := TraceEvent{Status: status, Duration: time.Since(began)}
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case status == http.StatusNoContent:
		ev.Note = "no stream for now; next try after reconnect_max"
		w.traceEvent(ev)
		w.setStopped()
		return true, errNoContent
	case status == http.StatusOK && mediaType == "text/event-stream":
		return false, nil
	case status == http.StatusOK:
		err = fmt.Errorf("answered with content type %q, not text/event-stream", resp.Header.Get("Content-Type"))
	default:
		err = fmt.Errorf("status %d", status)
	}
	ev.Err, ev.Note = err, "refused"
	w.refuse(ev, resp, err, "status")
	return false, err
}

// readLoop reads events into buf until the stream fails or ends or ctx
// ends, and returns how many dispatches it read.
func (w *sseSource) readLoop(ctx context.Context, sc *sseScanner, wd *watchdog) (int, error) {
	for n := 0; ; n++ {
		ev, err := sc.next()
		if err != nil {
			return n, err
		}
		if !w.push(ctx, w.item(ev), wd) {
			return n + 1, ctx.Err()
		}
	}
}

// item turns a dispatch into what is buffered: an event of a wanted type
// is parsed into its envelope and records, or found malformed.
func (w *sseSource) item(ev sseEvent) sseItem {
	it := sseItem{lastID: ev.lastID, at: time.Now()}
	switch {
	case !ev.event || !w.parser.wanted(ev.typ):
		return it // it only moves the last event ID
	case ev.tooBig:
		it.env = ev.data
		it.bad = fmt.Sprintf("%s larger than max_event_bytes (%d); its first %d bytes of data are kept", describeEvent(ev), w.maxEvent, len(ev.data))
		return it
	}
	recs, err := w.parser.records(nil, ev.data, ev.id, ev.hasID)
	if err != nil {
		it.env, it.bad = ev.data, fmt.Sprintf("%s: data is not valid JSON: %v", describeEvent(ev), err)
		return it
	}
	env, off := sseEnvelope(ev)
	for i := range recs {
		recs[i].Off += off
	}
	it.env, it.records = env, recs
	return it
}

// describeEvent names an event in a malformed payload's reason.
func describeEvent(ev sseEvent) string {
	if ev.hasID {
		return fmt.Sprintf("event %q of type %q", ev.id, ev.typ)
	}
	return fmt.Sprintf("event of type %q after id %q", ev.typ, ev.lastID)
}

// setRetry records the reconnection time a stream's retry field set.
func (w *sseSource) setRetry(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.retry = d
}

// reconnectionTime returns the reconnection time the stream set, or 0.
func (w *sseSource) reconnectionTime() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.retry
}
