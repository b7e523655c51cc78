// Package delivery moves committed frames from the write-ahead queue to the
// processors over ZeroMQ and brings their acks back.
//
// The Sender owns the PUSH socket on one goroutine. Fresh frames are sent
// from memory right after their commit; when the socket cannot take more
// (no processor connected, or its high-water mark reached) or the in-flight
// window is full, the Sender switches to backlog mode and streams pending
// frames from the queue in id order, a page at a time, reading payloads back
// from the raw store. A frame not acked in time is sent again with its
// delivery count raised; the wait grows with each delivery (see ackWait).
// Events that can never be delivered (max_deliveries reached, raw object
// gone) are dead-lettered one by one. Memory stays bounded by the in-flight
// window whatever the size of the backlog.
package delivery

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/backoff"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// SenderOptions configure a Sender.
type SenderOptions struct {
	// Endpoint is where the PUSH socket binds.
	Endpoint string
	// HighWaterMark is the socket's send high-water mark in frames.
	HighWaterMark int
	// AckTimeout is how long a sent frame waits for its ack.
	AckTimeout time.Duration
	// MaxInflight caps frames sent and not yet acked.
	MaxInflight int
	// MaxDeliveries moves a frame to the dead-letter list once it has been
	// delivered this many times without an ack; 0 means never.
	MaxDeliveries int
	Logger        *slog.Logger
	Metrics       *Metrics
	// Curve, when set, makes the socket a CURVE server for authorized
	// processors only.
	Curve *CurveServer
	// OnAck, when set, is called on the Sender's goroutine for every frame
	// acked while in flight, with its first event's fetch time and its size.
	OnAck func(fetchedAt time.Time, events int)
}

type inflight struct {
	deadline  time.Time
	fetchedAt time.Time
	events    int
}

// Sender delivers frames. Submit and Acked may be called from any goroutine.
type Sender struct {
	o     SenderOptions
	q     *queue.Queue
	raw   rawstore.Store
	sock  *zmq.Socket
	fresh chan []queue.Frame
	acked chan []int64
	// missed holds the lowest frame id whose Submit found the fresh channel
	// full (0 = none); the loop then scans the backlog from there.
	missed atomic.Int64

	// loop-goroutine state
	inflight map[int64]inflight
	backlog  bool
	scanFrom int64 // backlog scan resumes after this id
	scanned  int64 // highest id the backlog scan has handled
	enc      wire.Encoder
	rawCache map[string][]byte
	sent     []int64 // frames sent since the last delivery-count flush
	// blocked pauses the backlog scan until the next tick, after the
	// socket refused a frame or the queue could not be read.
	blocked   bool
	retry     *time.Ticker
	inflightN atomic.Int64
}

// NewSender binds the PUSH socket. Run must be called to deliver.
func NewSender(zctx *zmq.Context, q *queue.Queue, raw rawstore.Store, o SenderOptions) (*Sender, error) {
	if o.MaxInflight <= 0 {
		o.MaxInflight = 1024
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	sock, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		return nil, fmt.Errorf("publish socket: %w", err)
	}
	setup := errors.Join(sock.SetSndhwm(o.HighWaterMark), sock.SetLinger(0), sock.SetImmediate(true), o.Curve.secure(sock))
	if setup == nil {
		setup = sock.Bind(o.Endpoint)
	}
	if setup != nil {
		return nil, fmt.Errorf("publish socket %s: %w", o.Endpoint, errors.Join(setup, sock.Close()))
	}
	return &Sender{
		o:        o,
		q:        q,
		raw:      raw,
		sock:     sock,
		fresh:    make(chan []queue.Frame, freshBuffer),
		acked:    make(chan []int64, 256),
		inflight: make(map[int64]inflight),
		rawCache: make(map[string][]byte),
		// Pending frames from an earlier run are due now: start by scanning.
		backlog: true,
	}, nil
}

// freshBuffer is how many committed batches may wait for the loop; beyond
// it they are left to the backlog scan, which keeps memory bounded when the
// loop falls behind.
const freshBuffer = 32

// Submit hands freshly committed frames to the Sender. It never blocks: if
// the Sender is behind, the frames (already durable) are picked up from the
// queue by the backlog scan instead.
func (s *Sender) Submit(frames []queue.Frame) {
	if len(frames) == 0 {
		return
	}
	select {
	case s.fresh <- frames:
	default:
		id := frames[0].ID
		for {
			cur := s.missed.Load()
			if (cur != 0 && cur <= id) || s.missed.CompareAndSwap(cur, id) {
				return
			}
		}
	}
}

// Acked tells the Sender which frames the queue cleared. It blocks only
// until the loop takes the list or ctx ends.
func (s *Sender) Acked(ctx context.Context, ids []int64) {
	select {
	case s.acked <- ids:
	case <-ctx.Done():
	}
}

// Inflight returns the number of frames sent and not yet acked.
func (s *Sender) Inflight() int { return int(s.inflightN.Load()) }

// tick is how often the loop checks deadlines and the backlog.
func (s *Sender) tick() time.Duration {
	return min(max(s.o.AckTimeout/4, 10*time.Millisecond), 250*time.Millisecond)
}

// Run delivers until ctx ends, then closes the socket.
func (s *Sender) Run(ctx context.Context) error {
	defer func() {
		if err := s.sock.Close(); err != nil {
			s.o.Logger.Warn("close publish socket", "err", err)
		}
	}()
	t := time.NewTicker(s.tick())
	defer t.Stop()
	s.retry = time.NewTicker(retryBlocked)
	defer s.retry.Stop()
	for {
		// While a backlog can be sent, scan it one page at a time and
		// look at acks and fresh frames between pages, so that neither
		// waits for the whole backlog.
		var more <-chan time.Time
		if s.backlog && len(s.inflight) < s.o.MaxInflight {
			more = closedTimer
			if s.blocked {
				more = s.retry.C
			}
		}
		select {
		case <-ctx.Done():
			s.flushDeliveries(context.WithoutCancel(ctx))
			return nil
		case frames := <-s.fresh:
			s.sendFresh(frames)
		case ids := <-s.acked:
			// Acks mean processors are taking frames: try the socket again.
			s.blocked = false
			s.clearAcked(ids)
		case <-more:
			s.blocked = false
			s.scanPage(ctx)
		case <-t.C:
			s.blocked = false
			s.expire()
			if m := s.missed.Swap(0); m != 0 {
				s.enterBacklog(m)
			}
			s.flushDeliveries(ctx)
			s.o.Metrics.inflight.Set(float64(len(s.inflight)))
		}
	}
}

// retryBlocked is how soon a backlog scan retries after the socket refused
// a frame (its high-water mark was reached or no processor is connected).
const retryBlocked = 5 * time.Millisecond

// closedTimer is always ready: selecting on it means "go on right away".
var closedTimer = func() <-chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}()

// flushDeliveries records the deliveries made since the last flush. The
// count is best effort: a crash before a flush leaves it one low, which
// errs towards one more delivery before max_deliveries.
func (s *Sender) flushDeliveries(ctx context.Context) {
	if len(s.sent) == 0 {
		return
	}
	if err := s.q.CountDeliveries(ctx, s.sent); err != nil && ctx.Err() == nil {
		s.o.Logger.Error("count deliveries", "err", err)
	}
	s.sent = s.sent[:0]
}

func (s *Sender) enterBacklog(fromID int64) {
	if !s.backlog || fromID-1 < s.scanFrom {
		s.scanFrom = fromID - 1
	}
	s.backlog = true
}

func (s *Sender) sendFresh(frames []queue.Frame) {
	for i := range frames {
		f := &frames[i]
		if f.ID <= s.scanned {
			continue // the backlog scan already handled it
		}
		if s.backlog || len(s.inflight) >= s.o.MaxInflight || !hasPayloads(f) {
			// Frames submitted without payloads (replayed dead letters)
			// are read back from the raw store by the backlog scan.
			s.enterBacklog(f.ID)
			return
		}
		if !s.send(f) {
			s.enterBacklog(f.ID)
			return
		}
	}
}

func hasPayloads(f *queue.Frame) bool {
	for i := range f.Events {
		if f.Events[i].Payload == nil {
			return false
		}
	}
	return true
}

// send encodes and sends f without blocking; it reports false when the
// socket would block.
func (s *Sender) send(f *queue.Frame) bool {
	delivery := f.Deliveries + 1
	s.enc.Begin(f.ID, delivery, s.raw.String())
	for i := range f.Events {
		e := &f.Events[i]
		ev := wire.Event{
			Key: e.Key, Source: e.Source, Seq: e.Seq, FetchedAt: e.FetchedAt, EventTime: e.EventTime,
			Raw: wire.RawRef{Key: e.RawKey, Off: e.RawOff, Len: e.RawLen},
		}
		s.enc.Add(&ev, e.Payload, true)
	}
	if _, err := s.sock.SendBytes(s.enc.End(), zmq.DONTWAIT); err != nil {
		if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
			s.o.Logger.Error("send frame", "frame", f.ID, "err", err)
		}
		s.o.Metrics.sendBlocked.Inc()
		s.blocked = true // until the next tick
		return false
	}
	s.sent = append(s.sent, f.ID)
	now := time.Now()
	var fetched time.Time
	if len(f.Events) > 0 {
		fetched = f.Events[0].FetchedAt
	}
	s.inflight[f.ID] = inflight{deadline: now.Add(s.ackWait(delivery)), fetchedAt: fetched, events: len(f.Events)}
	s.inflightN.Store(int64(len(s.inflight)))
	s.o.Metrics.framesSent.Inc()
	s.o.Metrics.eventsSent.Add(float64(len(f.Events)))
	if delivery > 1 {
		s.o.Metrics.framesResent.Inc()
	}
	return true
}

// ackWait is how long delivery number delivery (from 1) of a frame waits
// for its ack before the frame is sent again. The first delivery waits the
// ack timeout; later ones back off: the ceiling doubles with each delivery,
// ack_timeout*2^(delivery-1) capped at 10*ack_timeout, and the wait is
// uniform between the ack timeout and the ceiling. A processor always gets
// at least the ack timeout, and a poison frame is retried ever more slowly,
// with resends of many frames spread out instead of arriving in bursts.
func (s *Sender) ackWait(delivery int) time.Duration {
	ceiling := backoff.Policy{Base: s.o.AckTimeout, Max: 10 * s.o.AckTimeout}.Ceiling(delivery - 1)
	extra := ceiling - s.o.AckTimeout
	if extra <= 0 {
		return s.o.AckTimeout
	}
	return s.o.AckTimeout + backoff.Policy{Base: extra, Max: extra}.Delay(0)
}

func (s *Sender) clearAcked(ids []int64) {
	now := time.Now()
	for _, id := range ids {
		in, ok := s.inflight[id]
		if !ok {
			continue
		}
		delete(s.inflight, id)
		if !in.fetchedAt.IsZero() {
			s.o.Metrics.fetchToAck.Observe(now.Sub(in.fetchedAt).Seconds())
			if s.o.OnAck != nil {
				s.o.OnAck(in.fetchedAt, in.events)
			}
		}
	}
	s.inflightN.Store(int64(len(s.inflight)))
}

// expire drops frames whose ack is overdue from the window and schedules
// them for resending through the backlog scan.
func (s *Sender) expire() {
	now := time.Now()
	var lowest int64
	for id, in := range s.inflight {
		if now.After(in.deadline) {
			delete(s.inflight, id)
			s.o.Metrics.ackTimeouts.Inc()
			if lowest == 0 || id < lowest {
				lowest = id
			}
		}
	}
	if lowest != 0 {
		s.inflightN.Store(int64(len(s.inflight)))
		s.enterBacklog(lowest)
	}
}

// scanPage is how many frame ids one backlog query returns.
const scanPage = 256

// scanPage sends pending frames in id order from one page of the queue,
// until the window is full or the socket would block. An empty page ends
// the backlog.
func (s *Sender) scanPage(ctx context.Context) {
	defer clear(s.rawCache)
	ids, err := s.q.FramesAfter(ctx, s.scanFrom, scanPage)
	if err != nil {
		if ctx.Err() == nil {
			s.o.Logger.Error("scan queue backlog", "err", err)
		}
		s.blocked = true // retry on the next tick
		return
	}
	if len(ids) == 0 {
		s.backlog = false
		return
	}
	for _, id := range ids {
		if len(s.inflight) >= s.o.MaxInflight {
			return
		}
		if _, busy := s.inflight[id]; busy {
			s.scanFrom = id
			continue
		}
		f, ok, err := s.q.LoadFrame(ctx, id)
		if err != nil {
			if ctx.Err() == nil {
				s.o.Logger.Error("load frame", "frame", id, "err", err)
			}
			s.blocked = true
			return
		}
		if !ok || len(f.Events) == 0 {
			s.scanFrom, s.scanned = id, max(s.scanned, id)
			continue
		}
		if s.o.MaxDeliveries > 0 && f.Deliveries >= s.o.MaxDeliveries {
			reason := fmt.Sprintf("not acked after %d deliveries", f.Deliveries)
			n, err := s.q.DeadLetterFrame(ctx, id, reason)
			if err != nil {
				s.o.Logger.Error("dead-letter frame", "frame", id, "err", err)
				s.blocked = true
				return
			}
			s.o.Logger.Warn("frame dead-lettered", "frame", id, "source", f.Source, "events", n, "reason", reason)
			s.o.Metrics.deadLettered.Inc()
			s.o.Metrics.eventsDeadLettered.Add(float64(n))
			s.scanFrom, s.scanned = id, max(s.scanned, id)
			continue
		}
		if ok, err := s.fillOrDeadLetter(ctx, &f); err != nil {
			if ctx.Err() == nil {
				s.o.Logger.Error("read raw payloads for resend", "frame", id, "err", err)
			}
			s.blocked = true
			return
		} else if !ok {
			s.scanFrom, s.scanned = id, max(s.scanned, id)
			continue
		}
		if !s.send(&f) {
			return
		}
		s.scanFrom, s.scanned = id, max(s.scanned, id)
	}
}

// fillOrDeadLetter reads f's payloads from the raw store. Events whose raw
// object is gone for good (fs.ErrNotExist) can never be delivered: they are
// dead-lettered, so that they do not hold the backlog up forever, and f is
// reloaded without them. ok is false when nothing of f is left to send.
// Any other error is returned: the frame is retried on the next tick.
func (s *Sender) fillOrDeadLetter(ctx context.Context, f *queue.Frame) (ok bool, err error) {
	for {
		err := s.fillPayloads(ctx, f)
		var missing *missingRawError
		if !errors.As(err, &missing) {
			return err == nil, err
		}
		var seqs []int64
		for _, e := range f.Events {
			if e.RawKey == missing.key {
				seqs = append(seqs, e.Seq)
			}
		}
		reason := "raw object missing: " + missing.key
		n, err := s.q.DeadLetterEvents(ctx, f.ID, seqs, reason)
		if err != nil {
			return false, err
		}
		s.o.Logger.Warn("events dead-lettered", "frame", f.ID, "source", f.Source, "events", n, "reason", reason)
		s.o.Metrics.eventsDeadLettered.Add(float64(n))
		again, pending, err := s.q.LoadFrame(ctx, f.ID)
		if err != nil {
			return false, err
		}
		if !pending || len(again.Events) == 0 {
			return false, nil
		}
		*f = again
	}
}

// missingRawError reports a raw object that no longer exists.
type missingRawError struct {
	key string
	err error
}

func (e *missingRawError) Error() string { return fmt.Sprintf("raw object %s: %v", e.key, e.err) }
func (e *missingRawError) Unwrap() error { return e.err }

// maxRawCache bounds the raw objects kept while one scan runs.
const maxRawCache = 16

func (s *Sender) fillPayloads(ctx context.Context, f *queue.Frame) error {
	for i := range f.Events {
		e := &f.Events[i]
		body, ok := s.rawCache[e.RawKey]
		if !ok {
			var err error
			if body, err = s.raw.Get(ctx, e.RawKey); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return &missingRawError{key: e.RawKey, err: err}
				}
				return fmt.Errorf("raw object %s: %w", e.RawKey, err)
			}
			if len(s.rawCache) >= maxRawCache {
				clear(s.rawCache)
			}
			s.rawCache[e.RawKey] = body
		}
		if e.RawOff < 0 || e.RawOff+e.RawLen > len(body) {
			return fmt.Errorf("raw object %s: event %d range [%d,+%d) outside %d bytes", e.RawKey, e.Seq, e.RawOff, e.RawLen, len(body))
		}
		e.Payload = body[e.RawOff : e.RawOff+e.RawLen]
	}
	return nil
}
