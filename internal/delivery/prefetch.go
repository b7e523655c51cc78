package delivery

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strconv"
	"time"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
)

// scanPage is how many frame ids one backlog query returns.
const scanPage = 256

// prefetchDepth is how many loaded frames may wait for the loop. With the
// frame the prefetcher holds and the raw objects it caches (maxRawCache),
// it bounds the memory the backlog scan uses beyond the in-flight window.
const prefetchDepth = 4

// maxRawCache bounds the raw objects and pages the prefetcher keeps while
// it serves one request.
const maxRawCache = 16

// rawCache is what the prefetcher keeps of the raw store: the objects and
// pages read (and checked) for the request it serves, and, across
// requests, the last one the previous request used, where the next most
// likely starts, and where the pages of page segments are.
type rawCache struct {
	bodies map[string][]byte
	pages  rawstore.PageIndex
	// last is the key in bodies of the object or page the request being
	// served used last; "" when it used none.
	last string
}

// keepLast forgets every object and page but the last one the request
// used: the next request reads the rest of a large page from it instead of
// from the raw store again, and frames still waiting to be sent share it
// instead of holding a copy of their own. A request that used none (the
// empty one that ends the backlog) leaves nothing held.
func (c *rawCache) keepLast() {
	for k := range c.bodies {
		if k != c.last {
			delete(c.bodies, k)
		}
	}
}

// scanRequest asks the prefetcher for the pending frames after the id after,
// one page of them.
type scanRequest struct {
	epoch uint64
	after int64
}

// readyFrame is a backlog frame with its payloads, ready to send.
type readyFrame struct {
	queue.Frame
	// notJSON marks the events whose bytes, read back from the raw store,
	// are not JSON text; they are sent as payload_b64. It is nil when all
	// of them are JSON, as they were when their source parsed them.
	notJSON []bool
}

// prefetched is one answer to a scanRequest. The answers to a request come
// in id order, one per frame of the page, then one with done set.
type prefetched struct {
	epoch uint64
	// id is the frame handled; frame is nil when there is nothing of it to
	// send: it is no longer pending, was dead-lettered, or was in flight
	// (inFlight).
	id       int64
	frame    *readyFrame
	inFlight bool
	// done ends the answers to the request: notYet reports that the page
	// stopped at a frame committed but not yet submitted (the loop scans
	// again at its next tick, when the frame is in the frame cache); empty
	// that no pending frame follows the request's id, err that the queue or the raw store
	// failed (the loop retries on its next tick).
	done   bool
	notYet bool
	empty  bool
	err    error
}

// prefetch serves the loop's scan requests until ctx ends. It runs on its
// own goroutine and never touches the socket: it reads the queue and the
// raw store and dead-letters what can never be sent.
func (s *Sender) prefetch(ctx context.Context) {
	cache := &rawCache{bodies: make(map[string][]byte)}
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-s.scanReq:
			cache.last = ""
			s.scan(ctx, r, cache)
			cache.keepLast()
		}
	}
}

// scan answers r, giving up when the loop starts a new epoch.
func (s *Sender) scan(ctx context.Context, r scanRequest, cache *rawCache) {
	answer := func(p prefetched) bool {
		p.epoch = r.epoch
		select {
		case s.ready <- p:
			return true
		case <-ctx.Done():
			return false
		}
	}
	fail := func(err error) {
		if ctx.Err() == nil {
			s.o.Logger.Error("scan queue backlog", "err", err)
		}
		answer(prefetched{done: true, err: err})
	}
	ids, err := s.q.FramesAfter(ctx, r.after, scanPage)
	if err != nil {
		fail(err)
		return
	}
	s.cache.sweep(r.after, ids)
	for _, id := range ids {
		if s.scanEpoch.Load() != r.epoch {
			return // superseded: the loop drops what this epoch sends
		}
		f, err := s.prefetchFrame(ctx, id, cache)
		if errors.Is(err, errInFlight) {
			if !answer(prefetched{id: id, inFlight: true}) {
				return
			}
			continue
		}
		if errors.Is(err, errNotYetSubmitted) {
			answer(prefetched{done: true, notYet: true})
			return
		}
		if err != nil {
			fail(err)
			return
		}
		if !answer(prefetched{id: id, frame: f}) {
			return
		}
	}
	answer(prefetched{done: true, empty: len(ids) == 0})
}

// isInflight reports whether frame id is sent and waiting for its ack.
func (s *Sender) isInflight(id int64) bool {
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	_, ok := s.inflight[id]
	return ok
}

// errInFlight is prefetchFrame's answer for a frame sent and waiting for
// its ack.
var errInFlight = errors.New("frame in flight")

// errNotYetSubmitted is prefetchFrame's answer for a frame committed a
// moment ago whose Submit has not come yet (the scan found it between the
// commit and the Submit that follows it): reading it back would read from
// disk what the frame cache is about to hold.
var errNotYetSubmitted = errors.New("frame committed, not yet submitted")

// submitGrace bounds how long the scan leaves a frame above the highest
// submitted id alone: one committed by a path that never submits (none
// does today) is read back after it, as any other backlog frame.
const submitGrace = time.Second

// prefetchFrame loads pending frame id, which is not in flight, with its
// payloads. It returns nil when there is nothing to send: the frame is no
// longer pending, or was dead-lettered here (max_deliveries reached, or
// every raw object gone or corrupt). Only the loop sends frames, and only frames this
// returned for the current epoch, so a frame not in flight when scan looked
// stays so until the loop gets it.
func (s *Sender) prefetchFrame(ctx context.Context, id int64, cache *rawCache) (*readyFrame, error) {
	// Read before the cache: Submit caches before it raises submitted, so
	// a frame at or below it that the cache misses was cached and is gone
	// (sent, or dropped), while one above it may be cached any moment.
	submitted := s.submitted.Load()
	if f, ok := s.cache.get(id); ok && !f.PayloadsReleased() {
		// Its payloads are those its source validated: no JSON check.
		if dead, err := s.deadLetterOverdue(ctx, &f); dead || err != nil {
			return nil, err
		}
		return &readyFrame{Frame: f}, nil
	}
	// Looked up after the cache: send registers a frame in flight before
	// dropping it from the cache, so a frame being sent is found in one
	// or the other, never read back.
	if s.isInflight(id) {
		return nil, errInFlight
	}
	f, ok, err := s.q.LoadFrame(ctx, id)
	if err != nil || !ok || len(f.Events) == 0 {
		return nil, err
	}
	if id > submitted && time.Since(f.Committed) < submitGrace {
		return nil, errNotYetSubmitted
	}
	s.o.Metrics.readBack.Inc()
	if dead, err := s.deadLetterOverdue(ctx, &f); dead || err != nil {
		return nil, err
	}
	if ok, err := s.fillOrDeadLetter(ctx, &f, cache); err != nil || !ok {
		if err != nil {
			err = fmt.Errorf("read raw payloads of frame %d for resend: %w", id, err)
		}
		return nil, err
	}
	r := &readyFrame{Frame: f, notJSON: s.checkJSON(&f)}
	return r, nil
}

// deadLetterOverdue dead-letters f when it has been delivered
// max_deliveries times, and reports whether it did.
func (s *Sender) deadLetterOverdue(ctx context.Context, f *queue.Frame) (bool, error) {
	if s.o.MaxDeliveries <= 0 || f.Deliveries < s.o.MaxDeliveries {
		return false, nil
	}
	reason := fmt.Sprintf("not acked after %d deliveries", f.Deliveries)
	n, err := s.q.DeadLetterFrame(ctx, f.ID, reason)
	if err != nil {
		return false, err
	}
	s.cache.drop(f.ID)
	s.o.Logger.Warn("frame dead-lettered", "frame", f.ID, "source", f.Source, "events", n, "reason", reason)
	s.o.Metrics.deadLettered.Inc()
	s.o.Metrics.eventsDeadLettered.Add(float64(n))
	return true, nil
}

// checkJSON returns which of f's payloads are not JSON text (nil if all
// are). Every source validated its records before they were queued, so
// this finds only a raw object changed since that carries no checksum (a
// push segment; fillPayloads checks the others): those bytes still go
// out, but as payload_b64, so that the frame stays valid JSON.
func (s *Sender) checkJSON(f *queue.Frame) []bool {
	var notJSON []bool
	var d jsonscan.Decoder
	for i := range f.Events {
		e := &f.Events[i]
		d.Reset(e.Payload)
		if _, _, err := d.Value(); err == nil && d.End() == nil {
			continue
		}
		if notJSON == nil {
			notJSON = make([]bool, len(f.Events))
		}
		notJSON[i] = true
		s.o.Logger.Warn("raw object bytes of an event are not JSON; sending them as payload_b64",
			"frame", f.ID, "source", e.Source, "key", e.Key, "raw_key", e.RawKey, "off", e.RawOff, "len", e.RawLen)
	}
	return notJSON
}

// fillOrDeadLetter reads f's payloads from the raw store. Events whose raw
// bytes are gone for good (fs.ErrNotExist) or no longer match their
// checksum (rawstore.ErrCorrupt) can never be delivered: they are
// dead-lettered, so that they neither hold the backlog up forever nor go
// out with wrong bytes, and f is reloaded without them. ok is false when
// nothing of f is left to send. Any other error is returned: the frame is
// retried on the next tick.
func (s *Sender) fillOrDeadLetter(ctx context.Context, f *queue.Frame, cache *rawCache) (ok bool, err error) {
	for {
		err := s.fillPayloads(ctx, f, cache)
		var bad *unusableRawError
		if !errors.As(err, &bad) {
			return err == nil, err
		}
		var seqs []int64
		for _, e := range f.Events {
			if e.RawKey == bad.key && e.RawOff >= bad.lo && e.RawOff < bad.hi {
				seqs = append(seqs, e.Seq)
			}
		}
		n, err := s.q.DeadLetterEvents(ctx, f.ID, seqs, bad.reason)
		if err != nil {
			return false, err
		}
		s.cache.drop(f.ID)
		s.o.Logger.Warn("events dead-lettered", "frame", f.ID, "source", f.Source, "events", n, "reason", bad.reason, "err", bad.err)
		s.o.Metrics.eventsDeadLettered.Add(float64(n))
		again, pending, err := s.q.LoadFrame(ctx, f.ID)
		if err != nil {
			return false, err
		}
		if !pending || len(again.Events) == 0 {
			return false, nil
		}
		*f = again
	}
}

// unusableRawError reports raw bytes that can never be sent: the object
// no longer exists, or its bytes (or one page's, in a page segment) no
// longer match their checksum. The events of key at offsets in [lo, hi)
// are those affected.
type unusableRawError struct {
	key    string
	lo, hi int
	// reason is the dead letters' reason: "raw object missing: KEY" or a
	// rawstore.CorruptError's Reason.
	reason string
	err    error
}

func (e *unusableRawError) Error() string { return fmt.Sprintf("raw object %s: %v", e.key, e.err) }
func (e *unusableRawError) Unwrap() error { return e.err }

// unusable returns the *unusableRawError for err, the failed read of the
// offsets [lo, hi) of key, when it is one, or nil.
func unusable(key string, lo, hi int, err error) *unusableRawError {
	if errors.Is(err, fs.ErrNotExist) {
		return &unusableRawError{key: key, lo: 0, hi: math.MaxInt, reason: "raw object missing: " + key, err: err}
	}
	var ce *rawstore.CorruptError
	if !errors.As(err, &ce) {
		return nil
	}
	return &unusableRawError{key: key, lo: lo, hi: hi, reason: ce.Reason(), err: err}
}

// fillPayloads sets the payloads of f's events from their raw objects,
// through cache. Events in a page segment (many pages in one large file)
// are read as their page, which is checked against its checksum, not as
// the whole segment; whole objects are checked by the store's Get.
func (s *Sender) fillPayloads(ctx context.Context, f *queue.Frame, cache *rawCache) error {
	pr, _ := s.raw.(rawstore.PageReader)
	for i := range f.Events {
		e := &f.Events[i]
		cacheKey, base := e.RawKey, 0
		var ref rawstore.PageRef
		inPage := pr != nil && rawstore.IsPageSegment(e.RawKey)
		if inPage {
			var err error
			if ref, err = pr.FindPage(ctx, e.RawKey, e.RawOff, &cache.pages); err != nil {
				// The segment cannot be read up to this event's page,
				// nor past it.
				if bad := unusable(e.RawKey, e.RawOff, math.MaxInt, err); bad != nil {
					return bad
				}
				return fmt.Errorf("raw object %s: %w", e.RawKey, err)
			}
			cacheKey, base = e.RawKey+"@"+strconv.Itoa(ref.Off), ref.Off
		}
		body, ok := cache.bodies[cacheKey]
		if !ok {
			var err error
			if inPage {
				body, err = pr.ReadPage(ctx, e.RawKey, ref)
			} else {
				body, err = s.raw.Get(ctx, e.RawKey)
			}
			if err != nil {
				lo, hi := ref.Off, ref.Off+ref.Len // the page's events
				if !inPage {
					lo, hi = 0, math.MaxInt
				}
				if bad := unusable(e.RawKey, lo, hi, err); bad != nil {
					return bad
				}
				return fmt.Errorf("raw object %s: %w", e.RawKey, err)
			}
			if len(cache.bodies) >= maxRawCache {
				clear(cache.bodies)
			}
			cache.bodies[cacheKey] = body
		}
		cache.last = cacheKey
		off := e.RawOff - base
		if off < 0 || off+e.RawLen > len(body) {
			return fmt.Errorf("raw object %s: event %d range [%d,+%d) outside %d bytes", e.RawKey, e.Seq, e.RawOff, e.RawLen, base+len(body))
		}
		e.Payload = body[off : off+e.RawLen]
	}
	return nil
}
