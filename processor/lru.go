package processor

import (
	"container/list"
	"sync"
)

// keyCache is a bounded set of processed (source, key) pairs that forgets
// the least recently used pair first. It only ever answers "known to be
// processed"; a miss must be checked in the processed table. It is safe for
// concurrent use by workers.
type keyCache struct {
	mu    sync.Mutex
	size  int
	order *list.List // of string, most recent first
	items map[string]*list.Element
}

func newKeyCache(size int) *keyCache {
	return &keyCache{size: size, order: list.New(), items: make(map[string]*list.Element)}
}

// cacheKey joins source and key; a source name never holds a NUL byte
// (PROTOCOL.md allows letters, digits, '_' and '-').
func cacheKey(source, key string) string { return source + "\x00" + key }

// has reports whether (source, key) is cached, marking it recently used.
func (c *keyCache) has(source, key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[cacheKey(source, key)]
	if ok {
		c.order.MoveToFront(e)
	}
	return ok
}

// add caches (source, key), evicting the least recently used pair when full.
func (c *keyCache) add(source, key string) {
	k := cacheKey(source, key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[k]; ok {
		c.order.MoveToFront(e)
		return
	}
	c.items[k] = c.order.PushFront(k)
	for c.order.Len() > c.size {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.items, last.Value.(string))
	}
}
