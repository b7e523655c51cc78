// Package tap lets a few readers follow the events the daemon commits, as
// `ingestor tap` does through GET /tap, without ever slowing the commits.
//
// Ingest hands every commit's frames to Hub.Committed once they are
// durable. With no subscriber that is one atomic load. Each subscriber
// has a buffer bounded in events and bytes, and keeps only the first
// MaxBytes of each payload; when its reader falls behind and the buffer is
// full, the events that do not fit are dropped for that subscriber alone
// and counted, and the count goes to the reader after the events buffered
// before them. A commit never waits for a subscriber.
package tap

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ingestorhq/ingestor/internal/queue"
)

// Limits of a subscriber and of the hub.
const (
	// BufferEvents and BufferBytes bound the events a subscriber holds
	// for its reader: their count, and the bytes of their payloads (as
	// kept, up to MaxBytes each) and keys.
	BufferEvents = 1000
	BufferBytes  = 1 << 20
	// MaxPayloadBytes is the largest MaxBytes a subscriber may ask.
	MaxPayloadBytes = 64 << 10
	// DefaultMaxSessions is how many subscribers a hub takes at once
	// unless Options say otherwise.
	DefaultMaxSessions = 4
)

// Errors of Subscribe.
var (
	// ErrBusy: the hub has as many subscribers as it takes.
	ErrBusy = errors.New("tap: too many sessions")
	// ErrClosed: the hub is closed (the daemon stops).
	ErrClosed = errors.New("tap: closed")
)

// Event is what a subscriber sees of one committed event.
type Event struct {
	Source, Key string
	Seq         int64
	// CommittedAt is when the hub saw its commit, once durable.
	CommittedAt time.Time
	FetchedAt   time.Time
	// EventTime is the event's own time, or zero.
	EventTime time.Time
	// Size is the length of the whole payload; Payload holds its first
	// bytes, up to the subscriber's MaxBytes, copied.
	Size    int
	Payload []byte
}

// Truncated reports whether Payload holds less than the whole payload.
func (e Event) Truncated() bool { return len(e.Payload) < e.Size }

// Options configure a Hub.
type Options struct {
	// MaxSessions caps the subscribers at once (DefaultMaxSessions when 0).
	MaxSessions int
	// OnDrop, when set, is told how many events a commit dropped for
	// subscribers that had no room (a counter's Add). It is called on the
	// commit path, so it must be cheap.
	OnDrop func(n int)
}

// Hub hands committed events to its subscribers. Its methods are safe for
// concurrent use.
type Hub struct {
	o Options
	// subs is the current subscribers, replaced whole on every change;
	// nil when there is none, which is all the commit path checks.
	subs atomic.Pointer[[]*Subscriber]

	mu     sync.Mutex // serialises changes of subs, and closed
	closed bool
}

// New returns a Hub with o's limits.
func New(o Options) *Hub {
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	return &Hub{o: o}
}

// MaxSessions returns how many subscribers the hub takes at once.
func (h *Hub) MaxSessions() int { return h.o.MaxSessions }

// Sessions returns how many subscribers the hub has.
func (h *Hub) Sessions() int {
	if p := h.subs.Load(); p != nil {
		return len(*p)
	}
	return 0
}

// Committed hands the events of frames, just made durable, to every
// subscriber that wants their source. It never blocks: a subscriber
// without room loses them, counted. Frames are not kept: each payload's
// first bytes are copied. With no subscriber it only loads a pointer.
func (h *Hub) Committed(frames []queue.Frame) {
	p := h.subs.Load()
	if p == nil {
		return
	}
	now := time.Now()
	dropped := 0
	for _, s := range *p {
		dropped += s.offer(frames, now)
	}
	if dropped > 0 && h.o.OnDrop != nil {
		h.o.OnDrop(dropped)
	}
}

// Subscribe adds a subscriber to the events of sources (every source when
// empty), keeping up to maxBytes (0 to MaxPayloadBytes) of each payload.
// It fails with ErrBusy when the hub has MaxSessions subscribers, and with
// ErrClosed once the hub is closed. Close the subscriber when done.
func (h *Hub) Subscribe(sources []string, maxBytes int) (*Subscriber, error) {
	s := &Subscriber{hub: h, maxBytes: min(max(maxBytes, 0), MaxPayloadBytes),
		ready: make(chan struct{}, 1), done: make(chan struct{})}
	if len(sources) > 0 {
		s.sources = make(map[string]bool, len(sources))
		for _, name := range sources {
			s.sources[name] = true
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	var cur []*Subscriber
	if p := h.subs.Load(); p != nil {
		cur = *p
	}
	if len(cur) >= h.o.MaxSessions {
		return nil, ErrBusy
	}
	next := append(slices.Clip(cur), s)
	h.subs.Store(&next)
	return s, nil
}

// remove takes s out of the subscribers, if it is there.
func (h *Hub) remove(s *Subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.subs.Load()
	if p == nil {
		return
	}
	next := slices.DeleteFunc(slices.Clone(*p), func(x *Subscriber) bool { return x == s })
	if len(next) == 0 {
		h.subs.Store(nil)
		return
	}
	h.subs.Store(&next)
}

// Close ends every subscriber (their Done channels close) and refuses new
// ones.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	p := h.subs.Swap(nil)
	h.mu.Unlock()
	if p != nil {
		for _, s := range *p {
			s.end()
		}
	}
}

// Subscriber is one reader's share of the committed events.
type Subscriber struct {
	hub      *Hub
	sources  map[string]bool // nil: every source
	maxBytes int
	ready    chan struct{} // a token when there is something to Take
	done     chan struct{} // closed when the subscriber ends
	endOnce  sync.Once

	mu    sync.Mutex
	buf   []Event
	bytes int
	// full is set by the first event that did not fit: the events after
	// it are dropped too until Take, so that the dropped ones all come
	// after the buffered ones.
	full    bool
	dropped int64
}

// offer buffers the events of frames that s wants, those that fit, and
// returns how many it dropped.
func (s *Subscriber) offer(frames []queue.Frame, now time.Time) int {
	dropped, took := 0, false
	s.mu.Lock()
	for i := range frames {
		f := &frames[i]
		if s.sources != nil && !s.sources[f.Source] {
			continue
		}
		for j := range f.Events {
			ev := &f.Events[j]
			keep := min(len(ev.Payload), s.maxBytes)
			size := keep + len(ev.Key)
			if s.full || len(s.buf) >= BufferEvents || s.bytes+size > BufferBytes {
				s.full = true
				dropped++
				continue
			}
			s.buf = append(s.buf, Event{Source: ev.Source, Key: ev.Key, Seq: ev.Seq, CommittedAt: now,
				FetchedAt: ev.FetchedAt, EventTime: ev.EventTime, Size: len(ev.Payload),
				Payload: append([]byte(nil), ev.Payload[:keep]...)})
			s.bytes += size
			took = true
		}
	}
	s.dropped += int64(dropped)
	s.mu.Unlock()
	if took || dropped > 0 {
		select {
		case s.ready <- struct{}{}:
		default: // a token is there already
		}
	}
	return dropped
}

// MaxBytes returns how many bytes of each payload s keeps.
func (s *Subscriber) MaxBytes() int { return s.maxBytes }

// Ready has a value when Take has something to return.
func (s *Subscriber) Ready() <-chan struct{} { return s.ready }

// Done is closed when s ends: closed, or its hub closed.
func (s *Subscriber) Done() <-chan struct{} { return s.done }

// Take returns the events buffered since the last Take, in the order they
// were committed, and how many were dropped after them for lack of room;
// the buffer is empty again.
func (s *Subscriber) Take() (events []Event, dropped int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	events, dropped = s.buf, s.dropped
	s.buf, s.bytes, s.full, s.dropped = nil, 0, false, 0
	return events, dropped
}

// Close removes s from its hub and ends it.
func (s *Subscriber) Close() {
	s.hub.remove(s)
	s.end()
}

func (s *Subscriber) end() {
	s.endOnce.Do(func() { close(s.done) })
}
