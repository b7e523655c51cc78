package processor

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/ingestorhq/ingestor/internal/wire"
)

// Event is one event as the daemon delivers it. (Source, Key) identifies
// it; Data returns its bytes. Its JSON encoding is the event's form in
// the frame (PROTOCOL.md).
type Event struct {
	// Key is the idempotency key: stable across re-fetches and
	// redeliveries, unique within Source.
	Key string `json:"key"`
	// Source is the name of the [source.NAME] block the event came from.
	Source string `json:"source"`
	// Seq is the daemon's sequence number for the event: unique,
	// increasing in commit order, stable across redeliveries of a queued
	// event, but not an identity (see the package documentation).
	Seq int64 `json:"seq"`
	// FetchedAt is when the daemon received the payload holding the event.
	FetchedAt time.Time `json:"fetched_at"`
	// EventTime is the event's own timestamp when the source knows it,
	// otherwise zero.
	EventTime time.Time `json:"event_time,omitzero"`
	// Traceparent and Tracestate are the W3C trace context of the event's
	// trace when the daemon traced it (PROTOCOL.md): the Handler's context
	// carries it as the remote parent, so spans started from that context
	// continue the trace.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
	// Raw locates the event's bytes in the daemon's raw store.
	Raw RawRef `json:"raw"`
	// Payload is the event's bytes exactly as the upstream sent them, when
	// they are JSON.
	Payload json.RawMessage `json:"payload,omitempty"`
	// PayloadBase64 carries a payload that is not JSON, sent in base64
	// as payload_b64 and decoded here.
	PayloadBase64 []byte `json:"payload_b64,omitempty"`
	// Delivery is the delivery number of the frame that carried the event:
	// 1 the first time the daemon sends it, one higher on each redelivery.
	// It belongs to the frame, not to the event's JSON form.
	Delivery int `json:"-"`
	// Member is the cluster member that sent the event's frame, empty from
	// a daemon outside cluster mode. Deduplicate by (Source, Key), not by
	// member: after a failover two members may send the same event.
	Member string `json:"-"`
}

// RawRef locates an event's bytes in the daemon's raw store.
type RawRef struct {
	// Key is the raw object's key in the daemon's raw store.
	Key string `json:"key"`
	// Off and Len are the event's byte range inside the raw object.
	Off int `json:"off"`
	Len int `json:"len"`
}

// Data returns the event's bytes, whichever field carried them.
func (e *Event) Data() []byte {
	if e.Payload != nil {
		return e.Payload
	}
	return e.PayloadBase64
}

// frame is a decoded events frame, its events of the package's own type.
type frame struct {
	id       int64
	delivery int
	events   []Event
	// buf holds the message the frame was decoded from: the events'
	// payloads point into it.
	buf []byte
}

// fillFrame makes f the frame wf, reusing f's room. The events share
// their strings and payload bytes with wf's, which are not copied; wf's
// events are then cleared so that wf, decoded into again, keeps nothing
// of this frame.
func fillFrame(f *frame, wf *wire.Frame) {
	f.id, f.delivery = wf.ID, wf.Delivery
	n := len(wf.Events)
	f.events = slices.Grow(f.events[:0], n)[:n]
	clear(f.events[n:cap(f.events)]) // what a larger frame before left
	for i := range wf.Events {
		w := &wf.Events[i]
		f.events[i] = Event{
			Key:           w.Key,
			Source:        w.Source,
			Seq:           w.Seq,
			FetchedAt:     w.FetchedAt,
			EventTime:     w.EventTime,
			Traceparent:   w.Traceparent,
			Tracestate:    w.Tracestate,
			Raw:           RawRef{Key: w.Raw.Key, Off: w.Raw.Off, Len: w.Raw.Len},
			Payload:       w.Payload,
			PayloadBase64: w.PayloadBase64,
			Delivery:      wf.Delivery,
			Member:        wf.Member,
		}
	}
	clear(wf.Events)
}

// framePool keeps the frames handled, with their buffers, for the next
// ones, when Options.RecycleFrames allows it; otherwise every frame is
// new. It is used by one goroutine.
type framePool struct {
	recycle bool
	max     int // frames kept at most
	free    []*frame
}

// get returns a frame to receive into.
func (p *framePool) get() *frame {
	if n := len(p.free); n > 0 {
		f := p.free[n-1]
		p.free = p.free[:n-1]
		return f
	}
	return new(frame)
}

// put gives back a frame no longer used, or one that get returned and
// was not used (a frame whose buf is nil holds nothing to recycle).
func (p *framePool) put(f *frame) {
	if f != nil && (p.recycle || f.buf == nil) && len(p.free) < p.max {
		p.free = append(p.free, f)
	}
}
