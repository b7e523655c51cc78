package processor

import (
	"time"

	"github.com/ingestorhq/ingestor/internal/wire"
)

// Limits of one ack message.
const (
	// maxBatchFrames is the most frames, acked whole or in part, one ack
	// message holds.
	maxBatchFrames = 256
	// maxBatchKeys is the most single-event acks and nacks one ack
	// message holds, so that frames with many failures do not make huge
	// messages.
	maxBatchKeys = 4096
	// maxBatchBytes is about the most bytes of keys, sources and reasons
	// one ack message holds: far below the smallest message limit a
	// daemon has by default (1 MiB), even with the events of the frame
	// that crossed it, so that long reasons in a failure storm do not
	// make an ack the daemon refuses, again on every redelivery.
	maxBatchBytes = 512 << 10
)

// ackBatch collects acks until they are sent as one message.
type ackBatch struct {
	frames []int64
	keys   []wire.KeyAck
	nacks  []wire.Nack
	// keyFrames counts the frames keys belong to, and nackFrames those
	// nacks belong to (a frame with both counts twice, which only makes
	// the message smaller).
	keyFrames, nackFrames int
	// events counts the events the batch acknowledges.
	events int64
	// bytes estimates the size of the keys and nacks as JSON.
	bytes int
	// since is when the oldest ack in the batch was added.
	since time.Time
}

// addFrame acks frame id, which holds n events, whole.
func (b *ackBatch) addFrame(id int64, n int) {
	b.touch()
	b.frames = append(b.frames, id)
	b.events += int64(n)
}

// addKey acks one event of frame id. The keys of one frame are added one
// after another.
func (b *ackBatch) addKey(id int64, source, key string) {
	b.touch()
	if len(b.keys) == 0 || b.keys[len(b.keys)-1].Frame != id {
		b.keyFrames++
	}
	b.keys = append(b.keys, wire.KeyAck{Frame: id, Source: source, Key: key})
	b.events++
	b.bytes += entryBytes + len(source) + len(key)
}

// addNack reports that one event of frame n.Frame failed. The nacks of one
// frame are added one after another.
func (b *ackBatch) addNack(n wire.Nack) {
	b.touch()
	if len(b.nacks) == 0 || b.nacks[len(b.nacks)-1].Frame != n.Frame {
		b.nackFrames++
	}
	b.nacks = append(b.nacks, n)
	b.bytes += entryBytes + len(n.Source) + len(n.Key) + len(n.Reason)
}

// entryBytes is about the JSON of a key ack or nack besides its strings.
const entryBytes = 64

// addResult records a worker's outcome for one frame.
func (b *ackBatch) addResult(r frameResult) {
	if r.whole {
		b.addFrame(r.id, r.n)
	} else {
		for _, k := range r.keys {
			b.addKey(k.Frame, k.Source, k.Key)
		}
	}
	for _, n := range r.nacks {
		b.addNack(n)
	}
}

func (b *ackBatch) touch() {
	if b.empty() {
		b.since = time.Now()
	}
}

func (b *ackBatch) empty() bool { return len(b.frames) == 0 && len(b.keys) == 0 && len(b.nacks) == 0 }

// frameCount returns the number of frames the batch acks, whole or in part.
func (b *ackBatch) frameCount() int { return len(b.frames) + b.keyFrames + b.nackFrames }

// full reports whether the batch must be sent before another frame is added.
func (b *ackBatch) full() bool {
	return b.frameCount() >= maxBatchFrames || len(b.keys)+len(b.nacks) >= maxBatchKeys || b.bytes >= maxBatchBytes
}

// due reports whether the oldest ack has waited interval or longer.
func (b *ackBatch) due(now time.Time, interval time.Duration) bool {
	return !b.empty() && now.Sub(b.since) >= interval
}

// ack returns the batch as an ack message. It shares the batch's slices.
func (b *ackBatch) ack() wire.Ack {
	return wire.Ack{Frames: b.frames, Keys: b.keys, Nacks: b.nacks}
}

// reset empties the batch, keeping its memory.
func (b *ackBatch) reset() {
	clear(b.keys) // drop the key strings
	clear(b.nacks)
	b.frames, b.keys, b.nacks = b.frames[:0], b.keys[:0], b.nacks[:0]
	b.keyFrames, b.nackFrames, b.events, b.bytes = 0, 0, 0, 0
}
