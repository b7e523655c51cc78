package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/backoff"
	"github.com/ingestorhq/ingestor/internal/devicewire"
	"github.com/ingestorhq/ingestor/internal/telemetry"
)

// maxRetryAfter caps how long a "retry" answer can hold an envelope back.
const maxRetryAfter = 10 * time.Minute

// sender keeps one WebSocket connection to the daemon and sends it the
// outbox's rows, at most window of them unacknowledged at a time.
type sender struct {
	url          string
	header       http.Header
	client       *http.Client
	window       int
	ackTimeout   time.Duration
	writeTimeout time.Duration
	reconnect    backoff.Policy
	ob           *outbox
	log          *slog.Logger
	m            *metrics
	// tracer, when set, traces each envelope's send until its answer, in
	// the envelope's trace.
	tracer trace.Tracer
}

// flight is a row sent on the current connection and not yet answered.
type flight struct {
	id     int64
	sentAt time.Time
	// span is the send's span, ended by its answer or the connection's
	// end; nil when not traced.
	span trace.Span
}

// window is what one connection has sent and not had answered.
type window struct {
	// inflight holds the unanswered rows by event_id, ids their row ids.
	inflight map[string]flight
	ids      map[int64]bool
	// attempts are the rows sent whose attempt the outbox has not counted
	// yet: it counts them in the transaction of the next answers, so that
	// a send costs no commit of its own.
	attempts []int64
}

// run connects, sends and reconnects until ctx ends. A connection that
// ends is retried after a capped exponential backoff with full jitter,
// restarted from the first wait once a connection has had an answer.
func (s *sender) run(ctx context.Context) {
	attempt := 0
	for {
		answered, err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if answered {
			attempt = 0
		}
		wait := s.reconnect.Delay(attempt)
		attempt++
		s.log.Warn("daemon connection ended, reconnecting", "url", s.url, "err", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// session runs one connection until it fails or ctx ends. It reports
// whether the daemon answered at least one envelope on it.
func (s *sender) session(ctx context.Context) (answered bool, err error) {
	conn, err := s.dial(ctx)
	if err != nil {
		return false, err
	}
	s.m.connected.Set(1)
	defer s.m.connected.Set(0)
	s.m.connects.Inc()
	s.log.Info("connected to the daemon", "url", s.url)

	// The reader's context is not ctx: coder/websocket closes a connection
	// whose Read is cancelled, and a shutdown closes it properly below.
	rctx, stopReader := context.WithCancel(context.Background())
	acks := make(chan devicewire.Ack, s.window)
	readErr := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		readErr <- readAcks(rctx, conn, acks)
	}()
	w := &window{inflight: map[string]flight{}, ids: map[int64]bool{}}
	defer func() {
		for _, f := range w.inflight {
			if f.span != nil {
				telemetry.End(f.span, errors.New("no answer on this connection: sent again on the next"))
			}
		}
		stopReader()
		err = errors.Join(err, ignoreClosed(conn.CloseNow()))
		<-done
		if len(w.attempts) > 0 {
			// Count the attempts of what went unanswered, even on a shutdown.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			err = errors.Join(err, s.ob.sent(fctx, w.attempts))
			cancel()
		}
	}()
	ackTimer := time.NewTimer(time.Hour)
	defer ackTimer.Stop()
	dueTimer := time.NewTimer(time.Hour)
	defer dueTimer.Stop()
	for {
		if err := s.fill(ctx, conn, w); err != nil {
			return answered, err
		}
		oldest, err := s.armTimers(ctx, w, dueTimer, ackTimer)
		if err != nil {
			return answered, err
		}
		select {
		case <-ctx.Done():
			s.m.connected.Set(0)
			// Unanswered envelopes stay in the outbox and go again next start.
			return answered, ignoreClosed(conn.Close(websocket.StatusGoingAway, "forwarder shutting down"))
		case err := <-readErr:
			return answered, err
		case a := <-acks:
			answered = true
			if err := s.settle(ctx, a, acks, w); err != nil {
				return answered, err
			}
		case <-s.ob.notify:
		case <-dueTimer.C:
		case <-ackTimer.C:
			return answered, fmt.Errorf("no answer for event %s within ack_timeout %v", oldest, s.ackTimeout)
		}
	}
}

// dial opens the WebSocket connection to the daemon, within the write
// timeout.
func (s *sender) dial(ctx context.Context) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	conn, resp, err := websocket.Dial(dctx, s.url, &websocket.DialOptions{HTTPHeader: s.header, HTTPClient: s.client})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusUnauthorized {
			return nil, fmt.Errorf("connect to %s: the daemon refused the token (HTTP 401): check token or token_file", s.url)
		}
		return nil, fmt.Errorf("connect to %s: %w", s.url, err)
	}
	conn.SetReadLimit(64 << 10)
	return conn, nil
}

// armTimers sets due to fire when the outbox's next row is due (if the
// window has room) and ack when the oldest unanswered row's ack timeout
// ends, which it returns the event_id of ("" when none is in flight).
func (s *sender) armTimers(ctx context.Context, w *window, due, ack *time.Timer) (oldest string, err error) {
	resetTimer(due, time.Hour)
	if len(w.inflight) < s.window {
		at, ok, err := s.ob.nextDue(ctx)
		if err != nil {
			return "", err
		}
		if ok {
			resetTimer(due, time.Until(at))
		}
	}
	resetTimer(ack, time.Hour)
	for eid, f := range w.inflight {
		if oldest == "" || f.sentAt.Before(w.inflight[oldest].sentAt) {
			oldest = eid
		}
	}
	if oldest != "" {
		resetTimer(ack, time.Until(w.inflight[oldest].sentAt.Add(s.ackTimeout)))
	}
	return oldest, nil
}

// resetTimer makes t fire after d.
func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	t.Reset(max(d, 0))
}

// ignoreClosed drops the error of closing a connection that is already
// closed.
func ignoreClosed(err error) error {
	if err == nil || errors.Is(err, net.ErrClosed) || websocket.CloseStatus(err) != -1 {
		return nil
	}
	return err
}

// readAcks reads the daemon's messages into acks until the connection
// fails.
func readAcks(ctx context.Context, conn *websocket.Conn, acks chan<- devicewire.Ack) error {
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			if st := websocket.CloseStatus(err); st != -1 {
				var ce websocket.CloseError
				errors.As(err, &ce)
				return fmt.Errorf("the daemon closed the connection: status %d (%s) %q", st, st, ce.Reason)
			}
			return fmt.Errorf("read from the daemon: %w", err)
		}
		a, err := devicewire.DecodeAck(data)
		if typ != websocket.MessageText || err != nil {
			return fmt.Errorf("the daemon sent a message that is not a JSON ACK: %.200q", data)
		}
		select {
		case acks <- a:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// fill sends due rows until window envelopes are unanswered.
func (s *sender) fill(ctx context.Context, conn *websocket.Conn, w *window) error {
	free := s.window - len(w.inflight)
	if free <= 0 {
		return nil
	}
	rows, err := s.ob.pending(ctx, free, w.ids)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if _, dup := w.inflight[r.eventID]; dup {
			continue // the same event_id stored twice goes once its first copy is answered
		}
		wctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
		err := conn.Write(wctx, websocket.MessageText, r.env)
		cancel()
		if err != nil {
			return fmt.Errorf("send event %s: %w", r.eventID, err)
		}
		w.inflight[r.eventID] = flight{id: r.id, sentAt: time.Now(), span: s.sendSpan(r.eventID, r.env)}
		w.ids[r.id] = true
		w.attempts = append(w.attempts, r.id)
		s.m.sent.Inc()
	}
	return nil
}

// settle applies first and every other ACK already waiting to the outbox
// in one transaction, with the attempts not counted yet.
func (s *sender) settle(ctx context.Context, first devicewire.Ack, acks <-chan devicewire.Ack, w *window) error {
	var outs []outcome
	add := func(a devicewire.Ack) {
		f, ok := w.inflight[a.EventID]
		if !ok {
			s.log.Warn("ACK for an event not in flight, ignored", "event_id", a.EventID, "status", a.Status, "reason", a.Reason)
			return
		}
		out := outcome{id: f.id, status: a.Status, reason: a.Reason}
		switch a.Status {
		case devicewire.StatusStored:
			s.m.acked.Inc()
		case devicewire.StatusRejected:
			s.m.rejected.Inc()
			s.log.Error("the daemon rejected an event, moved to the local dead letters", "event_id", a.EventID, "reason", a.Reason)
		case devicewire.StatusRetry:
			s.m.retried.Inc()
			wait := time.Duration(a.RetryAfterMS) * time.Millisecond
			if wait <= 0 {
				wait = s.reconnect.Base
			}
			out.retryAt = time.Now().Add(min(wait, maxRetryAfter))
		default:
			s.log.Warn("ACK with an unknown status, ignored", "event_id", a.EventID, "status", a.Status)
			return
		}
		if f.span != nil {
			f.span.SetAttributes(attribute.String("ingestor.answer", a.Status))
			var err error
			if a.Status == devicewire.StatusRejected {
				err = errors.New("rejected: " + a.Reason)
			}
			telemetry.End(f.span, err)
		}
		delete(w.inflight, a.EventID)
		delete(w.ids, f.id)
		outs = append(outs, out)
	}
	add(first)
	for more := true; more; {
		select {
		case a := <-acks:
			add(a)
		default:
			more = false
		}
	}
	dropped, err := s.ob.settle(ctx, w.attempts, outs)
	if err != nil {
		return err
	}
	w.attempts = nil
	if dropped > 0 {
		s.log.Warn("local dead letters over their limit, oldest dropped", "dropped", dropped, "limit", maxDeadLetters)
	}
	return nil
}

// sendSpan starts the span of one envelope's send, under the envelope's
// traceparent (a sampled one only); nil when tracing is off or the
// envelope is not traced.
func (s *sender) sendSpan(eventID string, env []byte) trace.Span {
	if s.tracer == nil {
		return nil
	}
	e, err := devicewire.DecodeEnvelope(env)
	if err != nil || e.Traceparent == "" {
		return nil
	}
	ctx := telemetry.WithParent(context.Background(), e.Traceparent, e.Tracestate)
	if !trace.SpanContextFromContext(ctx).IsSampled() {
		return nil
	}
	_, span := s.tracer.Start(ctx, "edge send", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("ingestor.event_id", eventID)))
	return span
}
