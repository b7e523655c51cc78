// Package delivery moves committed frames from the write-ahead queue to the
// processors over ZeroMQ and brings their acks back.
//
// The Sender owns the PUSH socket on one goroutine. Fresh frames are sent
// from memory right after their commit; when the socket cannot take more
// (no processor connected, or its high-water mark reached) or the in-flight
// window is full, the Sender switches to backlog mode and streams pending
// frames from the queue in id order, a page at a time. A prefetch goroutine
// loads those frames and reads their payloads back from the raw store, and
// hands them to the loop ready to send over a small channel, so a slow raw
// store never holds up the loop, which also applies acks. A frame not acked
// in time is sent again with its delivery count raised; the wait grows with
// each delivery (see ackWait). Events that can never be delivered
// (max_deliveries reached, raw object gone) are dead-lettered one by one.
// Memory stays bounded by the in-flight window and the prefetch depth
// whatever the size of the backlog.
package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.opentelemetry.io/otel/trace"

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
	// Member, in cluster mode, is this daemon's member name, carried by
	// every frame ("member").
	Member string
	// OnAck, when set, is called on the Sender's goroutine for every frame
	// acked while in flight, with its first event's fetch time and its size.
	OnAck func(fetchedAt time.Time, events int)
	// Tracer, when set, traces the send and the ack of every frame holding
	// traced events, in each of their traces.
	Tracer trace.Tracer
	// CacheBytes bounds the frames held in memory from Submit to their
	// first send (frameCache); 0 holds none, and every frame not sent at
	// once is read back.
	CacheBytes int64
}

type inflight struct {
	deadline  time.Time
	fetchedAt time.Time
	events    int
	// sends are the contexts of the frame's send spans, one per trace its
	// events belong to (nil when none is traced); its ack spans go under
	// them.
	sends []trace.SpanContext
	sent  time.Time
}

// Sender delivers frames. Submit and Acked may be called from any goroutine.
type Sender struct {
	o     SenderOptions
	q     *queue.Queue
	raw   rawstore.Store
	sock  *zmq.Socket
	cache *frameCache
	fresh chan []queue.Frame
	acked chan []int64
	// missed holds the lowest frame id whose Submit found the fresh channel
	// full (0 = none); the loop then scans the backlog from there.
	missed atomic.Int64

	// scanReq carries the loop's backlog requests to the prefetcher, and
	// ready brings the frames back, in id order.
	scanReq chan scanRequest
	ready   chan prefetched
	// submitted is the highest frame id handed to Submit: a pending frame
	// above it is committed and about to be submitted (prefetch.go,
	// notYetSubmitted).
	submitted atomic.Int64
	// scanEpoch is the loop's epoch, for the prefetcher to notice that its
	// request was superseded.
	scanEpoch atomic.Uint64
	// inflightMu guards writes to inflight (made by the loop) against the
	// prefetcher's reads.
	inflightMu sync.Mutex

	// loop-goroutine state
	inflight map[int64]inflight
	backlog  bool
	scanFrom int64 // backlog scan resumes after this id
	scanned  int64 // highest id the backlog scan has handled
	// epoch numbers backlog scans: a rewind starts a new one, and frames
	// prefetched for an earlier one are dropped.
	epoch uint64
	// requested is set while a scan request of this epoch is unanswered;
	// rescan records that frames may have been queued since it was made.
	requested, rescan bool
	// scanFailed pauses the backlog scan until the next tick, after the
	// queue or the raw store failed.
	scanFailed bool
	// held is a prefetched frame the socket refused, sent again on the
	// next retry or ack.
	held *readyFrame
	// settled holds frames cleared while the scan might have them in the
	// prefetch pipeline, so they are neither sent again nor taken for
	// frames whose ack wait ran out.
	settled   map[int64]bool
	enc       wire.Encoder
	sent      []int64 // frames sent since the last delivery-count flush
	retry     *time.Ticker
	inflightN atomic.Int64
	// freshWaiting counts batches Submit handed over that the loop has not
	// finished with; busy is the loop's view after its last step: frames
	// in flight, or a backlog it can send now. Delivering reads both.
	freshWaiting atomic.Int64
	busy         atomic.Bool
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
	s := &Sender{
		o:        o,
		q:        q,
		raw:      raw,
		sock:     sock,
		fresh:    make(chan []queue.Frame, freshBuffer),
		acked:    make(chan []int64, 256),
		scanReq:  make(chan scanRequest, 1),
		ready:    make(chan prefetched, prefetchDepth),
		inflight: make(map[int64]inflight),
		settled:  make(map[int64]bool),
		cache:    newFrameCache(o.CacheBytes, o.Metrics),
		// Pending frames from an earlier run are due now: start by scanning.
		backlog: true,
	}
	s.enc.SetMember(o.Member)
	return s, nil
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
	s.cache.add(frames)
	last := frames[len(frames)-1].ID
	for {
		cur := s.submitted.Load()
		if cur >= last || s.submitted.CompareAndSwap(cur, last) {
			break
		}
	}
	s.freshWaiting.Add(1)
	select {
	case s.fresh <- frames:
	default:
		s.freshWaiting.Add(-1)
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

// Forget tells the Sender that events of frames ids were settled one by
// one (acked by key, or dead-lettered) while the frames stay pending: what
// it holds of them in memory is dropped, and they are read back when sent
// again, without those events.
func (s *Sender) Forget(ids []int64) { s.cache.drop(ids...) }

// Inflight returns the number of frames sent and not yet acked.
func (s *Sender) Inflight() int { return int(s.inflightN.Load()) }

// Delivering reports whether the Sender still has work a processor can
// take: frames sent and not yet acked, frames Submit handed over and the
// loop has not sent, or backlog frames it can send now. It is false while
// the socket refuses frames (no processor connected, or the high-water
// mark reached with nothing in flight) and while the backlog scan failed,
// so a drain that waits for it does not wait for what cannot be sent.
func (s *Sender) Delivering() bool {
	return s.freshWaiting.Load() > 0 || s.missed.Load() != 0 || s.busy.Load()
}

// storeBusy publishes the loop's state for Delivering.
func (s *Sender) storeBusy() {
	s.busy.Store(len(s.inflight) > 0 || (s.backlog && s.held == nil && !s.scanFailed))
}

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
	pctx, stopPrefetch := context.WithCancel(ctx)
	prefetchDone := make(chan struct{})
	go func() {
		defer close(prefetchDone)
		s.prefetch(pctx)
	}()
	// The prefetcher uses the queue: it stops before Run returns.
	defer func() {
		stopPrefetch()
		<-prefetchDone
	}()
	t := time.NewTicker(s.tick())
	defer t.Stop()
	s.retry = time.NewTicker(retryBlocked)
	defer s.retry.Stop()
	for {
		// While a backlog can be sent, the prefetcher loads it a page at
		// a time; acks and fresh frames are handled between frames, so
		// that neither waits for the backlog or the raw store.
		s.requestScan()
		s.storeBusy()
		var ready <-chan prefetched
		if s.held == nil && len(s.inflight) < s.o.MaxInflight {
			ready = s.ready
		}
		var retry <-chan time.Time
		if s.held != nil {
			retry = s.retry.C
		}
		select {
		case <-ctx.Done():
			s.flushDeliveries(context.WithoutCancel(ctx))
			return nil
		case frames := <-s.fresh:
			s.sendFresh(frames)
			// Published before the batch stops counting as waiting, so
			// that Delivering never reads false in between.
			s.storeBusy()
			s.freshWaiting.Add(-1)
		case ids := <-s.acked:
			s.clearAcked(ids)
			// Acks mean processors are taking frames: try the socket again.
			s.sendHeld()
		case p := <-ready:
			s.handle(p)
		case <-retry:
			s.sendHeld()
		case <-t.C:
			s.scanFailed = false
			s.expire()
			if m := s.missed.Load(); m != 0 {
				s.enterBacklog(m)
				s.storeBusy()
				// A Submit that lowered it meanwhile is taken next tick.
				s.missed.CompareAndSwap(m, 0)
			}
			s.flushDeliveries(ctx)
			s.o.Metrics.inflight.Set(float64(len(s.inflight)))
		}
	}
}

// retryBlocked is how soon a backlog frame is sent again after the socket
// refused it (its high-water mark was reached or no processor is connected).
const retryBlocked = 5 * time.Millisecond

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

// enterBacklog has the backlog scan cover the pending frames from fromID.
func (s *Sender) enterBacklog(fromID int64) {
	if !s.backlog || fromID-1 < s.scanFrom {
		s.scanFrom = fromID - 1
		s.restartScan()
	}
	s.backlog, s.rescan = true, true
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
		if !s.send(f, nil) {
			s.enterBacklog(f.ID)
			return
		}
	}
}

func hasPayloads(f *queue.Frame) bool {
	if f.PayloadsReleased() {
		return false // never, by design: a frame is encoded from memory once
	}
	for i := range f.Events {
		if f.Events[i].Payload == nil {
			return false
		}
	}
	return true
}

// send encodes and sends f without blocking; it reports false when the
// socket would block. The events notJSON marks (it may be nil) go out as
// payload_b64, and so does any payload that is not valid UTF-8.
func (s *Sender) send(f *queue.Frame, notJSON []bool) bool {
	delivery := f.Deliveries + 1
	s.enc.Begin(f.ID, delivery, s.raw.String())
	for i := range f.Events {
		e := &f.Events[i]
		ev := wire.Event{
			Key: e.Key, Source: e.Source, Seq: e.Seq, FetchedAt: e.FetchedAt, EventTime: e.EventTime,
			Raw: wire.RawRef{Key: e.RawKey, Off: e.RawOff, Len: e.RawLen},
		}
		if e.Trace != nil {
			ev.Traceparent, ev.Tracestate = e.Trace.Parent, e.Trace.State
		}
		s.enc.Add(&ev, e.Payload, notJSON == nil || !notJSON[i])
	}
	if _, err := s.sock.SendBytes(s.enc.End(), zmq.DONTWAIT); err != nil {
		if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
			s.o.Logger.Error("send frame", "frame", f.ID, "err", err)
		}
		s.o.Metrics.sendBlocked.Inc()
		return false
	}
	// Encoded and handed to ZeroMQ, which copied the bytes: the payloads'
	// pooled buffer may go to a later fetch once the page's other frames
	// are sent too. A resend reads them back from the raw store.
	f.ReleasePayloads()
	s.sent = append(s.sent, f.ID)
	now := time.Now()
	var fetched time.Time
	if len(f.Events) > 0 {
		fetched = f.Events[0].FetchedAt
	}
	if delivery == 1 && !f.Committed.IsZero() {
		s.o.Metrics.publish.Observe(now.Sub(f.Committed).Seconds())
	}
	s.inflightMu.Lock()
	s.inflight[f.ID] = inflight{deadline: now.Add(s.ackWait(delivery)), fetchedAt: fetched, events: len(f.Events),
		sends: s.traceSend(f, delivery), sent: now}
	s.inflightMu.Unlock()
	// Dropped once registered in flight: the prefetcher, which looks in the
	// cache first, finds the frame in one or the other (prefetchFrame).
	s.cache.drop(f.ID)
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
	s.cache.drop(ids...)
	now := time.Now()
	for _, id := range ids {
		if s.backlog && id > s.scanFrom {
			s.settled[id] = true // the prefetcher may have passed it already
		}
		in, ok := s.inflight[id]
		if !ok {
			continue
		}
		s.inflightMu.Lock()
		delete(s.inflight, id)
		s.inflightMu.Unlock()
		s.traceAck(id, in, now)
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
			s.inflightMu.Lock()
			delete(s.inflight, id)
			s.inflightMu.Unlock()
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

// requestScan asks the prefetcher for the next page of the backlog when
// one is due and the window has room.
func (s *Sender) requestScan() {
	if !s.backlog || s.requested || s.scanFailed || s.held != nil || len(s.inflight) >= s.o.MaxInflight {
		return
	}
	s.requested, s.rescan = true, false
	select {
	case <-s.scanReq: // a superseded request the prefetcher has not taken
	default:
	}
	s.scanReq <- scanRequest{epoch: s.epoch, after: s.scanFrom}
}

// restartScan starts a new scan epoch: what the prefetcher loaded for the
// old one is dropped.
func (s *Sender) restartScan() {
	s.epoch++
	s.scanEpoch.Store(s.epoch)
	s.requested, s.held = false, nil
	clear(s.settled)
}

// handle takes one result of the prefetcher.
func (s *Sender) handle(p prefetched) {
	if p.epoch != s.epoch {
		return // loaded for a scan that was restarted since
	}
	switch {
	case p.done:
		s.requested = false
		if p.err != nil || p.notYet {
			s.scanFailed = true // retried on the next tick
		} else if p.empty && !s.rescan {
			s.backlog = false
			clear(s.settled)
		}
		return
	case p.inFlight:
		if _, busy := s.inflight[p.id]; !busy && !s.settled[p.id] {
			// Its ack wait ran out after the prefetcher passed it: scan
			// again from it, so that it is sent again.
			s.scanFrom = p.id - 1
			s.restartScan()
			return
		}
	case p.frame != nil && !s.settled[p.id]:
		if p.frame.PayloadsReleased() {
			// Sent meanwhile from another copy (never, by design): scan
			// again from it, reading it back if it is still pending.
			s.scanFrom = p.id - 1
			s.restartScan()
			return
		}
		if _, busy := s.inflight[p.id]; !busy && !s.send(&p.frame.Frame, p.frame.notJSON) {
			s.held = p.frame
			return
		}
	}
	delete(s.settled, p.id)
	s.scanFrom, s.scanned = p.id, max(s.scanned, p.id)
}

// sendHeld sends the frame the socket refused, if any.
func (s *Sender) sendHeld() {
	f := s.held
	if f != nil && f.PayloadsReleased() { // never, by design (see handle)
		s.scanFrom = f.ID - 1
		s.restartScan()
		return
	}
	if f == nil || (!s.settled[f.ID] && !s.send(&f.Frame, f.notJSON)) {
		return
	}
	s.held = nil
	delete(s.settled, f.ID)
	s.scanFrom, s.scanned = f.ID, max(s.scanned, f.ID)
}
