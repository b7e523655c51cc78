package push

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/ingestorhq/ingestor/internal/devicewire"
	"github.com/ingestorhq/ingestor/internal/jsonscan"
	"github.com/ingestorhq/ingestor/internal/telemetry"
)

// wsConn is one device connection. Its reader goroutine reads envelopes
// while the window (slots) has room, lets each valid one into the inbox
// (waiting for a place while the group commit is saturated: the device is
// held back, not refused) and waits for its commit in a goroutine of its
// own, so that the envelopes of one connection share the inbox's group
// commits; each answer is written when its commit returns, in whatever
// order they finish.
type wsConn struct {
	h      *wsIngress
	conn   *websocket.Conn
	device string // the token's device id; "" for the shared token
	remote string
	// slots holds one token per envelope read and not yet answered: at
	// max_inflight, reading pauses (backpressure).
	slots chan struct{}
	// stop is closed by shutdown: read nothing more.
	stop     chan struct{}
	stopOnce sync.Once
	// readTimer cancels the read in progress after read_timeout; a pong
	// restarts it.
	readTimer atomic.Pointer[time.Timer]

	mu       sync.Mutex
	stopping bool           // no envelope read from now on is committed
	pending  sync.WaitGroup // envelopes read and not yet answered
}

// closeReason is why a connection ends: the close status sent, or none
// (status -1) when the connection is already gone.
type closeReason struct {
	status websocket.StatusCode
	reason string
}

var (
	goingAway  = closeReason{websocket.StatusGoingAway, "the daemon is shutting down"}
	connIsGone = closeReason{status: -1}
)

// serve runs the connection until the device leaves, breaks the protocol
// or goes silent, or the handler closes: then it reads nothing more, waits
// until every envelope read is answered, and closes the connection.
func (c *wsConn) serve() {
	h := c.h
	source := h.env.source.Name
	gauge := h.env.metrics.ws.connected.WithLabelValues(source)
	gauge.Inc()
	defer gauge.Dec()
	log := h.env.log.With("remote", c.remote)
	if c.device != "" {
		log = log.With("device", c.device)
	}
	log.Debug("ws_ingress: device connected")
	// The library would close an oversize message with 1009; read checks
	// max_message_bytes itself, to close with 1008 as the protocol says.
	c.conn.SetReadLimit(-1)
	ctx, cancel := context.WithCancel(context.Background())
	pinged := make(chan struct{})
	go func() {
		defer close(pinged)
		c.ping(ctx)
	}()
	ended := make(chan closeReason, 1)
	go func() { ended <- c.readLoop() }()
	var why closeReason
	select {
	case why = <-ended:
		ended = nil
	case <-c.stop:
		why = goingAway
	}
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	c.pending.Wait()
	cancel()
	<-pinged
	var err error
	if why.status >= 0 {
		err = c.conn.Close(why.status, why.reason)
	} else {
		err = c.conn.CloseNow()
	}
	if ended != nil {
		<-ended // the reader ends once the connection is closed
	}
	if why.status == websocket.StatusPolicyViolation {
		log.Info("ws_ingress: closed a connection that broke the protocol", "reason", why.reason)
	}
	log.Debug("ws_ingress: device disconnected", "status", int(why.status), "reason", why.reason, "close_err", err)
}

// shutdown makes the connection stop reading and close with 1001 once its
// envelopes are answered.
func (c *wsConn) shutdown() { c.stopOnce.Do(func() { close(c.stop) }) }

// pong restarts the read deadline: the device is alive.
func (c *wsConn) pong(context.Context, []byte) {
	if t := c.readTimer.Load(); t != nil {
		t.Reset(c.h.readTimeout)
	}
}

// ping pings the device every ping_interval until ctx ends. A pong
// restarts the read deadline (pong); a missing one is judged by the read
// deadline, not here.
func (c *wsConn) ping(ctx context.Context) {
	t := time.NewTicker(c.h.pingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, c.h.readTimeout)
		err := c.conn.Ping(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			c.h.env.log.Debug("ws_ingress: ping unanswered", "remote", c.remote, "err", err)
		}
	}
}

// readLoop reads envelopes until the connection ends or stop is closed,
// and says how to close the connection.
func (c *wsConn) readLoop() closeReason {
	for {
		select {
		case c.slots <- struct{}{}:
		case <-c.stop:
			return goingAway
		}
		msg, oversize, why, ok := c.read()
		if !ok {
			<-c.slots
			return why
		}
		c.mu.Lock()
		if c.stopping {
			// Read after the shutdown began: not committed, not answered;
			// the device sends it again to the next daemon.
			c.mu.Unlock()
			<-c.slots
			continue
		}
		c.pending.Add(1)
		c.mu.Unlock()
		if oversize {
			c.answer(devicewire.Ack{EventID: oversizeEventID(msg), Status: devicewire.StatusRejected,
				Reason: "message over max_message_bytes (" + strconv.FormatInt(c.h.maxMessage, 10) + ")"}, c.device, 413)
			continue
		}
		env, err := devicewire.DecodeEnvelope(msg)
		if err == nil && c.device != "" && env.DeviceID != c.device {
			err = fmt.Errorf("device_id %q is not the device of the token (%q)", env.DeviceID, c.device)
		}
		if err != nil {
			// Counted under the token's device: an invalid envelope's
			// device_id is not to be trusted as a label.
			c.answer(devicewire.Ack{EventID: env.EventID, Status: devicewire.StatusRejected, Reason: err.Error()}, c.device, 400)
			continue
		}
		c.commit(msg, env)
	}
}

// read reads the next message under the read deadline. ok is false when
// the connection ended (why says how to close it). A message over
// max_message_bytes is oversize: msg then holds its first max_message_bytes.
func (c *wsConn) read() (msg []byte, oversize bool, why closeReason, ok bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t := time.AfterFunc(c.h.readTimeout, cancel)
	c.readTimer.Store(t)
	defer t.Stop()
	typ, r, err := c.conn.Reader(ctx)
	if err == nil {
		if typ != websocket.MessageText {
			return nil, false, closeReason{websocket.StatusPolicyViolation, "envelopes are text messages, not binary"}, false
		}
		msg, err = io.ReadAll(io.LimitReader(r, c.h.maxMessage+1))
		if err == nil && int64(len(msg)) > c.h.maxMessage {
			// The rest is read and dropped, never held: the answer needs
			// only the event_id, which the first bytes hold for a
			// forwarder's envelope (its keys are sorted).
			_, err = io.Copy(io.Discard, r)
			msg = msg[:c.h.maxMessage]
			oversize = true
		}
	}
	if err != nil {
		if ctx.Err() != nil && websocket.CloseStatus(err) == -1 {
			c.h.env.log.Info("ws_ingress: dropped a silent device: no message and no pong within read_timeout",
				"remote", c.remote, "device", c.device, "read_timeout", c.h.readTimeout)
		}
		return nil, false, connIsGone, false
	}
	return msg, oversize, closeReason{}, true
}

// commit lets one envelope into the inbox, waiting for a place while the
// group commit is saturated (nothing more is read from the device
// meanwhile), then waits for its commit and answers it in a goroutine of
// its own. An envelope still waiting for a place when the connection is
// told to stop is neither committed nor answered: the device sends it
// again to the next daemon. Before, an envelope the saturated inbox had
// no place for was answered "retry" at once, and 1,000 devices sending at
// full speed had most of their envelopes read, refused and sent again,
// which took the CPU the commits needed (ingestor-bench -mode overload).
func (c *wsConn) commit(msg []byte, env devicewire.Envelope) {
	h := c.h
	span := envelopeSpan(h.env.tracing, h.env.source.Name, &env)
	in, err := h.env.inbox.enter(c.stop, h.env.source.Name, msg,
		[]Event{{Key: env.EventID, Time: env.TS, Len: len(msg), Device: env.DeviceID, Seq: env.Seq, Trace: span.SpanContext()}})
	if errors.Is(err, errGaveUp) {
		telemetry.End(span, err)
		c.pending.Done()
		<-c.slots
		return
	}
	go func() {
		var outs []Outcome
		if err == nil {
			outs, err = in.wait()
		}
		c.answerCommit(env, outs, err)
		telemetry.End(span, err)
	}()
}

// answerCommit answers an envelope with what its commit did.
func (c *wsConn) answerCommit(env devicewire.Envelope, outs []Outcome, err error) {
	h := c.h
	var busy *BusyError
	switch {
	case err == nil && outs[0].New:
		if env.Seq > 0 {
			h.lastSeq(env.DeviceID, env.Seq)
		}
		c.answer(devicewire.Ack{EventID: env.EventID, Status: devicewire.StatusStored, AckTS: now()}, env.DeviceID, 202)
	case err == nil:
		c.answer(devicewire.Ack{EventID: env.EventID, Status: devicewire.StatusStored, AckTS: now()}, env.DeviceID, 200)
	case errors.As(err, &busy):
		code := 429
		if busy.Unavailable {
			code = 503
		}
		c.answerRetry(devicewire.Ack{EventID: env.EventID, Status: devicewire.StatusRetry, Reason: busy.Reason, RetryAfterMS: busy.RetryAfter.Milliseconds()}, env.DeviceID, code)
	case errors.Is(err, ErrClosed):
		c.answer(devicewire.Ack{EventID: env.EventID, Status: devicewire.StatusRetry, Reason: "the daemon is shutting down", RetryAfterMS: busyRetryAfter.Milliseconds()}, env.DeviceID, 503)
	default:
		h.env.log.Error("ws_ingress: commit failed; the device is told to retry", "remote", c.remote, "event_id", env.EventID, "err", err)
		c.answer(devicewire.Ack{EventID: env.EventID, Status: devicewire.StatusRetry, Reason: "the daemon could not store it", RetryAfterMS: busyRetryAfter.Milliseconds()}, env.DeviceID, 503)
	}
}

// now is the time of an answer.
func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// answer writes a's answer, counts it and frees the envelope's slot. code
// is the HTTP status the answer stands for in the request metrics.
func (c *wsConn) answer(a devicewire.Ack, device string, code int) {
	defer func() { <-c.slots }()
	c.reply(a, device, code)
}

// answerRetry answers an envelope the inbox refused for now (a "retry" with
// retry_after_ms) and keeps its slot of the window until that wait is
// over: the device's next envelopes stay unread meanwhile (backpressure,
// at no cost) instead of being read only to be refused too. Without it, a
// device refused its window's envelopes sent its next ones at once, and
// 1,000 devices had every envelope refused in the first seconds of an
// overload, the refusals taking the CPU the commits needed.
func (c *wsConn) answerRetry(a devicewire.Ack, device string, code int) {
	time.AfterFunc(time.Duration(a.RetryAfterMS)*time.Millisecond, func() { <-c.slots })
	c.reply(a, device, code)
}

// reply writes a's answer and counts it.
func (c *wsConn) reply(a devicewire.Ack, device string, code int) {
	defer c.pending.Done()
	h := c.h
	status := a.Status
	if code == 200 {
		status = "duplicate"
	}
	h.env.metrics.Requests.WithLabelValues(h.env.source.Name, strconv.Itoa(code)).Inc()
	h.env.metrics.ws.envelopes.WithLabelValues(h.env.source.Name, h.labels.label(device), status).Inc()
	ctx, cancel := context.WithTimeout(context.Background(), h.writeTimeout)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, a.Encode()); err != nil {
		h.env.log.Debug("ws_ingress: answer not delivered; the device sends the envelope again", "remote", c.remote,
			"event_id", a.EventID, "status", a.Status, "err", err)
	}
}

// oversizeEventID finds the top-level event_id in the first bytes of an
// oversize message, or "" when they do not hold it before anything
// malformed (a key after a large payload is past the cut).
func oversizeEventID(prefix []byte) string {
	val, kind, ok := jsonscan.Field(prefix, "event_id")
	if !ok || kind != jsonscan.String {
		return ""
	}
	id, err := jsonscan.Unquote(val)
	if err != nil {
		return ""
	}
	return id
}
