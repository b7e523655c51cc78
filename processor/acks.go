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
	// maxBatchKeys is the most single-event acks one ack message holds, so
	// that frames with many failures do not make huge messages.
	maxBatchKeys = 4096
)

// ackBatch collects acks until they are sent as one message.
type ackBatch struct {
	frames []int64
	keys   []wire.KeyAck
	// keyFrames counts the frames keys belong to.
	keyFrames int
	// events counts the events the batch acknowledges.
	events int64
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
}

func (b *ackBatch) touch() {
	if b.empty() {
		b.since = time.Now()
	}
}

func (b *ackBatch) empty() bool { return len(b.frames) == 0 && len(b.keys) == 0 }

// frameCount returns the number of frames the batch acks, whole or in part.
func (b *ackBatch) frameCount() int { return len(b.frames) + b.keyFrames }

// full reports whether the batch must be sent before another frame is added.
func (b *ackBatch) full() bool {
	return b.frameCount() >= maxBatchFrames || len(b.keys) >= maxBatchKeys
}

// due reports whether the oldest ack has waited interval or longer.
func (b *ackBatch) due(now time.Time, interval time.Duration) bool {
	return !b.empty() && now.Sub(b.since) >= interval
}

// ack returns the batch as an ack message. It shares the batch's slices.
func (b *ackBatch) ack() wire.Ack {
	return wire.Ack{Frames: b.frames, Keys: b.keys}
}

// reset empties the batch, keeping its memory.
func (b *ackBatch) reset() {
	clear(b.keys) // drop the key strings
	b.frames, b.keys = b.frames[:0], b.keys[:0]
	b.keyFrames, b.events = 0, 0
}
