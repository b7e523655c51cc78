package delivery

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
)

func TestAckWaitBacksOffWithinCeiling(t *testing.T) {
	timeout := 100 * time.Millisecond
	s := &Sender{o: SenderOptions{AckTimeout: timeout}}
	if got := s.ackWait(1); got != timeout {
		t.Fatalf("first delivery waits %v, want the ack timeout %v", got, timeout)
	}
	for delivery := 2; delivery <= 8; delivery++ {
		ceiling := min(timeout<<(delivery-1), 10*timeout)
		var longest time.Duration
		for range 500 {
			w := s.ackWait(delivery)
			if w < timeout || w > ceiling {
				t.Fatalf("delivery %d waits %v, outside [%v, %v]", delivery, w, timeout, ceiling)
			}
			longest = max(longest, w)
		}
		// Full jitter reaches well into the upper half of the range.
		if longest < timeout+(ceiling-timeout)/2 {
			t.Errorf("delivery %d: longest of 500 waits %v, want above the middle of [%v, %v]", delivery, longest, timeout, ceiling)
		}
	}
}

// TestMissingRawObjectIsDeadLettered queues a frame whose raw object was
// never stored before a good one: the backlog scan dead-letters the first
// frame's events and goes on to deliver the second.
func TestMissingRawObjectIsDeadLettered(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	q, err := queue.Open(queue.Options{Path: filepath.Join(dir, "q.db"), EventsPerFrame: 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	})
	raw, err := rawstore.Open(ctx, rawstore.Options{URL: "file://" + filepath.Join(dir, "raw")})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`[{"id":"g0"},{"id":"g1"}]`)
	if err := raw.Put(ctx, "src/good", body); err != nil {
		t.Fatal(err)
	}
	for _, b := range []queue.Batch{
		{Source: "src", RawKey: "src/gone", FetchedAt: time.Now(), Events: []queue.NewEvent{{Key: "m0", RawLen: 2}, {Key: "m1", RawOff: 2, RawLen: 2}}},
		{Source: "src", RawKey: "src/good", FetchedAt: time.Now(), Events: []queue.NewEvent{{Key: "g0", RawOff: 1, RawLen: 11}, {Key: "g1", RawOff: 13, RawLen: 11}}},
	} {
		if _, err := q.Append(ctx, b); err != nil {
			t.Fatal(err)
		}
	}

	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("inproc://sender-%d", time.Now().UnixNano())
	s, err := NewSender(zctx, q, raw, SenderOptions{Endpoint: endpoint, HighWaterMark: 100, AckTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	pull, err := zctx.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	if err := pull.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := pull.SetRcvtimeo(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if err := pull.Close(); err != nil {
			t.Error(err)
		}
		if err := zctx.Term(); err != nil {
			t.Error(err)
		}
	})

	msg, err := pull.RecvBytes(0)
	if err != nil {
		t.Fatalf("no frame delivered: %v", err)
	}
	if !strings.Contains(string(msg), `"key":"g0"`) || strings.Contains(string(msg), `"key":"m0"`) {
		t.Fatalf("first frame delivered = %s, want the good frame only", msg)
	}
	dl, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dl) != 2 {
		t.Fatalf("dead letters = %+v %v, want m0 and m1", dl, err)
	}
	for _, d := range dl {
		if d.Reason != "raw object missing: src/gone" {
			t.Errorf("dead letter %s reason %q", d.Key, d.Reason)
		}
	}
	if q.PendingEvents() != 2 || q.PendingFrames() != 1 {
		t.Errorf("pending = %d events %d frames, want the good frame's 2 and 1", q.PendingEvents(), q.PendingFrames())
	}
}
