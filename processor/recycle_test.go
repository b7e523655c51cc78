package processor_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/ingestorhq/ingestor/internal/wire"
	"github.com/ingestorhq/ingestor/processor"
)

// TestRecycleFramesReusesMemory runs a Client with RecycleFrames, with one
// worker and with four, on frames sent faster than they are handled: every
// handler sees its own event's payload, whole (no frame is received into
// memory a handler is still reading), and the frames' payloads live in a
// few buffers used again and again, not one per frame.
func TestRecycleFramesReusesMemory(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			d := newFakeDaemon(t)
			var mu sync.Mutex
			buffers := make(map[uintptr]bool) // where each frame's first payload was
			bad := 0
			c, _ := startProcessor(t, d, processor.Options{Workers: workers, RecycleFrames: true},
				func(_ context.Context, ev *processor.Event) error {
					want := fmt.Sprintf(`{"key":%q}`, ev.Key)
					mu.Lock()
					defer mu.Unlock()
					if string(ev.Payload) != want {
						bad++
						t.Errorf("event %s: payload %q, want %q", ev.Key, ev.Payload, want)
					}
					if ev.Key[len(ev.Key)-2:] == "-0" {
						buffers[uintptr(unsafe.Pointer(unsafe.SliceData(ev.Payload)))] = true
					}
					return nil
				})
			const frames, perFrame = 200, 5
			for f := int64(1); f <= frames; f++ {
				evs := make([]wire.Event, perFrame)
				for i := range evs {
					evs[i] = event("src", fmt.Sprintf("f%d-%d", f, i), f*perFrame+int64(i))
				}
				d.sendFrame(t, f, 1, evs...)
			}
			d.acksUntil(t, "every frame to be acked", func(acks []wire.Ack) bool {
				return len(framesAcked(acks)) == frames
			})
			waitStats(t, c, processor.Stats{Frames: frames, Events: frames * perFrame, Acked: frames * perFrame})
			mu.Lock()
			defer mu.Unlock()
			// At most one frame per worker, one waiting for a worker and one
			// being received are in use at once; a buffer too small for the
			// next message is replaced, which frames of growing sizes (ids
			// and keys of up to 3 digits) may do a few times.
			if n, limit := bufferCount(buffers), 2*workers+2+4; n > limit || bad > 0 {
				t.Errorf("%d frames used %d buffers (want at most %d), %d payloads wrong", frames, n, limit, bad)
			}
		})
	}
}

// bufferCount counts the buffers the first payloads of frames were in:
// the frames of the test are ~1 KB, and the first payload of each sits
// within a few bytes of the same place in its buffer (ids and keys grow
// by a digit or two), so addresses less than 64 bytes apart are in one.
func bufferCount(addrs map[uintptr]bool) int {
	n := 0
	var last uintptr
	for _, a := range slices.Sorted(maps.Keys(addrs)) {
		if n == 0 || a-last >= 64 {
			n++
		}
		last = a
	}
	return n
}
