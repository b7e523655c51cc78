package testupstream

import (
	"bytes"
	"context"
	"crypto/x509"
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
)

// SSEMalformed is the data of the malformed event an SSEFeed sends when
// told to: not JSON.
const SSEMalformed = `{"id":"broken","seq":`

// SSEOtherType is the event type of the events OtherEvery makes.
const SSEOtherType = "status"

// SSEOptions configures an SSEFeed. The zero value streams nothing.
type SSEOptions struct {
	// Total is the number of events, with ids "1" to Total (see SSEFeed).
	Total int
	// OAuth2, when set, serves a token endpoint at TokenPath and answers
	// 401 to a stream request without a valid token (see OAuth2); those
	// are not handshakes.
	OAuth2 *OAuth2
	// EventType is the type of the record events, sent as an event line;
	// "" sends none, which is the type "message".
	EventType string
	// OtherEvery makes every OtherEvery-th event (by id) an event of type
	// SSEOtherType whose data is {"status":"ok","n":<id>}, not a record.
	OtherEvery int
	// MultiLine splits each event's data into one data line per JSON
	// member: the data is then the members joined with ",\n" (see Data).
	MultiLine bool
	// LineEnd ends every line: "\n" when empty, else "\r\n" or "\r".
	LineEnd string
	// Comments sends a comment line before every event.
	Comments bool
	// Retry, when set, sends a retry field (in milliseconds) at the start
	// of every stream.
	Retry time.Duration
	// Heartbeat, when set, sends a comment line every Heartbeat once the
	// events are sent; otherwise the stream then stays silent.
	Heartbeat time.Duration
	// DropAfter and Drops make each of the first Drops streams end
	// abruptly (the connection is closed without the end of the chunked
	// body) after DropAfter events have been sent on it.
	DropAfter, Drops int
	// MidEvent makes every MidEvent-th drop (1: every one) cut inside an
	// event: the id line and half the first data line of the next event
	// are sent before the connection is closed.
	MidEvent int
	// Resend makes a stream that resumes from a Last-Event-ID start
	// Resend events before the one after it: duplicates.
	Resend int
	// MalformedAt sends an event whose data is SSEMalformed, without an id
	// line, just before event MalformedAt, once (not again when a later
	// stream sends that event anew).
	MalformedAt int
	// BodySize pads each record's "body" field to about this many bytes.
	BodySize int
	// Pace, when set, is a pause after every event, so that a stream of
	// many events lasts long enough to be interrupted in the middle.
	Pace time.Duration
	// End ends each stream cleanly once its events are sent, instead of
	// keeping it open.
	End bool
	// OnDrop, when set, is called just before the feed drops a stream (see
	// DropAfter), while the client has not yet noticed.
	OnDrop func()
	// TLS serves https with httptest's self-signed certificate.
	TLS bool
}

// SSEHandshake describes one request to an SSEFeed.
type SSEHandshake struct {
	// Time is when the request arrived.
	Time time.Time
	// LastEventID is the request's Last-Event-ID, and HasLastEventID
	// reports that it had one.
	LastEventID    string
	HasLastEventID bool
	// Header is the request's header.
	Header http.Header
	// Status is the status answered: 200 for a stream, a scripted
	// fault's, or 400 for a Last-Event-ID that is not an event id.
	Status int
	// From is the id of the first event the stream sent, and Sent the
	// number of events sent on it so far, complete.
	From, Sent int
	// Dropped reports that the feed ended the stream abruptly, at End.
	Dropped bool
	End     time.Time
}

// SSEFeed is a Server-Sent Events upstream for tests. Every GET is
// answered with a text/event-stream of the events after the request's
// Last-Event-ID (all of them without one): event n has the id line "n"
// and, unless OtherEvery makes it another type, the data
// {"id":"sse-<n>","seq":<n>,"ts":"...","body":"..."} (see Data). Then
// the stream stays open, silent or with heartbeats, until the client, a
// drop or the test ends it. Writes block when the client does not read,
// as a real server's would.
type SSEFeed struct {
	// URL is the feed's http:// (or https://) address.
	URL string

	opts SSEOptions
	srv  *httptest.Server
	// ctx ends every stream when the test ends.
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	sent       atomic.Int64
	heartbeats atomic.Int64

	mu            sync.Mutex
	handshakes    []*SSEHandshake
	script        []Fault
	drops         int
	malformedSent bool
	// live holds a channel per open stream, closed by Drop.
	live map[chan struct{}]bool
}

// NewSSE starts a Server-Sent Events feed; it stops when the test ends.
func NewSSE(t testing.TB, opts SSEOptions) *SSEFeed {
	if opts.LineEnd == "" {
		opts.LineEnd = "\n"
	}
	f := &SSEFeed{opts: opts, live: make(map[chan struct{}]bool)}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	// Clients that refuse the test certificate are expected: do not log them.
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if opts.TLS {
		f.srv.StartTLS()
	} else {
		f.srv.Start()
	}
	f.URL = f.srv.URL
	t.Cleanup(f.close)
	return f
}

// SSEID returns the "id" field of the data of record event n.
func SSEID(n int) string { return "sse-" + strconv.Itoa(n) }

// Certificate returns a TLS feed's certificate, which is its own CA, or
// nil.
func (f *SSEFeed) Certificate() *x509.Certificate {
	if f.srv.TLS == nil {
		return nil
	}
	return f.srv.Certificate()
}

// Script queues faults for the next requests: the next len(faults)
// requests are answered with them, in order (a Fault with Status 0 that
// is not Hang lets its request through), then streams are served again.
func (f *SSEFeed) Script(faults ...Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script = append(f.script, faults...)
}

// Handshakes returns every request received so far, oldest first.
func (f *SSEFeed) Handshakes() []SSEHandshake {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]SSEHandshake, len(f.handshakes))
	for i, h := range f.handshakes {
		out[i] = *h
	}
	return out
}

// Sent returns the number of events sent on all streams.
func (f *SSEFeed) Sent() int { return int(f.sent.Load()) }

// Heartbeats returns the number of heartbeat comments sent.
func (f *SSEFeed) Heartbeats() int { return int(f.heartbeats.Load()) }

// Drop ends every open stream abruptly.
func (f *SSEFeed) Drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for kill := range f.live {
		close(kill)
		delete(f.live, kill)
	}
}

// close ends every stream and the server, and waits for the handlers.
func (f *SSEFeed) close() {
	f.cancel()
	f.srv.Close()
	f.wg.Wait()
}

// Data returns the data of event n as a client reads it: the lines of
// its data field joined with "\n".
func (f *SSEFeed) Data(n int) []byte {
	var data []byte
	if f.opts.OtherEvery > 0 && n%f.opts.OtherEvery == 0 {
		data = fmt.Appendf(nil, `{"status":"ok","n":%d}`, n)
	} else {
		body := fmt.Sprintf("record number %d", n)
		if pad := f.opts.BodySize - len(body); pad > 0 {
			body += strings.Repeat(".", pad)
		}
		data = fmt.Appendf(nil, `{"id":%q,"seq":%d,"ts":"2026-11-22T00:%02d:%02dZ","body":%q}`,
			SSEID(n), n, n/60%60, n%60, body)
	}
	if f.opts.MultiLine {
		data = bytes.ReplaceAll(data, []byte(`,"`), []byte(",\n\""))
	}
	return data
}

// event returns the bytes of event n on the wire.
func (f *SSEFeed) event(n int) []byte {
	nl := f.opts.LineEnd
	var b []byte
	if f.opts.Comments {
		b = fmt.Appendf(b, ": before event %d%s", n, nl)
	}
	b = fmt.Appendf(b, "id: %d%s", n, nl)
	typ := f.opts.EventType
	if f.opts.OtherEvery > 0 && n%f.opts.OtherEvery == 0 {
		typ = SSEOtherType
	}
	if typ != "" {
		b = fmt.Appendf(b, "event: %s%s", typ, nl)
	}
	for line := range bytes.SplitSeq(f.Data(n), []byte("\n")) {
		b = fmt.Appendf(b, "data: %s%s", line, nl)
	}
	return append(b, nl...)
}

// handshake records the request r and takes the next scripted fault, if
// any, that answers it.
func (f *SSEFeed) handshake(r *http.Request) (*SSEHandshake, *Fault) {
	hs := &SSEHandshake{Time: time.Now(), Header: r.Header.Clone()}
	if vals, ok := r.Header["Last-Event-Id"]; ok && len(vals) > 0 {
		hs.LastEventID, hs.HasLastEventID = vals[0], true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handshakes = append(f.handshakes, hs)
	if len(f.script) == 0 {
		return hs, nil
	}
	fault := f.script[0]
	f.script = f.script[1:]
	if fault.Status == 0 && !fault.Hang {
		return hs, nil
	}
	hs.Status = fault.Status
	return hs, &fault
}

// answer answers a request with a scripted fault.
func (f *SSEFeed) answer(w http.ResponseWriter, r *http.Request, fault *Fault, now time.Time) {
	resp := fault.response(now)
	if resp.hang {
		select {
		case <-r.Context().Done():
		case <-f.ctx.Done():
		}
		return
	}
	for name, vals := range resp.header {
		w.Header()[name] = vals
	}
	w.WriteHeader(resp.status)
	if resp.status != http.StatusNoContent {
		_, _ = w.Write(resp.body) // a client gone away is its own problem
	}
}

func (f *SSEFeed) serve(w http.ResponseWriter, r *http.Request) {
	f.wg.Add(1)
	defer f.wg.Done()
	if f.opts.OAuth2.intercept(w, r) {
		return
	}
	hs, fault := f.handshake(r)
	if fault != nil {
		f.answer(w, r, fault, hs.Time)
		return
	}
	from, err := sequence(hs.LastEventID)
	if err != nil {
		f.setStatus(hs, http.StatusBadRequest)
		http.Error(w, fmt.Sprintf("Last-Event-ID %q is not an event id", hs.LastEventID), http.StatusBadRequest)
		return
	}
	start := from + 1
	if hs.HasLastEventID {
		start = max(start-f.opts.Resend, 1)
	}
	kill := make(chan struct{})
	f.mu.Lock()
	hs.Status, hs.From = http.StatusOK, start
	f.live[kill] = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.live, kill)
		if hs.End.IsZero() {
			hs.End = time.Now()
		}
		f.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	s := &sseStream{f: f, w: w, rc: http.NewResponseController(w), hs: hs, kill: kill}
	var retry []byte // the headers go out at once, with the retry field if any
	if f.opts.Retry > 0 {
		retry = fmt.Appendf(nil, "retry: %d%s", f.opts.Retry.Milliseconds(), f.opts.LineEnd)
	}
	if !s.write(retry) {
		return
	}
	for n := start; n <= f.opts.Total; n++ {
		if !s.send(n) {
			return
		}
	}
	if f.opts.End {
		return
	}
	s.idle(r.Context())
}

// setStatus records the status a request was answered.
func (f *SSEFeed) setStatus(hs *SSEHandshake, status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	hs.Status = status
}

// claimMalformed reports whether the malformed event is still to be sent,
// and marks it sent.
func (f *SSEFeed) claimMalformed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.malformedSent {
		return false
	}
	f.malformedSent = true
	return true
}

// sseStream is one stream being served.
type sseStream struct {
	f    *SSEFeed
	w    http.ResponseWriter
	rc   *http.ResponseController
	hs   *SSEHandshake
	kill chan struct{}
}

// write writes b and flushes it; it reports whether to go on. A stream
// killed by Drop is aborted here.
func (s *sseStream) write(b []byte) bool {
	select {
	case <-s.kill:
		s.abort()
	default:
	}
	if _, err := s.w.Write(b); err != nil {
		return false
	}
	return s.rc.Flush() == nil
}

// send writes event n (after the malformed event, if it is due), then
// drops the stream if it is one of the first Drops and has reached
// DropAfter events. It reports whether to go on.
func (s *sseStream) send(n int) bool {
	f := s.f
	nl := f.opts.LineEnd
	if f.opts.MalformedAt == n && f.claimMalformed() {
		if !s.write([]byte("data: " + SSEMalformed + nl + nl)) {
			return false
		}
	}
	if !s.write(f.event(n)) {
		return false
	}
	f.sent.Add(1)
	if f.opts.Pace > 0 && !s.pause(f.opts.Pace) {
		return false
	}
	f.mu.Lock()
	s.hs.Sent++
	drop := f.opts.DropAfter > 0 && s.hs.Sent >= f.opts.DropAfter && f.drops < f.opts.Drops
	mid := false
	if drop {
		f.drops++
		mid = f.opts.MidEvent > 0 && f.drops%f.opts.MidEvent == 0 && n < f.opts.Total
	}
	f.mu.Unlock()
	if !drop {
		return true
	}
	if mid {
		next := f.event(n + 1)
		start := bytes.Index(next, []byte("data: ")) + len("data: ")
		end := start + bytes.IndexAny(next[start:], "\r\n")
		if !s.write(next[:start+(end-start)/2]) {
			return false
		}
	}
	if f.opts.OnDrop != nil {
		f.opts.OnDrop()
	}
	s.abort()
	return false
}

// pause waits d; it reports false when the test ends first, and aborts
// the stream if Drop kills it meanwhile.
func (s *sseStream) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.kill:
		s.abort()
	case <-s.f.ctx.Done():
	}
	return false
}

// abort ends the stream abruptly: the handler panics with
// http.ErrAbortHandler, which closes the connection without the end of
// the chunked body, so the client sees it break.
func (s *sseStream) abort() {
	s.f.mu.Lock()
	s.hs.Dropped, s.hs.End = true, time.Now()
	s.f.mu.Unlock()
	panic(http.ErrAbortHandler)
}

// idle keeps the stream open once its events are sent, sending a
// heartbeat comment every Heartbeat if set, until the client, a Drop or
// the test ends it.
func (s *sseStream) idle(ctx context.Context) {
	var tick <-chan time.Time
	if d := s.f.opts.Heartbeat; d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.f.ctx.Done():
			return
		case <-s.kill:
			s.abort()
		case <-tick:
			if !s.write([]byte(":heartbeat" + s.f.opts.LineEnd)) {
				return
			}
			s.f.heartbeats.Add(1)
		}
	}
}
