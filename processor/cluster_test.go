package processor_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/ingestorhq/ingestor/internal/wire"
	"github.com/ingestorhq/ingestor/processor"
)

// chanMembers is a membership the test changes by sending lists.
type chanMembers chan []processor.Member

func (c chanMembers) Watch(ctx context.Context, update func([]processor.Member)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case list := <-c:
			update(list)
		}
	}
}

// TestRunClusterAcksEachFrameToItsMember follows a membership that grows
// from one member to two: both members then send a frame with the same
// id, and each gets the ack of its own frame on its own ack socket, once;
// the handler sees every event, with Run on each member's Client.
func TestRunClusterAcksEachFrameToItsMember(t *testing.T) {
	a, b := newFakeDaemon(t), newFakeDaemon(t)
	members := make(chanMembers)
	var mu sync.Mutex
	seen := map[string]int{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- processor.RunCluster(ctx, processor.Options{Logger: slog.New(slog.DiscardHandler)}, members,
			func(ctx context.Context, c *processor.Client) error {
				return c.Run(ctx, func(_ context.Context, ev *processor.Event) error {
					mu.Lock()
					defer mu.Unlock()
					seen[ev.Source+"/"+ev.Key]++
					return nil
				})
			})
	}()
	ma := processor.Member{Name: "a", Endpoint: a.endpoint, AckEndpoint: a.ackEndpoint}
	members <- []processor.Member{ma}
	a.sendFrame(t, 1, 1, event("orders", "o1", 1))
	a.acksUntil(t, "a's frame 1", func(acks []wire.Ack) bool { return framesAcked(acks)[1] == 1 })

	members <- []processor.Member{ma, {Name: "b", Endpoint: b.endpoint, AckEndpoint: b.ackEndpoint}}
	a.sendFrame(t, 7, 1, event("orders", "o7", 7))
	b.sendFrame(t, 7, 1, event("users", "u7", 7))
	for _, d := range []*fakeDaemon{a, b} {
		acks := d.acksUntil(t, "frame 7", func(acks []wire.Ack) bool { return framesAcked(acks)[7] >= 1 })
		if n := framesAcked(acks)[7]; n != 1 {
			t.Errorf("a member got %d acks of its frame 7, want 1: acks went to the wrong member", n)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunCluster: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range []string{"orders/o1", "orders/o7", "users/u7"} {
		if seen[k] != 1 {
			t.Errorf("%s handled %d times, want once (seen %v)", k, seen[k], seen)
		}
	}
}
