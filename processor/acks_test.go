package processor

import (
	"reflect"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/wire"
)

func TestAckBatchIsFullAt256Frames(t *testing.T) {
	var b ackBatch
	for id := range int64(maxBatchFrames) {
		if b.full() {
			t.Fatalf("full after %d frames, want %d", id, maxBatchFrames)
		}
		// Whole frames and frames acked by key both count.
		if id%2 == 0 {
			b.addFrame(id, 100)
		} else {
			b.addKey(id, "s", "a")
			b.addKey(id, "s", "b")
		}
	}
	if !b.full() || b.frameCount() != maxBatchFrames {
		t.Errorf("full() = %v with %d frames, want true with %d", b.full(), b.frameCount(), maxBatchFrames)
	}
	if want := int64(maxBatchFrames/2*100 + maxBatchFrames/2*2); b.events != want {
		t.Errorf("batch covers %d events, want %d", b.events, want)
	}
}

func TestAckBatchIsFullAtMaxKeys(t *testing.T) {
	var b ackBatch
	for i := range maxBatchKeys {
		if b.full() {
			t.Fatalf("full after %d keys, want %d", i, maxBatchKeys)
		}
		b.addKey(1, "s", "k")
	}
	if !b.full() || b.frameCount() != 1 {
		t.Errorf("full() = %v, frameCount() = %d; want true and 1", b.full(), b.frameCount())
	}
}

func TestAckBatchDueAndReset(t *testing.T) {
	var b ackBatch
	now := time.Now()
	if b.due(now.Add(time.Hour), time.Millisecond) || !b.empty() {
		t.Fatal("an empty batch is due or not empty")
	}
	b.addFrame(7, 3)
	b.addKey(8, "src", "key")
	since := b.since
	if b.due(since.Add(19*time.Millisecond), 20*time.Millisecond) {
		t.Error("due before the interval passed")
	}
	if !b.due(since.Add(20*time.Millisecond), 20*time.Millisecond) {
		t.Error("not due once the interval passed")
	}
	want := wire.Ack{Frames: []int64{7}, Keys: []wire.KeyAck{{Frame: 8, Source: "src", Key: "key"}}}
	if got := b.ack(); !reflect.DeepEqual(got, want) {
		t.Errorf("ack() = %+v, want %+v", got, want)
	}
	b.since = since.Add(-time.Hour) // an old batch
	b.reset()
	if !b.empty() || b.frameCount() != 0 || b.events != 0 || b.full() {
		t.Errorf("after reset: %+v", b)
	}
	// The interval counts from the first ack added after a reset.
	b.addFrame(9, 1)
	if b.due(time.Now(), time.Minute) {
		t.Error("due at once after a reset: the old batch's age was kept")
	}
}
