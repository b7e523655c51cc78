package delivery

import (
	"slices"
	"sync"

	"github.com/ingestorhq/ingestor/internal/queue"
)

// frameCache holds committed frames with their payloads from Submit until
// their first send, so that the sender takes from memory a frame it could
// not send at once (the in-flight window was full, the socket refused it):
// a processor that lags does not make the daemon read back from the queue
// and the raw store what it committed a moment ago. Frames read back are
// only those it does not hold: a backlog after a restart, replayed dead
// letters, frames that did not fit, and frames sent again (their ack wait
// ran out: a processor died or is stuck, which is rare). Frames in flight
// are not held: at full speed the cache is empty, and it costs memory only
// while frames wait for the in-flight window.
//
// It is bounded in bytes (publish.frame_cache_bytes): a frame that does not
// fit is not cached, and is read back when its turn comes. A frame's size
// is its payloads plus a fixed cost per event (cachedEventBytes) and the
// lengths of its strings; frames of one fetched page share the page's
// bytes, which stay in memory while any of them is cached.
//
// A nil *frameCache holds nothing. Its methods are safe for concurrent use: Submit adds, the loop records
// deliveries and drops acked frames, the prefetcher reads and drops
// dead-lettered ones, and the ack receiver drops frames partly settled.
type frameCache struct {
	mu     sync.Mutex
	limit  int64
	bytes  int64
	frames map[int64]*cachedFrame
	m      *Metrics
}

type cachedFrame struct {
	f    queue.Frame
	size int64
}

// cachedEventBytes is what an event costs in memory beyond its payload and
// strings: its queue.Event, the wire encoder's work on it, map and slice
// overhead.
const cachedEventBytes = 160

// newFrameCache returns a cache of limit bytes; nil (which holds nothing)
// when limit is 0 or less.
func newFrameCache(limit int64, m *Metrics) *frameCache {
	if limit <= 0 {
		return nil
	}
	return &frameCache{limit: limit, frames: make(map[int64]*cachedFrame), m: m}
}

// frameSize is what caching f costs, in bytes.
func frameSize(f *queue.Frame) int64 {
	n := int64(len(f.Source))
	for i := range f.Events {
		e := &f.Events[i]
		n += int64(cachedEventBytes + len(e.Payload) + len(e.Key) + len(e.RawKey))
	}
	return n
}

// add caches the frames that carry their payloads, as long as they fit.
func (c *frameCache) add(frames []queue.Frame) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range frames {
		f := &frames[i]
		if !hasPayloads(f) {
			continue
		}
		size := frameSize(f)
		if c.bytes+size > c.limit {
			c.m.cacheFull.Inc()
			continue
		}
		c.frames[f.ID] = &cachedFrame{f: *f, size: size}
		c.bytes += size
	}
	c.m.cacheBytes.Set(float64(c.bytes))
}

// get returns cached frame id, never sent yet.
func (c *frameCache) get(id int64) (queue.Frame, bool) {
	if c == nil {
		return queue.Frame{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cf, ok := c.frames[id]
	if !ok {
		return queue.Frame{}, false
	}
	return cf.f, true
}

// drop forgets the frames ids.
func (c *frameCache) drop(ids ...int64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		c.dropLocked(id)
	}
	c.m.cacheBytes.Set(float64(c.bytes))
}

func (c *frameCache) dropLocked(id int64) {
	if cf, ok := c.frames[id]; ok {
		c.bytes -= cf.size
		delete(c.frames, id)
	}
}

// sweep forgets the cached frames in (after, pending[len-1]] that are not
// in pending, the ids of the pending frames in that range, in order: they
// were settled by a way the cache was not told of. Dropping a frame that is
// still pending costs only its read-back.
func (c *frameCache) sweep(after int64, pending []int64) {
	if c == nil {
		return
	}
	if len(pending) == 0 {
		return
	}
	last := pending[len(pending)-1]
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.frames {
		if id > after && id <= last {
			if _, found := slices.BinarySearch(pending, id); !found {
				c.dropLocked(id)
			}
		}
	}
	c.m.cacheBytes.Set(float64(c.bytes))
}

// size returns the bytes and frames cached.
func (c *frameCache) size() (bytes int64, frames int) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes, len(c.frames)
}
