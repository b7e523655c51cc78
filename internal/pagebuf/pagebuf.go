// Package pagebuf recycles the buffers that polled pages are read into.
//
// A page's body is read into a buffer taken from a Pool and is then shared,
// without copies, by everything downstream of the fetch: the raw store's
// write, the events queued from it (their payloads are slices of it) and
// the frames built from those, until each frame is encoded for its first
// send. A Page counts these holders, and the last one to let go puts the
// buffer back for a later fetch: a daemon at full speed otherwise
// allocates, zeroes and collects half a kilobyte of fresh heap per event
// (half of all it allocates), which drove the garbage collector's cycles.
//
// Recycling is an optimisation, never a requirement: a holder that does
// not let go (a frame dropped from the frame cache unsent, a batch whose
// commit failed, a page the raw store had to be asked for twice) leaves
// the buffer to the garbage collector, which is always safe. So only the
// paths that know the bytes will not be read again let go, and anything
// that might read them at a time no hold accounts for calls Keep.
package pagebuf

import (
	"sync"
	"sync/atomic"
)

// Pool holds buffers for reuse. The zero Pool is ready; it keeps what it
// is given only until the garbage collector's next cycles (sync.Pool), so
// an idle daemon holds none.
type Pool struct {
	p sync.Pool // of *[]byte
}

// Get returns an empty buffer of capacity at least n: a recycled one when
// the pool has one no larger than n + n/4 (a page in flight then holds at
// most a quarter more than its bytes), otherwise a new one.
func (p *Pool) Get(n int) []byte {
	if bp, _ := p.p.Get().(*[]byte); bp != nil {
		if b := *bp; fits(cap(b), n) {
			return b[:0]
		}
		// Of another size (a source with other pages): dropped.
	}
	return make([]byte, 0, n)
}

// fits reports whether a buffer of capacity c is reused for n bytes.
func fits(c, n int) bool { return c >= n && c <= n+n/4 }

// NewPage returns the Page of buf, a buffer that Get returned and that now
// holds a body, with one hold: the fetch's, let go by Release.
func (p *Pool) NewPage(buf []byte) *Page {
	pg := &Page{pool: p, buf: buf}
	pg.refs.Store(1)
	return pg
}

// Page is one buffer and the count of its holders. The methods of a nil
// *Page do nothing: a body that was not read into a pooled buffer (a push
// request, a page read back from the raw store) has none.
type Page struct {
	pool *Pool
	buf  []byte
	refs atomic.Int64
	// kept is set by Keep: the buffer is never recycled.
	kept atomic.Bool
}

// Keep marks the page's buffer as never to be recycled: something may
// read it at a time no hold accounts for (a raw-store write that was
// abandoned and retried may still be sending it).
func (pg *Page) Keep() {
	if pg != nil {
		pg.kept.Store(true)
	}
}

// Release lets go of the fetch's hold (once: the caller that got the Page
// from NewPage calls it when the batch is committed and nothing of it is
// read any more but through the frames' holds).
func (pg *Page) Release() {
	if pg != nil {
		pg.release()
	}
}

func (pg *Page) release() {
	n := pg.refs.Add(-1)
	if n < 0 {
		panic("pagebuf: page released more often than held")
	}
	if n == 0 && !pg.kept.Load() {
		b := pg.buf[:0]
		pg.buf = nil
		pg.pool.p.Put(&b)
		recycled.Add(1)
	}
}

// recycled counts the buffers given back to their pools.
var recycled atomic.Int64

// Recycled returns how many buffers were given back to their pools since
// the process started.
func Recycled() int64 { return recycled.Load() }

// Hold returns a new hold on the page, for a frame whose payloads are
// slices of it; nil for a nil Page.
func (pg *Page) Hold() *Hold {
	if pg == nil {
		return nil
	}
	pg.refs.Add(1)
	return &Hold{page: pg}
}

// Hold is one frame's hold on its page. It is shared by every copy of the
// frame, so that letting go is done once whichever copy does it.
type Hold struct {
	page *Page
	done atomic.Bool
}

// Release lets go of the hold; the calls after the first do nothing, as do
// those of a nil Hold. The caller must not read the frame's payloads after
// it.
func (h *Hold) Release() {
	if h != nil && h.done.CompareAndSwap(false, true) {
		h.page.release()
	}
}

// Released reports whether Release was called: the frame's payloads may
// then be another page's bytes, and must be read back instead.
func (h *Hold) Released() bool {
	return h != nil && h.done.Load()
}
