// Package wire is the ZeroMQ message format between the daemon and its
// processors, version 1. PROTOCOL.md at the repository root is its
// specification; this package is the Go implementation of it.
package wire

import (
	"encoding/base64"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// Version is the protocol version this package speaks.
const Version = 1

// Message types.
const (
	TypeEvents = "events"
	TypeAck    = "ack"
)

// RawRef locates an event's bytes in the raw store.
type RawRef struct {
	// Key is the raw object's key in the store named by Frame.RawStore.
	Key string `json:"key"`
	// Off and Len are the event's byte range inside the raw object.
	Off int `json:"off"`
	Len int `json:"len"`
}

// Event is one event as a processor receives it.
type Event struct {
	// Key is the idempotency key: stable across re-fetches and redeliveries,
	// unique within Source.
	Key string `json:"key"`
	// Source is the name of the [source.NAME] block the event came from.
	Source string `json:"source"`
	// Seq is the daemon's sequence number for the event: unique, increasing
	// in commit order, stable across redeliveries.
	Seq int64 `json:"seq"`
	// FetchedAt is when the daemon received the payload holding the event.
	FetchedAt time.Time `json:"fetched_at"`
	// EventTime is the event's own timestamp when the source knows it.
	EventTime time.Time `json:"event_time,omitzero"`
	// Traceparent and Tracestate are the W3C trace context of the event's
	// trace, set when the daemon traced it (sampled); a processor continues
	// the trace from them.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
	// Raw locates the event's bytes in the raw store.
	Raw RawRef `json:"raw"`
	// Payload is the event's bytes exactly as the upstream sent them, when
	// they are JSON.
	Payload json.RawMessage `json:"payload,omitempty"`
	// PayloadBase64 carries a payload that is not JSON (base64 on the wire).
	PayloadBase64 []byte `json:"payload_b64,omitempty"`
}

// Data returns the event's bytes, whichever field carried them.
func (e *Event) Data() []byte {
	if e.Payload != nil {
		return e.Payload
	}
	return e.PayloadBase64
}

// Frame is one ZeroMQ message of type "events": many events packed together.
type Frame struct {
	// V is the protocol version.
	V int `json:"v"`
	// Type is "events".
	Type string `json:"type"`
	// ID identifies the frame for acks.
	ID int64 `json:"frame"`
	// Delivery counts deliveries of this frame, from 1; above 1 it is a resend.
	Delivery int `json:"delivery"`
	// RawStore names the raw store that Event.Raw refers to.
	RawStore string `json:"raw_store"`
	// Member is the cluster member that sent the frame; empty (absent)
	// from a daemon outside cluster mode.
	Member string `json:"member,omitempty"`
	// Events are the frame's events, in Seq order.
	Events []Event `json:"events"`
}

// KeyAck acknowledges one event of a frame on its own.
type KeyAck struct {
	Frame  int64  `json:"frame"`
	Source string `json:"source"`
	Key    string `json:"key"`
}

// Nack reports that a processor could not process one event. A permanent
// nack moves the event to the dead-letter list at once; a retryable one
// records the reason and leaves the event for redelivery on the backoff
// schedule.
type Nack struct {
	Frame     int64  `json:"frame"`
	Source    string `json:"source"`
	Key       string `json:"key"`
	Reason    string `json:"reason"`
	Permanent bool   `json:"permanent,omitempty"`
}

// Ack is one ZeroMQ message of type "ack" sent by a processor.
type Ack struct {
	// V is the protocol version.
	V int `json:"v"`
	// Type is "ack".
	Type string `json:"type"`
	// Frames are frames whose every event was processed.
	Frames []int64 `json:"frames,omitempty"`
	// Keys are single events processed from frames not acked whole.
	Keys []KeyAck `json:"keys,omitempty"`
	// Nacks are events that could not be processed, with the reason.
	Nacks []Nack `json:"nacks,omitempty"`
}

// EncodeAck serializes an ack message.
func EncodeAck(a Ack) ([]byte, error) {
	a.V, a.Type = Version, TypeAck
	return json.Marshal(a)
}

// Encoder appends frames to a reusable buffer without reflection; the daemon
// encodes every event it sends, so this is on the hot path.
type Encoder struct {
	buf []byte
	// fetched and fetchedJSON are the last fetched_at encoded and its
	// text: a frame's events nearly always share it, and formatting a
	// time costs more than the rest of the event's envelope.
	fetched     time.Time
	fetchedJSON []byte
	// member is the "member" every frame carries; "" for none.
	member string
}

// SetMember makes every frame begun from now on carry member (cluster
// mode); "" carries none.
func (e *Encoder) SetMember(member string) { e.member = member }

// Begin starts a frame.
func (e *Encoder) Begin(id int64, delivery int, rawStore string) {
	b := e.buf[:0]
	b = append(b, `{"v":1,"type":"events","frame":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"delivery":`...)
	b = strconv.AppendInt(b, int64(delivery), 10)
	b = append(b, `,"raw_store":`...)
	b = AppendString(b, rawStore)
	if e.member != "" {
		b = append(b, `,"member":`...)
		b = AppendString(b, e.member)
	}
	b = append(b, `,"events":[`...)
	e.buf = b
}

// Add appends one event. payloadIsJSON says whether payload is a JSON value
// to embed as is; otherwise, and also when payload is not valid UTF-8, it is
// sent base64-encoded as payload_b64, so that a frame is always valid UTF-8
// JSON (PROTOCOL.md, Events frame).
func (e *Encoder) Add(ev *Event, payload []byte, payloadIsJSON bool) {
	b := e.buf
	if b[len(b)-1] != '[' {
		b = append(b, ',')
	}
	b = append(b, `{"key":`...)
	b = AppendString(b, ev.Key)
	b = append(b, `,"source":`...)
	b = AppendString(b, ev.Source)
	b = append(b, `,"seq":`...)
	b = strconv.AppendInt(b, ev.Seq, 10)
	if e.fetchedJSON == nil || !ev.FetchedAt.Equal(e.fetched) {
		e.fetched = ev.FetchedAt
		e.fetchedJSON = append(ev.FetchedAt.UTC().AppendFormat(append(e.fetchedJSON[:0], `,"fetched_at":"`...), time.RFC3339Nano), '"')
	}
	b = append(b, e.fetchedJSON...)
	if !ev.EventTime.IsZero() {
		b = append(b, `,"event_time":"`...)
		b = ev.EventTime.UTC().AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	if ev.Traceparent != "" {
		b = append(b, `,"traceparent":`...)
		b = AppendString(b, ev.Traceparent)
		if ev.Tracestate != "" {
			b = append(b, `,"tracestate":`...)
			b = AppendString(b, ev.Tracestate)
		}
	}
	b = append(b, `,"raw":{"key":`...)
	b = AppendString(b, ev.Raw.Key)
	b = append(b, `,"off":`...)
	b = strconv.AppendInt(b, int64(ev.Raw.Off), 10)
	b = append(b, `,"len":`...)
	b = strconv.AppendInt(b, int64(ev.Raw.Len), 10)
	b = append(b, '}')
	if payloadIsJSON && utf8.Valid(payload) {
		b = append(b, `,"payload":`...)
		b = append(b, payload...)
	} else {
		b = append(b, `,"payload_b64":"`...)
		b = base64.StdEncoding.AppendEncode(b, payload)
		b = append(b, '"')
	}
	b = append(b, '}')
	e.buf = b
}

// End closes the frame and returns its bytes, valid until the next Begin.
func (e *Encoder) End() []byte {
	e.buf = append(e.buf, "]}"...)
	return e.buf
}

const hexDigits = "0123456789abcdef"

// safeSet marks the ASCII bytes that AppendString copies unescaped: exactly
// those encoding/json leaves alone with its default HTML escaping, so every
// control byte, '"', '\\', '<', '>' and '&' are escaped.
var safeSet = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		switch c {
		case '"', '\\', '<', '>', '&':
		default:
			t[c] = true
		}
	}
	return t
}()

// AppendString appends s to b as a JSON string, byte for byte as json.Marshal
// writes it: invalid UTF-8 becomes U+FFFD, and '<', '>', '&', U+2028 and
// U+2029 are escaped as \u sequences.
func AppendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if safeSet[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
