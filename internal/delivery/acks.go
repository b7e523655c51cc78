package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// AckOptions configure an AckReceiver.
type AckOptions struct {
	// Endpoint is where the PULL socket binds.
	Endpoint string
	// HighWaterMark is the socket's receive high-water mark in messages.
	HighWaterMark int
	// MaxMessageBytes is the largest ack message accepted (ZMQ_MAXMSGSIZE);
	// 0 means no limit. libzmq drops the connection of a peer that sends a
	// larger one, before the message is read into memory.
	MaxMessageBytes int64
	// Curve, when set, makes the socket a CURVE server that admits only
	// the authorized processors.
	Curve   *CurveServer
	Logger  *slog.Logger
	Metrics *Metrics
}

// AckReceiver owns the PULL socket processors push acks to. It commits
// each burst of acks to the queue in one request, then tells the Sender.
type AckReceiver struct {
	sock *zmq.Socket
	// events receives sock's connections and disconnections from a ZeroMQ
	// socket monitor.
	events  *zmq.Socket
	q       *queue.Queue
	sender  *Sender
	log     *slog.Logger
	metrics *Metrics

	// badLogged is when a malformed ack was last logged, and badQuiet
	// counts those dropped since without a log line.
	badLogged time.Time
	badQuiet  int

	// connected counts the processors' ack connections open now, and
	// lastAck is when the last ack message arrived (unix nanos), for the
	// status page.
	connected atomic.Int64
	lastAck   atomic.Int64
}

// Connected returns the number of processor connections to the ack socket
// open now (a processor holds one; libzmq reports TCP and IPC ones).
func (a *AckReceiver) Connected() int64 { return a.connected.Load() }

// LastAck returns when the last ack message arrived, or zero.
func (a *AckReceiver) LastAck() time.Time {
	if t := a.lastAck.Load(); t != 0 {
		return time.Unix(0, t)
	}
	return time.Time{}
}

// NewAckReceiver binds the PULL socket, a CURVE server for authorized
// processors only when o.Curve is set.
func NewAckReceiver(zctx *zmq.Context, o AckOptions, q *queue.Queue, sender *Sender) (*AckReceiver, error) {
	sock, err := zctx.NewSocket(zmq.PULL)
	if err != nil {
		return nil, fmt.Errorf("ack socket: %w", err)
	}
	setup := errors.Join(sock.SetRcvhwm(o.HighWaterMark), sock.SetLinger(0), o.Curve.secure(sock))
	if o.MaxMessageBytes > 0 {
		setup = errors.Join(setup, sock.SetMaxmsgsize(o.MaxMessageBytes))
	}
	if setup == nil {
		setup = sock.Bind(o.Endpoint)
	}
	if setup != nil {
		return nil, fmt.Errorf("ack socket %s: %w", o.Endpoint, errors.Join(setup, sock.Close()))
	}
	events, err := watchDisconnects(zctx, sock)
	if err != nil {
		return nil, fmt.Errorf("ack socket %s: %w", o.Endpoint, errors.Join(err, sock.Close()))
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &AckReceiver{sock: sock, events: events, q: q, sender: sender, log: o.Logger, metrics: o.Metrics}, nil
}

// watchDisconnects starts a monitor of sock's connections and
// disconnections and returns the socket it reports them on. A processor disconnects when it stops,
// and when it sends a message over MaxMessageBytes: libzmq then closes
// the connection without a word, so this is the only trace of it.
func watchDisconnects(zctx *zmq.Context, sock *zmq.Socket) (*zmq.Socket, error) {
	addr := fmt.Sprintf("inproc://ack-monitor-%p", sock)
	if err := sock.Monitor(addr, zmq.EVENT_ACCEPTED|zmq.EVENT_DISCONNECTED); err != nil {
		return nil, fmt.Errorf("monitor: %w", err)
	}
	events, err := zctx.NewSocket(zmq.PAIR)
	if err != nil {
		return nil, fmt.Errorf("monitor: %w", errors.Join(err, sock.Monitor("", 0)))
	}
	if err := events.Connect(addr); err != nil {
		return nil, fmt.Errorf("monitor: %w", errors.Join(err, events.Close(), sock.Monitor("", 0)))
	}
	return events, nil
}

// close stops the monitor and closes both sockets.
func (a *AckReceiver) close() error {
	return errors.Join(a.sock.Monitor("", 0), a.events.Close(), a.sock.Close())
}

// maxAckBurst caps the ack messages committed together, and
// wire.MaxAckEntries the entries: a burst closes once it holds that many,
// so a maximal ack is settled on its own and the acks after it wait for
// one ack's worth of work at most.
const maxAckBurst = 512

// Run receives acks until ctx ends, then closes the socket.
func (a *AckReceiver) Run(ctx context.Context) error {
	defer func() {
		if err := a.close(); err != nil {
			a.log.Warn("close ack socket", "err", err)
		}
	}()
	poller := zmq.NewPoller()
	poller.Add(a.sock, zmq.POLLIN)
	poller.Add(a.events, zmq.POLLIN)
	var b ackBurst
	for ctx.Err() == nil {
		polled, err := poller.Poll(100 * time.Millisecond)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			return fmt.Errorf("poll ack socket: %w", err)
		}
		readable := false
		for _, p := range polled {
			if p.Socket == a.events {
				a.disconnects()
			} else {
				readable = true
			}
		}
		if !readable {
			continue
		}
		b.reset()
		for i := 0; i < maxAckBurst && b.entries < wire.MaxAckEntries; i++ {
			ack, ok := a.receive()
			if !ok {
				break
			}
			if ack != nil {
				b.add(ack)
			}
		}
		if b.entries == 0 {
			continue
		}
		a.lastAck.Store(time.Now().UnixNano())
		// The ack is committed even if ctx ends meanwhile: a lost ack only
		// causes a resend, but there is no reason to lose it.
		res, err := a.q.Settle(context.WithoutCancel(ctx), b.frames, b.keys, b.nacks)
		if err != nil {
			a.log.Error("commit acks", "frames", len(b.frames), "keys", len(b.keys), "nacks", len(b.nacks), "err", err)
			continue
		}
		a.metrics.framesAcked.Add(float64(len(res.Cleared)))
		a.metrics.acksUnknown.Add(float64(res.Unknown))
		a.metrics.acksOverridden.Add(float64(res.Overridden))
		a.metrics.nacksRetryable.Add(float64(res.Retryable))
		a.metrics.eventsDeadLettered.Add(float64(res.DeadLettered))
		if res.DeadLettered > 0 {
			a.log.Warn("events nacked permanently and dead-lettered", "events", res.DeadLettered)
		}
		if partly := b.partlySettled(res.Cleared); len(partly) > 0 {
			a.sender.Forget(partly)
		}
		a.sender.Acked(ctx, res.Cleared)
	}
	return nil
}

// receive reads one message without waiting. ok is false when there is
// none; ack is nil when it was malformed, which is counted and logged.
// All parts of a multi-part message are read and dropped: the protocol
// has none, and applying some parts of one would apply an ack whose sender
// did not send it as one.
func (a *AckReceiver) receive() (ack *wire.Ack, ok bool) {
	msg, err := a.sock.RecvBytes(zmq.DONTWAIT)
	if err != nil {
		if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
			a.log.Error("receive ack", "err", err)
		}
		return nil, false
	}
	a.metrics.acks.Inc()
	size, parts := len(msg), 1
	for {
		more, err := a.sock.GetRcvmore()
		if err != nil {
			a.log.Error("receive ack", "err", err)
			return nil, false
		}
		if !more {
			break
		}
		// The parts of a message arrive together, so this does not wait.
		part, err := a.sock.RecvBytes(zmq.DONTWAIT)
		if err != nil {
			a.log.Error("receive ack", "err", err)
			return nil, false
		}
		size += len(part)
		parts++
	}
	if parts > 1 {
		a.malformed(fmt.Errorf("a message of %d parts, not 1", parts), size)
		return nil, true
	}
	if ack, err = wire.DecodeAck(msg); err != nil {
		a.malformed(err, size)
		return nil, true
	}
	return ack, true
}

// disconnects counts the connections the monitor reported, and counts and
// logs the disconnections.
func (a *AckReceiver) disconnects() {
	for {
		ev, addr, _, err := a.events.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
				a.log.Error("read ack socket monitor", "err", err)
			}
			return
		}
		if ev == zmq.EVENT_ACCEPTED {
			a.connected.Add(1)
		}
		if ev == zmq.EVENT_DISCONNECTED {
			if a.connected.Add(-1) < 0 {
				a.connected.Store(0)
			}
			a.metrics.ackDisconnects.Inc()
			a.log.Info("a processor's ack connection closed: it stopped, or sent an ack over publish.ack_max_message_bytes", "endpoint", addr)
		}
	}
}

// malformedLogEvery spaces the log lines about malformed acks: a flood of
// them is counted, not logged line by line.
const malformedLogEvery = time.Second

// malformed counts a malformed ack and logs it, unless one was logged less
// than malformedLogEvery ago.
func (a *AckReceiver) malformed(err error, size int) {
	a.metrics.badAcks.Inc()
	if now := time.Now(); now.Sub(a.badLogged) >= malformedLogEvery {
		a.log.Warn("dropped a malformed ack", "err", err, "bytes", size, "not_logged_since_last", a.badQuiet)
		a.badLogged, a.badQuiet = now, 0
		return
	}
	a.badQuiet++
}

// ackBurst gathers the acks of several messages to settle in one request.
type ackBurst struct {
	frames  []int64
	keys    []queue.KeyAck
	nacks   []queue.NackInput
	entries int
}

func (b *ackBurst) reset() {
	b.frames, b.keys, b.nacks, b.entries = b.frames[:0], b.keys[:0], b.nacks[:0], 0
}

// partlySettled returns the frames b names that are not among cleared:
// those whose events were settled one by one (key acks, nacks, a frame
// ack that a retryable nack kept from clearing it), some of which may still
// be pending with fewer events, and unknown ones.
func (b *ackBurst) partlySettled(cleared []int64) []int64 {
	if len(b.keys) == 0 && len(b.nacks) == 0 && len(cleared) == len(b.frames) {
		return nil
	}
	done := make(map[int64]bool, len(cleared))
	for _, id := range cleared {
		done[id] = true
	}
	var out []int64
	named := func(id int64) {
		if !done[id] {
			done[id] = true
			out = append(out, id)
		}
	}
	for _, id := range b.frames {
		named(id)
	}
	for _, k := range b.keys {
		named(k.Frame)
	}
	for _, n := range b.nacks {
		named(n.Frame)
	}
	return out
}

// add merges ack into b. The queue lets a nack win over any ack of its
// event settled with it; here, first, an ack overrides the retryable nacks
// of its events that came in earlier messages, as it would had they been
// settled apart: the ack may be for a later delivery that succeeded.
func (b *ackBurst) add(ack *wire.Ack) {
	if len(b.nacks) > 0 && (len(ack.Frames) > 0 || len(ack.Keys) > 0) {
		frames := make(map[int64]bool, len(ack.Frames))
		for _, id := range ack.Frames {
			frames[id] = true
		}
		keys := make(map[queue.KeyAck]bool, len(ack.Keys))
		for _, k := range ack.Keys {
			keys[queue.KeyAck{Frame: k.Frame, Source: k.Source, Key: k.Key}] = true
		}
		b.nacks = slices.DeleteFunc(b.nacks, func(n queue.NackInput) bool {
			return !n.Permanent && (frames[n.Frame] || keys[queue.KeyAck{Frame: n.Frame, Source: n.Source, Key: n.Key}])
		})
	}
	b.frames = append(b.frames, ack.Frames...)
	for _, k := range ack.Keys {
		b.keys = append(b.keys, queue.KeyAck{Frame: k.Frame, Source: k.Source, Key: k.Key})
	}
	for _, n := range ack.Nacks {
		b.nacks = append(b.nacks, queue.NackInput{Frame: n.Frame, Source: n.Source, Key: n.Key, Reason: n.Reason, Permanent: n.Permanent})
	}
	b.entries += len(ack.Frames) + len(ack.Keys) + len(ack.Nacks)
}
