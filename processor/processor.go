package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/wire"
)

// Event is one event as the daemon delivers it. (Source, Key) identifies
// it; Data returns its bytes.
type Event = wire.Event

// Handler processes one event. Returning nil acknowledges the event; an
// error leaves it unacknowledged, so the daemon delivers it again after its
// ack timeout, and is logged. ctx is the context given to Run: a Handler
// may give up when it is done, returning an error that wraps ctx.Err(),
// which leaves the event unacknowledged without counting as a failure.
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
}

// Defaults of Options.
const (
	DefaultReceiveHWM       = 1000
	DefaultAckFlushInterval = 20 * time.Millisecond
)

const (
	// pollInterval bounds how long Run goes without looking at its context.
	pollInterval = 100 * time.Millisecond
	// closeLinger bounds how long the acks still queued at stop may take
	// to leave.
	closeLinger = time.Second
)

// Stats are a Client's counters since New.
type Stats struct {
	// Frames counts frames received and decoded.
	Frames int64
	// Events counts events passed to the Handler.
	Events int64
	// Acked counts events whose acks were handed to ZeroMQ for sending,
	// in whole frames and one by one alike.
	Acked int64
	// Failed counts events the Handler returned an error for or panicked
	// on; an error wrapping the context's error once Run is stopping is not
	// a failure.
	Failed int64
	// Malformed counts messages that were not a valid version 1 events
	// frame; they are logged, not acknowledged.
	Malformed int64
	// Redeliveries counts decoded frames whose delivery number was above 1.
	Redeliveries int64
}

// Client receives events from a daemon and acknowledges them. Its methods
// are safe for concurrent use, but only one Run may be active at a time.
type Client struct {
	opts    Options
	log     *slog.Logger
	running atomic.Bool

	frames, events, acked, failed, malformed, redeliveries atomic.Int64
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
	return &Client{opts: o, log: o.Logger}, nil
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
		Malformed:    c.malformed.Load(),
		Redeliveries: c.redeliveries.Load(),
	}
}

// Run connects to the daemon and calls h for each event received, one at a
// time, in frame order, acknowledging the events h accepted. It needs no
// daemon to start: ZeroMQ connects, and reconnects, in the background.
//
// When ctx is cancelled Run stops between two events, sends the acks it
// holds (waiting at most a second for them to leave) and returns nil. It
// returns an error when its sockets cannot be set up or fail while running,
// and when another Run of c is active. A frame that cannot be decoded is
// logged and counted in Stats.Malformed, never acknowledged.
func (c *Client) Run(ctx context.Context, h Handler) (err error) {
	if h == nil {
		return errors.New("processor: nil handler")
	}
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("processor: Run is already active on this client")
	}
	defer c.running.Store(false)

	s, err := c.connect()
	if err != nil {
		return err
	}
	defer func() {
		if cerr := s.close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("processor: close: %w", cerr))
		}
	}()
	c.log.Info("processor started", "endpoint", c.opts.Endpoint, "ack_endpoint", c.opts.AckEndpoint)

	var acks ackBatch
	loopErr := c.loop(ctx, s, h, &acks)
	// Send what the loop left, even when it failed: those events were
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
		"failed", st.Failed, "malformed", st.Malformed, "redeliveries", st.Redeliveries)
	return loopErr
}

// loop receives and handles frames until ctx is done. It returns only
// socket errors, or nil.
func (c *Client) loop(ctx context.Context, s *session, h Handler, acks *ackBatch) error {
	for ctx.Err() == nil {
		polled, err := s.inPoller.Poll(pollInterval)
		if err != nil {
			return fmt.Errorf("processor: poll %s: %w", c.opts.Endpoint, err)
		}
		if len(polled) == 0 {
			continue
		}
		// Drain what is immediately available, then flush: at low rates
		// each ack leaves at once, at high rates they are batched.
		for ctx.Err() == nil {
			msg, err := s.in.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
					break
				}
				return fmt.Errorf("processor: receive from %s: %w", c.opts.Endpoint, err)
			}
			c.handleMessage(ctx, msg, h, acks)
			if acks.full() || acks.due(time.Now(), c.opts.AckFlushInterval) {
				if err := c.flush(ctx, s, acks); err != nil && ctx.Err() == nil {
					return err
				}
			}
		}
		if err := c.flush(ctx, s, acks); err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

// handleMessage decodes one message, runs h on its events and records their
// acks in acks.
func (c *Client) handleMessage(ctx context.Context, msg [][]byte, h Handler, acks *ackBatch) {
	if len(msg) != 1 {
		c.malformed.Add(1)
		c.log.Warn("dropped a malformed frame: want a single-part message", "endpoint", c.opts.Endpoint, "parts", len(msg))
		return
	}
	f, err := wire.DecodeFrame(msg[0])
	if err != nil {
		c.malformed.Add(1)
		c.log.Warn("dropped a malformed frame", "endpoint", c.opts.Endpoint, "bytes", len(msg[0]), "err", err)
		return
	}
	c.frames.Add(1)
	if f.Delivery > 1 {
		c.redeliveries.Add(1)
	}
	var done []int // indexes of the events h accepted
	whole := true
	for i := range f.Events {
		if ctx.Err() != nil {
			// Stop between events; the rest are redelivered.
			whole = false
			break
		}
		ev := &f.Events[i]
		c.events.Add(1)
		if err := c.call(ctx, h, ev); err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				// Interrupted by the stop: redelivered, not a failure.
				whole = false
				break
			}
			c.failed.Add(1)
			whole = false
			c.log.Warn("handler failed; the event stays unacked and will be redelivered",
				"source", ev.Source, "key", ev.Key, "seq", ev.Seq, "frame", f.ID, "delivery", f.Delivery, "err", err)
			continue
		}
		done = append(done, i)
	}
	if whole {
		acks.addFrame(f.ID, len(f.Events))
		return
	}
	for _, i := range done {
		acks.addKey(f.ID, f.Events[i].Source, f.Events[i].Key)
	}
}

// call runs h, turning a panic into an error.
func (c *Client) call(ctx context.Context, h Handler, ev *Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("handler panicked", "source", ev.Source, "key", ev.Key, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return h(ctx, ev)
}

// flush sends the batched acks, if any, waiting while the ack socket is
// full (the daemon is slow or away) until ctx is done. On error the acks
// stay in the batch.
func (c *Client) flush(ctx context.Context, s *session, acks *ackBatch) error {
	if acks.empty() {
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
	zctx      *zmq.Context
	in, out   *zmq.Socket
	inPoller  *zmq.Poller
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
	if s.in, err = zctx.NewSocket(zmq.PULL); err != nil {
		return nil, fmt.Errorf("processor: new PULL socket: %w", err)
	}
	// Frames still queued at close are redelivered by the daemon anyway.
	if err := s.in.SetLinger(0); err != nil {
		return nil, fmt.Errorf("processor: PULL socket: set linger: %w", err)
	}
	if err := s.in.SetRcvhwm(c.opts.ReceiveHWM); err != nil {
		return nil, fmt.Errorf("processor: PULL socket: set receive HWM %d: %w", c.opts.ReceiveHWM, err)
	}
	if err := s.in.Connect(c.opts.Endpoint); err != nil {
		return nil, fmt.Errorf("processor: connect PULL socket to %s: %w", c.opts.Endpoint, err)
	}
	if s.out, err = zctx.NewSocket(zmq.PUSH); err != nil {
		return nil, fmt.Errorf("processor: new PUSH socket: %w", err)
	}
	// Acks queued at close get this long to leave.
	if err := s.out.SetLinger(closeLinger); err != nil {
		return nil, fmt.Errorf("processor: PUSH socket: set linger: %w", err)
	}
	if err := s.out.Connect(c.opts.AckEndpoint); err != nil {
		return nil, fmt.Errorf("processor: connect PUSH socket to %s: %w", c.opts.AckEndpoint, err)
	}
	s.inPoller = zmq.NewPoller()
	s.inPoller.Add(s.in, zmq.POLLIN)
	s.outPoller = zmq.NewPoller()
	s.outPoller.Add(s.out, zmq.POLLOUT)
	return s, nil
}

// close closes the sockets and terminates the context, which waits up to
// closeLinger for queued acks to be sent.
func (s *session) close() error {
	var errs []error
	for _, soc := range []*zmq.Socket{s.in, s.out} {
		if soc != nil {
			errs = append(errs, soc.Close())
		}
	}
	errs = append(errs, s.zctx.Term())
	return errors.Join(errs...)
}
