package processor_test

import (
	"context"
	"fmt"
	"log"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/wire"
)

// exampleDaemon stands in for `ingestor run` in the examples, so that they
// run: it binds the events (PUSH) and acks (PULL) sockets on free local
// ports, as the daemon binds its publish endpoints, sends one frame, and
// receives acks until every event of the frame is settled.
type exampleDaemon struct {
	zctx                  *zmq.Context
	push, pull            *zmq.Socket
	Endpoint, AckEndpoint string
	settled               chan string
}

// exampleWait bounds how long the stand-in daemon waits for the acks of
// its frame, so that a broken example fails instead of hanging.
const exampleWait = 30 * time.Second

// startExampleDaemon binds the stand-in daemon's sockets.
func startExampleDaemon() *exampleDaemon {
	zctx, err := zmq.NewContext()
	if err != nil {
		log.Fatalf("new ZeroMQ context: %v", err)
	}
	d := &exampleDaemon{zctx: zctx, settled: make(chan string, 1)}
	bind := func(typ zmq.Type) (*zmq.Socket, string) {
		s, err := zctx.NewSocket(typ)
		if err != nil {
			log.Fatalf("new %v socket: %v", typ, err)
		}
		for _, err := range []error{s.SetLinger(0), s.SetSndtimeo(exampleWait), s.SetRcvtimeo(exampleWait), s.Bind("tcp://127.0.0.1:*")} {
			if err != nil {
				log.Fatalf("set up %v socket: %v", typ, err)
			}
		}
		ep, err := s.GetLastEndpoint()
		if err != nil {
			log.Fatalf("last endpoint: %v", err)
		}
		return s, ep
	}
	d.push, d.Endpoint = bind(zmq.PUSH)
	d.pull, d.AckEndpoint = bind(zmq.PULL)
	return d
}

// serve sends frame 1 holding payloads, the events "evt-1", "evt-2", … of
// source "github", and returns a context that ends once every event is
// acked or nacked; Settled then says what became of them.
func (d *exampleDaemon) serve(payloads ...string) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		d.settled <- d.deliver(payloads)
	}()
	return ctx
}

// deliver sends the frame and receives its acks.
func (d *exampleDaemon) deliver(payloads []string) string {
	var enc wire.Encoder
	enc.Begin(1, 1, "file://./data/raw")
	for i, p := range payloads {
		ev := wire.Event{
			Key: fmt.Sprintf("evt-%d", i+1), Source: "github", Seq: int64(i + 1),
			FetchedAt: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC),
			Raw:       wire.RawRef{Key: "github/2024/05/01/100000-000001.json", Off: 100 * i, Len: len(p)},
		}
		enc.Add(&ev, []byte(p), true)
	}
	if _, err := d.push.SendBytes(enc.End(), 0); err != nil {
		return fmt.Sprintf("daemon: send frame: %v", err)
	}
	acked, deadLettered := 0, 0
	for acked+deadLettered < len(payloads) {
		data, err := d.pull.RecvBytes(0)
		if err != nil {
			return fmt.Sprintf("daemon: receive ack: %v", err)
		}
		a, err := wire.DecodeAck(data)
		if err != nil {
			return fmt.Sprintf("daemon: invalid ack %q: %v", data, err)
		}
		acked += len(a.Frames)*len(payloads) + len(a.Keys)
		for _, n := range a.Nacks {
			if n.Permanent {
				deadLettered++
			}
		}
	}
	return fmt.Sprintf("daemon: %d acked, %d dead-lettered", acked, deadLettered)
}

// Settled waits for serve's frame to be settled and says what became of
// its events.
func (d *exampleDaemon) Settled() string { return <-d.settled }

// close closes the sockets.
func (d *exampleDaemon) close() {
	for _, err := range []error{d.push.Close(), d.pull.Close(), d.zctx.Term()} {
		if err != nil {
			log.Print(err)
		}
	}
}
