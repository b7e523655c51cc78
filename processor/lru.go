package processor

import "sync"

// keyCache is a bounded set of processed (source, key) pairs that forgets
// the least recently used pair first. It only ever answers "known to be
// processed"; a miss must be checked in the processed table. It is safe for
// concurrent use by workers.
//
// Its pairs live in a slice, linked in recency order by index, so that a
// full cache looks pairs up and adds them without allocating: the slot of
// the pair evicted takes the new one.
type keyCache struct {
	mu    sync.Mutex
	size  int
	slots []cacheSlot
	items map[cacheKey]int // index in slots
	// head is the most recently used slot, tail the least; -1 when empty.
	head, tail int
}

// cacheKey is a (source, key) pair.
type cacheKey struct{ source, key string }

// cacheSlot holds one pair and its neighbours in recency order: prev is
// more recent, next less recent, -1 at either end.
type cacheSlot struct {
	k          cacheKey
	prev, next int
}

func newKeyCache(size int) *keyCache {
	return &keyCache{size: size, items: make(map[cacheKey]int), head: -1, tail: -1}
}

// has reports whether (source, key) is cached, marking it recently used.
func (c *keyCache) has(source, key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.items[cacheKey{source, key}]
	if ok {
		c.moveToFront(i)
	}
	return ok
}

// add caches (source, key), evicting the least recently used pair when full.
func (c *keyCache) add(source, key string) {
	k := cacheKey{source, key}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.items[k]; ok {
		c.moveToFront(i)
		return
	}
	var i int
	if len(c.slots) < c.size {
		i = len(c.slots)
		c.slots = append(c.slots, cacheSlot{k: k, prev: -1, next: -1})
	} else {
		i = c.tail
		c.unlink(i)
		delete(c.items, c.slots[i].k)
		c.slots[i].k = k
	}
	c.items[k] = i
	c.pushFront(i)
}

// moveToFront makes slot i the most recently used.
func (c *keyCache) moveToFront(i int) {
	if c.head != i {
		c.unlink(i)
		c.pushFront(i)
	}
}

// unlink takes slot i out of the recency order.
func (c *keyCache) unlink(i int) {
	s := &c.slots[i]
	if s.prev >= 0 {
		c.slots[s.prev].next = s.next
	} else {
		c.head = s.next
	}
	if s.next >= 0 {
		c.slots[s.next].prev = s.prev
	} else {
		c.tail = s.prev
	}
	s.prev, s.next = -1, -1
}

// pushFront puts slot i, unlinked, first in the recency order.
func (c *keyCache) pushFront(i int) {
	s := &c.slots[i]
	s.prev, s.next = -1, c.head
	if c.head >= 0 {
		c.slots[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
}
