package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/wire"
	"github.com/ingestorhq/ingestor/internal/zmqpull"
)

// Handler processes one event. Returning nil acknowledges the event. An
// error nacks it: an error made by Permanent (or wrapping one) is a
// permanent nack, which moves the event to the daemon's dead-letter list at
// once; any other error is a retryable nack, and the daemon delivers the
// event again on its backoff schedule. Either way the error is logged and
// its text sent as the nack's reason. ctx is the context given to Run: a
// Handler may give up when it is done, returning an error that wraps
// ctx.Err(), which leaves the event unacknowledged without a nack or a
// failure.
type Handler func(ctx context.Context, ev *Event) error

// Options configure a Client.
type Options struct {
	// Endpoint is the daemon's PUSH endpoint, its publish.endpoint, which the
	// Client connects a PULL socket to, e.g. "tcp://127.0.0.1:5557".
	// Required.
	Endpoint string
	// AckEndpoint is the daemon's PULL endpoint for acks, its
	// publish.ack_endpoint, which the Client connects a PUSH socket to, e.g.
	// "tcp://127.0.0.1:5558". Required, and different from Endpoint.
	AckEndpoint string
	// Logger receives the Client's logs. Default slog.Default().
	Logger *slog.Logger
	// ReceiveHWM is the most frames queued on the receiving socket before
	// the daemon sends to other processors instead. Frames queued when Run
	// stops are redelivered after the ack timeout, so a smaller value means
	// fewer redeliveries on restart. Default 1000.
	ReceiveHWM int
	// AckFlushInterval is the longest an ack waits in a batch while frames
	// keep arriving. Default 20ms.
	AckFlushInterval time.Duration
	// Workers is how many frames are processed at once, each by one worker
	// goroutine, its events in order. Frames carry no ordering promise, so
	// with more than one worker two frames' events interleave. Default 1.
	Workers int
	// DedupeDB is the path of a SQLite database in which Run records every
	// (source, key) it processed, in a table named processed. When set, an
	// event already recorded there is not passed to the Handler again: it
	// is acknowledged and counted in Stats.Duplicates. The record is
	// written after the Handler returns, so a crash in between still
	// repeats the Handler; RunTx closes that gap. Not used by RunTx, which
	// keeps the table in the handler's own database.
	DedupeDB string
	// DedupeCacheSize is how many processed keys are kept in memory in
	// front of the processed table, by DedupeDB and RunTx. Default 100000.
	DedupeCacheSize int
	// DedupeRetention is how long a key stays in the processed table (of
	// DedupeDB or RunTx) after it was processed, counted in the time a
	// Client ran on the database, never in downtime: a key applied just
	// before a crash can come again whenever the processor is back
	// (PROTOCOL.md, "How long to remember a key"). Older keys are deleted
	// in the background, a thousand at a time. Default
	// DefaultDedupeRetention; negative keeps every key.
	DedupeRetention time.Duration
	// ValidatePayloads checks every payload's JSON syntax again as frames
	// are decoded. By default the client trusts the daemon, which
	// validated each payload before it queued it (PROTOCOL.md, "What a
	// processor may rely on"), and reads payloads without looking into
	// them, which halves the cost of decoding a frame; set it for a
	// daemon you do not trust to have done so (a frame with an invalid
	// payload is then dropped as malformed).
	ValidatePayloads bool
	// RecycleFrames reuses the memory of each frame once its events are
	// handled: the buffer it was received into, which Event.Payload
	// points into, and the Events themselves. That saves allocating, and
	// collecting, every frame (~75 KB for 100 events of 500 B). Set it
	// only when the Handler (or TxHandler) keeps neither the *Event nor
	// its Payload slice past its return: a Payload kept would change
	// under it as the next frame is received. Strings (Key, Source,
	// Traceparent, ...) and PayloadBase64 are the handler's to keep.
	// The example processor sets it.
	RecycleFrames bool
	// TracerProvider, when set, wraps the Handler's call for every event
	// the daemon traced (Event.Traceparent) in a "process" span of the
	// event's trace. Without it the Handler's context still carries the
	// event's trace context, for the handler's own spans.
	TracerProvider trace.TracerProvider
	// CurveServerKey is the daemon's CURVE public key in Z85 (40
	// characters): the public half of its publish.curve_secret_key_file.
	// Set it and CurveSecretKey to connect to a daemon that uses CURVE;
	// leave both empty for one that does not. ReadCurveKey reads it from
	// the .pub file `ingestor curve-keygen` writes.
	CurveServerKey string
	// CurveSecretKey is this processor's CURVE secret key in Z85. Its
	// public key must be listed in the daemon's
	// publish.curve_authorized_keys_file, or the daemon refuses the
	// connection and the processor receives nothing. ReadCurveKey reads it
	// from the .key file `ingestor curve-keygen` writes. It is never logged.
	CurveSecretKey string
	// DropAcks is the probability, from 0 to 1, of dropping a whole ack
	// message instead of sending it. For testing only: it simulates acks
	// lost in transit or a processor crashing before its acks left, so
	// that chaos tests can check that redeliveries are absorbed. Dropped
	// messages are counted in Stats.AcksDropped. Default 0.
	DropAcks float64
}

// Defaults of Options.
const (
	DefaultReceiveHWM       = 1000
	DefaultAckFlushInterval = 20 * time.Millisecond
	DefaultWorkers          = 1
	DefaultDedupeCacheSize  = 100_000
)

const (
	// pollInterval bounds how long a blocked ack send goes without
	// looking at its context.
	pollInterval = 100 * time.Millisecond
	// closeLinger bounds how long the acks still queued at stop may take
	// to leave.
	closeLinger = time.Second
	// maxReasonBytes bounds a nack's reason.
	maxReasonBytes = wire.MaxReasonBytes
)

// Stats are a Client's counters since New.
type Stats struct {
	// Frames counts frames received and decoded.
	Frames int64
	// Events counts events taken up for processing: passed to the Handler
	// or skipped as duplicates.
	Events int64
	// Acked counts events whose acks were handed to ZeroMQ for sending,
	// in whole frames and one by one alike.
	Acked int64
	// Failed counts events the Handler returned an error for or panicked
	// on, each of which was nacked; an error wrapping the context's error
	// once Run is stopping is not a failure.
	Failed int64
	// Permanent counts the failures nacked as permanent.
	Permanent int64
	// Duplicates counts events skipped because their (source, key) was
	// already processed (DedupeDB or RunTx); they are acknowledged again.
	Duplicates int64
	// Malformed counts messages that were not a valid version 1 events
	// frame; they are logged, not acknowledged.
	Malformed int64
	// Redeliveries counts decoded frames whose delivery number was above 1.
	Redeliveries int64
	// AcksDropped counts ack messages dropped on purpose (Options.DropAcks).
	AcksDropped int64
	// Forgotten counts processed keys deleted past Options.DedupeRetention.
	Forgotten int64
}

// Client receives events from a daemon and acknowledges them. Its methods
// are safe for concurrent use, but only one Run or RunTx may be active at a
// time.
type Client struct {
	opts    Options
	log     *slog.Logger
	curve   *curveClient // nil without CURVE
	running atomic.Bool

	frames, events, acked, failed, permanent, duplicates atomic.Int64
	malformed, redeliveries, acksDropped, forgotten      atomic.Int64
}

// New checks o, applies its defaults and returns a Client. It does not
// connect: Run does.
func New(o Options) (*Client, error) {
	var errs []error
	if o.Endpoint == "" {
		errs = append(errs, errors.New("endpoint is required"))
	}
	if o.AckEndpoint == "" {
		errs = append(errs, errors.New("ack endpoint is required"))
	}
	if o.Endpoint != "" && o.Endpoint == o.AckEndpoint {
		errs = append(errs, fmt.Errorf("ack endpoint must differ from endpoint %q", o.Endpoint))
	}
	if o.ReceiveHWM < 0 {
		errs = append(errs, fmt.Errorf("receive HWM must not be negative, not %d", o.ReceiveHWM))
	}
	if o.AckFlushInterval < 0 {
		errs = append(errs, fmt.Errorf("ack flush interval must not be negative, not %v", o.AckFlushInterval))
	}
	if o.Workers < 0 {
		errs = append(errs, fmt.Errorf("workers must not be negative, not %d", o.Workers))
	}
	if o.DedupeCacheSize < 0 {
		errs = append(errs, fmt.Errorf("dedupe cache size must not be negative, not %d", o.DedupeCacheSize))
	}
	if !(o.DropAcks >= 0 && o.DropAcks <= 1) {
		errs = append(errs, fmt.Errorf("drop acks must be between 0 and 1, not %v", o.DropAcks))
	}
	curve, err := newCurveClient(o.CurveServerKey, o.CurveSecretKey)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("processor: %w", err)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ReceiveHWM == 0 {
		o.ReceiveHWM = DefaultReceiveHWM
	}
	if o.AckFlushInterval == 0 {
		o.AckFlushInterval = DefaultAckFlushInterval
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	if o.DedupeCacheSize == 0 {
		o.DedupeCacheSize = DefaultDedupeCacheSize
	}
	if o.DedupeRetention == 0 {
		o.DedupeRetention = DefaultDedupeRetention
	}
	return &Client{opts: o, log: o.Logger, curve: curve}, nil
}

// Run connects to the daemon described by o and processes events with h
// until ctx is cancelled. See Client.Run.
func Run(ctx context.Context, o Options, h Handler) error {
	c, err := New(o)
	if err != nil {
		return err
	}
	return c.Run(ctx, h)
}

// Stats returns the Client's counters.
func (c *Client) Stats() Stats {
	return Stats{
		Frames:       c.frames.Load(),
		Events:       c.events.Load(),
		Acked:        c.acked.Load(),
		Failed:       c.failed.Load(),
		Permanent:    c.permanent.Load(),
		Duplicates:   c.duplicates.Load(),
		Malformed:    c.malformed.Load(),
		Redeliveries: c.redeliveries.Load(),
		AcksDropped:  c.acksDropped.Load(),
		Forgotten:    c.forgotten.Load(),
	}
}

// Run connects to the daemon and calls h for each event received, in frame
// order, acknowledging the events h accepted and nacking the others. Frames
// are shared among Options.Workers workers. It needs no daemon to start:
// ZeroMQ connects, and reconnects, in the background.
//
// When ctx is cancelled Run stops receiving; each worker stops between two
// events of its frame (the rest are redelivered). Run then sends the acks
// and nacks it holds (waiting at most a second for them to leave) and
// returns nil. It returns an error when its sockets or the dedupe database
// cannot be set up or fail while running, and when another Run of c is
// active. A frame that cannot be decoded is logged and counted in
// Stats.Malformed, never acknowledged.
func (c *Client) Run(ctx context.Context, h Handler) (err error) {
	if h == nil {
		return errors.New("processor: nil handler")
	}
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("processor: Run is already active on this client")
	}
	defer c.running.Store(false)

	var dd *dedupeStore
	if c.opts.DedupeDB != "" {
		if dd, err = openDedupe(ctx, c.opts.DedupeDB, c.opts.DedupeCacheSize); err != nil {
			return err
		}
		defer func() {
			if cerr := dd.close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("processor: close dedupe database %s: %w", c.opts.DedupeDB, cerr))
			}
		}()
		defer c.startForgetter(dd.db, dd.clock)()
	}
	return c.serve(ctx, func(ctx context.Context, f *frame) frameResult {
		return c.handleFrame(ctx, f, h, dd)
	})
}

// frameResult is a worker's outcome for one frame.
type frameResult struct {
	// f is the frame, given back for Options.RecycleFrames.
	f  *frame
	id int64
	// n is the number of events in the frame.
	n int
	// whole is true when every event was acknowledged; keys then is empty.
	whole bool
	// keys acknowledges the events that succeeded when whole is false.
	keys []wire.KeyAck
	// nacks are the events that failed.
	nacks []wire.Nack
}

// frameFunc processes one frame, stopping between events once ctx is done.
type frameFunc func(ctx context.Context, f *frame) frameResult

// serve runs the socket loop and the workers until ctx is done, then stops
// them in order: stop receiving, let the workers finish their frames,
// send the remaining acks, close the sockets.
func (c *Client) serve(ctx context.Context, process frameFunc) (err error) {
	s, err := c.connect()
	if err != nil {
		return err
	}
	defer func() {
		if cerr := s.close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("processor: close: %w", cerr))
		}
	}()
	c.log.Info("processor started", "endpoint", c.opts.Endpoint, "ack_endpoint", c.opts.AckEndpoint, "workers", c.opts.Workers,
		"curve", c.curve != nil)

	work := make(chan *frame)
	results := make(chan frameResult, c.opts.Workers)
	var wg sync.WaitGroup
	for range c.opts.Workers {
		wg.Go(func() {
			for f := range work {
				r := process(ctx, f)
				r.f = f
				results <- r
			}
		})
	}
	go func() {
		wg.Wait()
		close(results)
	}()

	var acks ackBatch
	loopErr := c.loop(ctx, s, work, results, &acks)
	close(work)
	for r := range results {
		acks.addResult(r)
	}
	// Send what is left, even when the loop failed: those events were
	// processed. The stop context only bounds the wait.
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeLinger)
	defer cancel()
	if ferr := c.flush(stopCtx, s, &acks); ferr != nil {
		if !errors.Is(ferr, context.DeadlineExceeded) {
			loopErr = errors.Join(loopErr, ferr)
		}
		c.log.Warn("acks not sent at stop; their events will be redelivered",
			"ack_endpoint", c.opts.AckEndpoint, "frames", acks.frameCount(), "events", acks.events, "err", ferr)
	}
	st := c.Stats()
	c.log.Info("processor stopped", "frames", st.Frames, "events", st.Events, "acked", st.Acked,
		"failed", st.Failed, "permanent", st.Permanent, "duplicates", st.Duplicates,
		"malformed", st.Malformed, "redeliveries", st.Redeliveries, "acks_dropped", st.AcksDropped)
	return loopErr
}

// loop receives frames and hands them to the workers, collecting their
// results into acks, until ctx is done. It alone uses the sockets. It
// returns only socket errors, or nil. A frame received but not yet handed
// to a worker when it stops is redelivered by the daemon.
func (c *Client) loop(ctx context.Context, s *session, work chan<- *frame, results <-chan frameResult, acks *ackBatch) error {
	var pending *frame // received, waiting for a free worker
	var wf wire.Frame  // each message is decoded into it, then converted
	frames := framePool{recycle: c.opts.RecycleFrames, max: 2*c.opts.Workers + 2}
	inflight := 0
	// done takes a worker's result, and flushes the acks when due.
	done := func(r frameResult) error {
		inflight--
		acks.addResult(r)
		frames.put(r.f)
		if acks.full() || acks.due(time.Now(), c.opts.AckFlushInterval) {
			if err := c.flush(ctx, s, acks); err != nil && ctx.Err() == nil {
				return err
			}
		}
		return nil
	}
	flushTimer := time.NewTimer(time.Hour)
	defer flushTimer.Stop()
	for ctx.Err() == nil {
		var err error
		select { // what the workers finished
		case r := <-results:
			err = done(r)
		default:
			if pending != nil {
				select {
				case work <- pending:
					pending = nil
					inflight++
				case r := <-results:
					err = done(r)
				case <-ctx.Done():
				}
			} else {
				var none bool
				pending, none, err = c.receive(ctx, s, &wf, &frames, inflight, acks)
				if none && err == nil {
					err = c.wait(ctx, s, results, done, acks, flushTimer)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// receive receives and decodes the next frame, if a message is waiting; a
// malformed one is dropped, and receive returns no frame. When none is
// waiting it reports none (then wait for the socket's FD) and sends the
// acks if no frame is in a worker: at low rates each ack leaves as soon as
// its frame is done, at high rates they are batched.
func (c *Client) receive(ctx context.Context, s *session, wf *wire.Frame, frames *framePool, inflight int,
	acks *ackBatch) (_ *frame, none bool, _ error) {
	f := frames.get()
	msg, parts, err := s.in.Recv(f.buf)
	if err == nil {
		f.buf = msg
		if !c.decode(wf, msg, parts) {
			frames.put(f)
			return nil, false, nil
		}
		fillFrame(f, wf)
		return f, false, nil
	}
	frames.put(f)
	if !errors.Is(err, zmqpull.ErrAgain) {
		return nil, false, fmt.Errorf("processor: receive from %s: %w", c.opts.Endpoint, err)
	}
	if inflight == 0 {
		if err := c.flush(ctx, s, acks); err != nil && ctx.Err() == nil {
			return nil, true, err
		}
	}
	return nil, true, nil
}

// wait waits for a message, a worker's result (handed to done), the time
// to send the acks, or the stop.
func (c *Client) wait(ctx context.Context, s *session, results <-chan frameResult, done func(frameResult) error,
	acks *ackBatch, flushTimer *time.Timer) error {
	var flushDue <-chan time.Time
	if !acks.empty() {
		flushTimer.Reset(max(time.Until(acks.since.Add(c.opts.AckFlushInterval)), 0))
		flushDue = flushTimer.C
	}
	select {
	case <-s.inReady.wait():
		s.inReady.took()
	case r := <-results:
		return done(r)
	case <-flushDue:
		if err := c.flush(ctx, s, acks); err != nil && ctx.Err() == nil {
			return err
		}
	case <-ctx.Done():
	case <-s.inReady.done:
		return fmt.Errorf("processor: receive from %s: %w", c.opts.Endpoint, s.inReady.err)
	}
	return nil
}

// decode decodes one message of parts parts into wf, reporting whether it
// is a frame; a malformed one is logged and counted.
func (c *Client) decode(wf *wire.Frame, msg []byte, parts int) bool {
	if parts != 1 {
		c.malformed.Add(1)
		c.log.Warn("dropped a malformed frame: want a single-part message", "endpoint", c.opts.Endpoint, "parts", parts)
		return false
	}
	decode := wire.DecodeFrameTrusted
	if c.opts.ValidatePayloads {
		decode = wire.DecodeFrameInto
	}
	if err := decode(wf, msg); err != nil {
		c.malformed.Add(1)
		c.log.Warn("dropped a malformed frame", "endpoint", c.opts.Endpoint, "bytes", len(msg), "err", err)
		return false
	}
	c.frames.Add(1)
	if wf.Delivery > 1 {
		c.redeliveries.Add(1)
	}
	return true
}

// flush sends the batched acks, if any, waiting while the ack socket is
// full (the daemon is slow or away) until ctx is done. On error the acks
// stay in the batch.
func (c *Client) flush(ctx context.Context, s *session, acks *ackBatch) error {
	if acks.empty() {
		return nil
	}
	if c.opts.DropAcks > 0 && rand.Float64() < c.opts.DropAcks {
		c.acksDropped.Add(1)
		c.log.Debug("dropped an ack message on purpose (DropAcks)", "frames", acks.frameCount(), "events", acks.events, "nacks", len(acks.nacks))
		acks.reset()
		return nil
	}
	data, err := wire.EncodeAck(acks.ack())
	if err != nil {
		return fmt.Errorf("processor: encode ack: %w", err)
	}
	for {
		_, err := s.out.SendBytes(data, zmq.DONTWAIT)
		if err == nil {
			break
		}
		if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
			return fmt.Errorf("processor: send ack to %s: %w", c.opts.AckEndpoint, err)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("processor: send ack to %s: %w", c.opts.AckEndpoint, err)
		}
		wait := pollInterval
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, max(time.Until(dl), time.Millisecond))
		}
		if _, err := s.outPoller.Poll(wait); err != nil {
			return fmt.Errorf("processor: poll %s: %w", c.opts.AckEndpoint, err)
		}
	}
	c.acked.Add(acks.events)
	acks.reset()
	return nil
}

// session is one Run's ZeroMQ context and sockets. It is used by the
// goroutine that made it and no other.
type session struct {
	zctx      *zmq.Context // out's
	in        *zmqpull.Socket
	out       *zmq.Socket
	inReady   *readiness // the in socket has a message
	outPoller *zmq.Poller
}

// connect sets up a session. A private ZeroMQ context keeps the Client
// independent of any other ZeroMQ user in the process.
func (c *Client) connect() (_ *session, err error) {
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("processor: new ZeroMQ context: %w", err)
	}
	s := &session{zctx: zctx}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.close())
		}
	}()
	// The PULL socket is our own, in a context of its own: it receives
	// into buffers it is given (package zmqpull). Frames still queued at
	// close are redelivered by the daemon anyway: no linger.
	inOpts := zmqpull.Options{ReceiveHWM: c.opts.ReceiveHWM}
	if c.curve != nil {
		inOpts.CurveServerKey, inOpts.CurvePublicKey, inOpts.CurveSecretKey = c.curve.server, c.curve.public, c.curve.secret
	}
	if s.in, err = zmqpull.Dial(c.opts.Endpoint, inOpts); err != nil {
		return nil, fmt.Errorf("processor: connect PULL socket to %s: %w", c.opts.Endpoint, err)
	}
	if s.out, err = zctx.NewSocket(zmq.PUSH); err != nil {
		return nil, fmt.Errorf("processor: new PUSH socket: %w", err)
	}
	// Acks queued at close get this long to leave.
	if err := s.out.SetLinger(closeLinger); err != nil {
		return nil, fmt.Errorf("processor: PUSH socket: set linger: %w", err)
	}
	if err := c.curve.secure(s.out); err != nil {
		return nil, fmt.Errorf("processor: PUSH socket: set CURVE keys: %w", err)
	}
	if err := s.out.Connect(c.opts.AckEndpoint); err != nil {
		return nil, fmt.Errorf("processor: connect PUSH socket to %s: %w", c.opts.AckEndpoint, err)
	}
	fd, err := s.in.FD()
	if err != nil {
		return nil, fmt.Errorf("processor: PULL socket: %w", err)
	}
	if s.inReady, err = newReadiness(fd); err != nil {
		return nil, fmt.Errorf("processor: PULL socket: %w", err)
	}
	s.outPoller = zmq.NewPoller()
	s.outPoller.Add(s.out, zmq.POLLOUT)
	return s, nil
}

// close closes the sockets and terminates the context, which waits up to
// closeLinger for queued acks to be sent.
func (s *session) close() error {
	var errs []error
	if s.inReady != nil {
		errs = append(errs, s.inReady.close())
	}
	if s.in != nil {
		errs = append(errs, s.in.Close())
	}
	if s.out != nil {
		errs = append(errs, s.out.Close())
	}
	errs = append(errs, s.zctx.Term())
	return errors.Join(errs...)
}
