package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// The load of overload mode (overload.go): devices on the ws_ingress
// source and webhook senders, each counting what it was answered into a
// timeline of the phase.

const (
	// bucketWidth is the timeline's resolution, and maxPhase the longest
	// phase it holds.
	bucketWidth = 100 * time.Millisecond
	maxPhase    = 10 * time.Minute
	// deviceRate caps the envelopes a device sends per second, and
	// deviceWindow how many wait for their answer at once (ws_ingress's
	// default max_inflight: the daemon reads no more meanwhile).
	deviceRate   = 1000
	deviceWindow = 64
)

// timeline counts, per bucketWidth of a phase, the events answered stored
// (devices' envelopes, duplicates included, and webhook requests) and the
// refusals ("retry" answers and 429s).
type timeline struct {
	start                      time.Time
	devStored, hookStored, ref []atomic.Int64
	// inflight counts requests sent and not yet answered: work offered.
	inflight atomic.Int64
	// stored counts every stored answer, for the watcher.
	stored atomic.Int64
}

func newTimeline(start time.Time) *timeline {
	n := int(maxPhase / bucketWidth)
	return &timeline{start: start, devStored: make([]atomic.Int64, n), hookStored: make([]atomic.Int64, n), ref: make([]atomic.Int64, n)}
}

// bucket returns the index of the bucket of t.
func (tl *timeline) bucket(t time.Time) int {
	return min(max(int(t.Sub(tl.start)/bucketWidth), 0), len(tl.ref)-1)
}

// sum adds up counts over the buckets [from, to).
func sum(counts []atomic.Int64, from, to int) int64 {
	var n int64
	for i := max(from, 0); i < min(to, len(counts)); i++ {
		n += counts[i].Load()
	}
	return n
}

// committed is the stored answers of devices and webhooks in [from, to).
func (tl *timeline) committed(from, to int) int64 {
	return sum(tl.devStored, from, to) + sum(tl.hookStored, from, to)
}

// answer is what ws_ingress answers an envelope (docs/push.md,
// "Devices over WebSocket").
type answer struct {
	EventID      string `json:"event_id"`
	Status       string `json:"status"`
	RetryAfterMS int64  `json:"retry_after_ms"`
}

// notJSON is the envelope every tenth message is: answered "rejected".
var notJSON = []byte("not json")

// device is one device on its own WebSocket: it sends its messages at up
// to deviceRate a second with at most deviceWindow waiting for their
// answer, and sends an envelope answered "retry" again once its
// retry_after_ms has passed. Message n is an envelope of its own, except
// that every second one repeats the one before (a duplicate, answered
// "stored" once committed) and every tenth is not JSON.
type device struct {
	id    string
	tl    *timeline
	conn  *websocket.Conn
	slots chan struct{}
	// resend holds envelopes to send again, their wait over.
	resend chan []byte
	// stop, once closed, ends an open-ended device's new messages.
	stop <-chan struct{}
	// done is closed once every message sent has its final answer.
	done chan struct{}

	mu sync.Mutex
	// limit is the messages to send (0: until stop); total is their
	// number once known, final the final answers so far.
	limit, total, final int
	stored, retries     atomic.Int64
	rejected            int64
	// finished is when done was closed; lastFinal the latest final
	// answer and longestGap the longest time between two (from the
	// phase's start) while the device had work.
	finished, lastFinal time.Time
	longestGap          time.Duration
	err                 error
}

// dialDevice connects a device to url; it counts into tl, set before run.
func dialDevice(ctx context.Context, url, id string, limit int, stop <-chan struct{}) (*device, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(dctx, url, nil)
	if resp != nil && resp.Body != nil {
		err = errors.Join(err, resp.Body.Close())
	}
	if err != nil {
		return nil, fmt.Errorf("device %s: dial %s: %w", id, url, err)
	}
	total := -1
	if limit > 0 {
		total = limit
	}
	return &device{id: id, conn: conn, slots: make(chan struct{}, deviceWindow), resend: make(chan []byte, 4096),
		stop: stop, done: make(chan struct{}), limit: limit, total: total}, nil
}

// envelope is the envelope of event id of device dev.
func envelope(dev, id string) []byte {
	return fmt.Appendf(nil, `{"schema_version":1,"event_id":%q,"type":"reading","ts":"2026-11-24T10:00:00Z","session_id":"bench","device_id":%q,"payload":{"t":21.5,"rh":40}}`, id, dev)
}

// message returns message n of the device.
func (d *device) message(n int) []byte {
	switch {
	case n%10 == 9:
		return notJSON
	case n%2 == 1:
		n-- // a duplicate of the one before
	}
	return envelope(d.id, fmt.Sprintf("%s-%06d", d.id, n))
}

// run sends and reads until every message has its final answer, or ctx
// ends, or the connection fails.
func (d *device) run(ctx context.Context) {
	d.lastFinal = d.tl.start
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer cancel() // a failed read ends the writer too
		d.read(ctx)
	}()
	d.write(ctx)
	<-read
}

// write sends new messages and resends until done.
func (d *device) write(ctx context.Context) {
	next := time.Now()
	for n := 0; ; {
		var msg []byte
		select {
		case msg = <-d.resend:
		default:
			if d.more(n) {
				msg = d.message(n)
				n++
				break
			}
			d.setTotal(n)
			select {
			case msg = <-d.resend:
			case <-d.done:
				return
			case <-ctx.Done():
				return
			}
		}
		select {
		case d.slots <- struct{}{}:
		case <-d.done:
			return
		case <-ctx.Done():
			return
		}
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait) // the device's pace, not a wait for a condition
		}
		if now := time.Now(); next.Before(now) {
			next = now
		}
		next = next.Add(time.Second / deviceRate)
		d.tl.inflight.Add(1)
		if err := d.conn.Write(ctx, websocket.MessageText, msg); err != nil {
			d.fail(fmt.Errorf("device %s: send: %w", d.id, err))
			return
		}
	}
}

// more reports whether message n is to be sent.
func (d *device) more(n int) bool {
	if d.limit > 0 {
		return n < d.limit
	}
	select {
	case <-d.stop:
		return false
	default:
		return true
	}
}

// setTotal records that n messages were sent in all.
func (d *device) setTotal(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.total < 0 {
		d.total = n
		d.finishIfDone()
	}
}

// finishIfDone closes done once every message has its final answer; d.mu
// is held.
func (d *device) finishIfDone() {
	if d.total >= 0 && d.final == d.total && d.finished.IsZero() {
		d.finished = time.Now()
		close(d.done)
	}
}

// fail records the device's first error and ends it.
func (d *device) fail(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil && d.finished.IsZero() {
		d.err = err
	}
}

// read reads answers until done or the connection fails.
func (d *device) read(ctx context.Context) {
	for {
		_, msg, err := d.conn.Read(ctx)
		if err != nil {
			select {
			case <-d.done:
			default:
				d.fail(fmt.Errorf("device %s: read: %w", d.id, err))
			}
			return
		}
		var a answer
		if err := json.Unmarshal(msg, &a); err != nil {
			d.fail(fmt.Errorf("device %s: answer %q: %w", d.id, msg, err))
			continue
		}
		<-d.slots
		d.tl.inflight.Add(-1)
		if d.take(ctx, a) {
			return
		}
	}
}

// take counts an answer and reports whether the device is done. An
// envelope answered "retry" is handed to the writer once its wait is over.
func (d *device) take(ctx context.Context, a answer) bool {
	now := time.Now()
	switch a.Status {
	case "retry":
		d.retries.Add(1)
		d.tl.ref[d.tl.bucket(now)].Add(1)
		msg := envelope(d.id, a.EventID)
		time.AfterFunc(time.Duration(a.RetryAfterMS)*time.Millisecond, func() {
			select {
			case d.resend <- msg:
			case <-ctx.Done():
			}
		})
		return false
	case "stored":
		d.stored.Add(1)
		d.tl.stored.Add(1)
		d.tl.devStored[d.tl.bucket(now)].Add(1)
	case "rejected":
		d.rejected++
	default:
		d.fail(fmt.Errorf("device %s: answer status %q", d.id, a.Status))
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.final++
	d.longestGap = max(d.longestGap, now.Sub(d.lastFinal))
	d.lastFinal = now
	d.finishIfDone()
	return !d.finished.IsZero()
}

// close closes the device's connection.
func (d *device) close() error {
	if err := d.conn.Close(websocket.StatusNormalClosure, ""); err != nil && websocket.CloseStatus(err) == -1 {
		return d.conn.CloseNow()
	}
	return nil
}

// hookLatency is one webhook event's time from its first POST to its
// stored answer, and the bucket it was answered in.
type hookLatency struct {
	bucket  int
	latency time.Duration
}

// hookSender posts one event per request to the webhook source, back to
// back, and sends a request refused with 429 or 503 again after its
// Retry-After.
type hookSender struct {
	id     int
	prefix string // of its events' ids
	url    string
	client *http.Client
	tl     *timeline
	// stop ends it after the request in progress.
	stop <-chan struct{}

	stored, refused int64
	latencies       []hookLatency
	longestGap      time.Duration
	err             error
}

// run posts until stop or ctx ends.
func (s *hookSender) run(ctx context.Context) {
	last := s.tl.start
	for n := 0; ; n++ {
		select {
		case <-s.stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		body := fmt.Appendf(nil, `{"id":"%s-hook%d-%07d","type":"order.created","amount":1250}`, s.prefix, s.id, n)
		first := time.Now()
		if err := s.deliver(ctx, body); err != nil {
			if ctx.Err() == nil {
				s.err = err
			}
			return
		}
		now := time.Now()
		s.latencies = append(s.latencies, hookLatency{bucket: s.tl.bucket(now), latency: now.Sub(first)})
		s.longestGap = max(s.longestGap, now.Sub(last))
		last = now
	}
}

// deliver posts body until it is stored.
func (s *hookSender) deliver(ctx context.Context, body []byte) error {
	for {
		s.tl.inflight.Add(1)
		code, wait, err := s.post(ctx, body)
		s.tl.inflight.Add(-1)
		now := time.Now()
		switch {
		case err != nil:
			return err
		case code == http.StatusAccepted || code == http.StatusOK:
			s.stored++
			s.tl.stored.Add(1)
			s.tl.hookStored[s.tl.bucket(now)].Add(1)
			return nil
		case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
			s.refused++
			s.tl.ref[s.tl.bucket(now)].Add(1)
			select {
			case <-time.After(wait): // the wait the daemon asked for
			case <-ctx.Done():
				return ctx.Err()
			}
		default:
			return fmt.Errorf("webhook sender %d: POST answered %d", s.id, code)
		}
	}
}

// post sends one request and returns its status and Retry-After.
func (s *hookSender) post(ctx context.Context, body []byte) (int, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("webhook sender %d: %w", s.id, err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if err := errors.Join(err, resp.Body.Close()); err != nil {
		return 0, 0, fmt.Errorf("webhook sender %d: read the answer: %w", s.id, err)
	}
	return resp.StatusCode, retryAfterHeader(resp.Header.Get("Retry-After")), nil
}

// retryAfterHeader is the wait a Retry-After in seconds asks for: at least
// a second, and a second when it is absent or not a number of seconds.
func retryAfterHeader(v string) time.Duration {
	secs, err := strconv.Atoi(v)
	if err != nil || secs < 1 {
		return time.Second
	}
	return time.Duration(secs) * time.Second
}
