package processor

import (
	"fmt"
	"reflect"
	"strings"
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

func TestAckBatchIsFullAtMaxBytes(t *testing.T) {
	var b ackBatch
	n := wire.Nack{Frame: 1, Source: "s", Key: "k", Reason: strings.Repeat("r", maxReasonBytes)}
	for !b.full() {
		b.addNack(n)
	}
	data, err := wire.EncodeAck(b.ack())
	if err != nil {
		t.Fatal(err)
	}
	if len(b.nacks) >= maxBatchKeys || len(data) < maxBatchBytes*9/10 || len(data) > maxBatchBytes+2*maxReasonBytes {
		t.Errorf("full with %d nacks, %d bytes; want fewer than %d nacks and about %d bytes (the estimate is within 10%%)", len(b.nacks), len(data), maxBatchKeys, maxBatchBytes)
	}
}

// TestLargestAckFitsTheDaemonsLimits builds the largest acks the client
// can send, a batch one entry short of full that then takes a frame of
// events_per_frame events acked by key and nacked, and checks that the
// daemon takes them: under wire.MaxAckEntries with the largest frames
// (10000 events), and under the smallest default message limit (1 MiB)
// with the default frames (100 events) and the longest reasons.
func TestLargestAckFitsTheDaemonsLimits(t *testing.T) {
	for _, tc := range []struct {
		perFrame, reason int
		limit            int
	}{
		{10000, 10, 4 << 20},
		{100, maxReasonBytes, 1 << 20},
	} {
		var b ackBatch
		for id := range int64(maxBatchFrames - 2) {
			b.addFrame(id+1, 100)
		}
		for i := 0; ; i++ {
			n := wire.Nack{Frame: 1000, Source: "github", Key: fmt.Sprintf("evt-%08d", i), Reason: strings.Repeat("r", tc.reason)}
			next := b // shares b's arrays, but b ignores what lies past its lengths
			if next.addNack(n); next.full() {
				break // one more would fill it
			}
			b.addNack(n)
		}
		r := frameResult{id: 2000, n: tc.perFrame}
		for i := range r.n {
			k := wire.KeyAck{Frame: r.id, Source: "github", Key: fmt.Sprintf("evt-%08d", i)}
			if i%2 == 0 {
				r.keys = append(r.keys, k)
			} else {
				r.nacks = append(r.nacks, wire.Nack{Frame: k.Frame, Source: k.Source, Key: k.Key, Reason: strings.Repeat("r", tc.reason)})
			}
		}
		b.addResult(r)
		data, err := wire.EncodeAck(b.ack())
		if err != nil {
			t.Fatal(err)
		}
		entries := len(b.frames) + len(b.keys) + len(b.nacks)
		t.Logf("%d events a frame, reasons of %d bytes: the largest ack has %d entries, %d bytes", tc.perFrame, tc.reason, entries, len(data))
		if _, err := wire.DecodeAck(data); err != nil {
			t.Errorf("the daemon would drop the client's largest ack (%d entries): %v", entries, err)
		}
		if len(data) > tc.limit {
			t.Errorf("the client's largest ack is %d bytes, over %d", len(data), tc.limit)
		}
	}
}
