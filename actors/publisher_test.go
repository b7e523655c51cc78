package actors

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/delivery"
	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/queue/queuetest"
	"github.com/ingestorhq/ingestor/sources"
)

// TestPublisherNeverBlocksOnABusyWriter holds the queue's SQLite write
// lock from a second connection, so the queue's writer blocks for real,
// and sends the Publisher far more batches than the writer has room for.
// Every Receive must return while the writer is blocked; once the lock is
// released, every batch commits, in order, and nothing is lost.
func TestPublisherNeverBlocksOnABusyWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	q, err := queue.Open(queue.Options{Path: path, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	})
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sender, err := delivery.NewSender(zctx, q, nil, delivery.SenderOptions{Endpoint: "inproc://publisher-test",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	deps := &Deps{Queue: q, Ingest: ingest.New(ingest.Options{Queue: q, Sender: sender}), Metrics: NewMetrics(nil),
		Logger: slog.New(slog.DiscardHandler)}

	release := queuetest.HoldWriteLock(t, path)

	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	// Far more batches than the writer takes in one group (128) plus the
	// requests its channel holds (256).
	const batches = 1000
	var returned atomic.Int64
	allReturned := make(chan struct{})
	countReturns := func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			next(c, env)
			if _, ok := env.Message.(*appendBatch); ok && returned.Add(1) == batches {
				close(allReturned)
			}
		}
	}
	pub := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &Publisher{deps: deps} },
		actor.WithReceiverMiddleware(countReturns), actor.WithMailbox(actor.Unbounded())))
	replies := make(chan *batchCommitted, batches)
	collector := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*batchCommitted); ok {
			replies <- m
		}
	}, actor.WithMailbox(actor.Unbounded())))
	t.Cleanup(func() {
		if err := system.Root.StopFuture(pub).Wait(); err != nil {
			t.Error(err)
		}
		if err := system.Root.StopFuture(collector).Wait(); err != nil {
			t.Error(err)
		}
	})

	chain := &queue.Chain{}
	for i := range batches {
		body := []byte(fmt.Sprintf(`[{"id":"a%d"},{"id":"b%d"}]`, i, i))
		half := len(body) / 2
		b := &sources.Batch{Body: body, FetchedAt: time.Now(), Cursor: fmt.Sprintf("c%d", i), Records: []sources.Record{
			{Key: fmt.Sprintf("a%d", i), Off: 1, Len: half - 1},
			{Key: fmt.Sprintf("b%d", i), Off: half, Len: len(body) - half - 1},
		}}
		system.Root.RequestWithCustomSender(pub, &appendBatch{chain: chain, gen: 1, seq: uint64(i), source: "s",
			raw: ingest.Ref{Key: fmt.Sprintf("s/raw-%d", i)}, batch: b, records: b.Records, last: true}, collector)
	}
	select {
	case <-allReturned:
	case <-time.After(5 * time.Second): // well under the writer's 10 s busy timeout
		t.Fatalf("only %d of %d Publisher.Receive calls returned while the queue writer was blocked", returned.Load(), batches)
	}
	if n := len(replies); n != 0 {
		t.Fatalf("%d batches were answered while the writer held no lock: the writer was not blocked", n)
	}

	release()
	for i := range batches {
		select {
		case m := <-replies:
			if m.err != nil {
				t.Fatalf("batch %d: %v", m.seq, m.err)
			}
			if m.seq != uint64(i) || m.newEvents != 2 {
				t.Fatalf("reply %d is for batch %d with %d new events, want batch %d with 2", i, m.seq, m.newEvents, i)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d batches committed after the writer resumed", i, batches)
		}
	}
	if got := q.PendingEvents(); got != 2*batches {
		t.Errorf("pending events = %d, want %d", got, 2*batches)
	}
	if c, _, err := q.Cursor(t.Context(), "s"); err != nil || c != fmt.Sprintf("c%d", batches-1) {
		t.Errorf("cursor = %q (%v), want c%d", c, err, batches-1)
	}
}
