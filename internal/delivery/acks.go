package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// AckReceiver owns the PULL socket processors push acks to. It commits
// each burst of acks to the queue in one request, then tells the Sender.
type AckReceiver struct {
	sock    *zmq.Socket
	q       *queue.Queue
	sender  *Sender
	log     *slog.Logger
	metrics *Metrics
}

// NewAckReceiver binds the PULL socket at endpoint, a CURVE server for
// authorized processors only when curve is set.
func NewAckReceiver(zctx *zmq.Context, endpoint string, hwm int, curve *CurveServer, q *queue.Queue, sender *Sender, log *slog.Logger, m *Metrics) (*AckReceiver, error) {
	sock, err := zctx.NewSocket(zmq.PULL)
	if err != nil {
		return nil, fmt.Errorf("ack socket: %w", err)
	}
	setup := errors.Join(sock.SetRcvhwm(hwm), sock.SetLinger(0), curve.secure(sock))
	if setup == nil {
		setup = sock.Bind(endpoint)
	}
	if setup != nil {
		return nil, fmt.Errorf("ack socket %s: %w", endpoint, errors.Join(setup, sock.Close()))
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	return &AckReceiver{sock: sock, q: q, sender: sender, log: log, metrics: m}, nil
}

// maxAckBurst caps the ack messages committed together.
const maxAckBurst = 512

// Run receives acks until ctx ends, then closes the socket.
func (a *AckReceiver) Run(ctx context.Context) error {
	defer func() {
		if err := a.sock.Close(); err != nil {
			a.log.Warn("close ack socket", "err", err)
		}
	}()
	poller := zmq.NewPoller()
	poller.Add(a.sock, zmq.POLLIN)
	var frames []int64
	var keys []queue.KeyAck
	var nacks []queue.NackInput
	for ctx.Err() == nil {
		polled, err := poller.Poll(100 * time.Millisecond)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			return fmt.Errorf("poll ack socket: %w", err)
		}
		if len(polled) == 0 {
			continue
		}
		frames, keys, nacks = frames[:0], keys[:0], nacks[:0]
		for i := 0; i < maxAckBurst; i++ {
			msg, err := a.sock.RecvBytes(zmq.DONTWAIT)
			if err != nil {
				if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
					a.log.Error("receive ack", "err", err)
				}
				break
			}
			a.metrics.acks.Inc()
			ack, err := wire.DecodeAck(msg)
			if err != nil {
				a.metrics.badAcks.Inc()
				a.log.Warn("dropped malformed ack", "err", err, "bytes", len(msg))
				continue
			}
			frames = append(frames, ack.Frames...)
			for _, k := range ack.Keys {
				keys = append(keys, queue.KeyAck{Frame: k.Frame, Source: k.Source, Key: k.Key})
			}
			for _, n := range ack.Nacks {
				nacks = append(nacks, queue.NackInput{Frame: n.Frame, Source: n.Source, Key: n.Key, Reason: n.Reason, Permanent: n.Permanent})
			}
		}
		if len(frames) == 0 && len(keys) == 0 && len(nacks) == 0 {
			continue
		}
		// The ack is committed even if ctx ends meanwhile: a lost ack only
		// causes a resend, but there is no reason to lose it.
		res, err := a.q.Settle(context.WithoutCancel(ctx), frames, keys, nacks)
		if err != nil {
			a.log.Error("commit acks", "frames", len(frames), "keys", len(keys), "nacks", len(nacks), "err", err)
			continue
		}
		a.metrics.framesAcked.Add(float64(len(res.Cleared)))
		a.metrics.acksUnknown.Add(float64(res.Unknown))
		a.metrics.nacksRetryable.Add(float64(res.Retryable))
		a.metrics.eventsDeadLettered.Add(float64(res.DeadLettered))
		if res.DeadLettered > 0 {
			a.log.Warn("events nacked permanently and dead-lettered", "events", res.DeadLettered)
		}
		a.sender.Acked(ctx, res.Cleared)
	}
	return nil
}
