package wire

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"slices"
	"time"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// DecodeFrame parses an events message.
//
// It accepts any valid JSON object in the version 1 format: fields in any
// order, unknown fields (at every level) ignored, whitespace anywhere and
// escapes in strings. It reads data in a single pass with a
// jsonscan.Decoder, which validates all of it, payloads and unknown fields
// included (an event laid out otherwise than the Encoder lays events out
// is read up to where it differs, then again member by member):
// malformed JSON, a field of the wrong JSON type, an integer
// that does not fit its field, a timestamp that is not RFC 3339 and a
// payload_b64 that is not standard base64 are errors, as are a version
// other than 1 and a type other than "events".
//
// Fields decode as encoding/json decodes them into a Frame: strings are
// unescaped (invalid UTF-8 becomes U+FFFD), timestamps are parsed as
// time.Time.UnmarshalJSON parses them, null leaves a field as it is
// (a null payload is the JSON payload null), and a repeated field is
// decoded again, the last occurrence winning. It differs from
// encoding/json in two ways:
//
//   - Field names match exactly. encoding/json also matches them ignoring
//     case ("Key", "SEQ"), which the protocol does not allow.
//   - A repeated "events" array replaces the earlier one, where
//     encoding/json decodes it over the events already decoded.
//
// Each Event.Payload aliases data: it is a slice of the message, not a
// copy (except for a payload that is a JSON string, which is copied), so
// data must not be modified while the frame is in use. The processor
// client receives every message into a buffer of its own, so this holds
// there.
func DecodeFrame(data []byte) (*Frame, error) {
	f := new(Frame)
	if err := DecodeFrameInto(f, data); err != nil {
		return nil, err
	}
	return f, nil
}

// DecodeFrameInto is DecodeFrame decoding into f, whatever f held before,
// reusing the room of f.Events: a receiver that converts each frame's
// events into types of its own decodes every frame into one Frame. On
// error f holds part of the message.
func DecodeFrameInto(f *Frame, data []byte) error {
	return decodeFrame(f, data, false)
}

// DecodeFrameTrusted is DecodeFrameInto for a frame from the daemon, which
// validated every payload before it queued it (PROTOCOL.md, "What a
// processor may rely on"): it reads each payload without validating it
// again, so an invalid payload is not an error here and may reach the
// handler as invalid JSON. In the Encoder's layout a JSON payload is taken
// by its length, raw.len, unread (its bytes are the raw bytes [off,
// off+len)); a length that does not fit what follows is caught by cheap
// checks in most cases, and the payload is then skimmed
// (jsonscan.Decoder.Skim), but a frame whose raw.len lies can decode
// wrong or fail: trust only the daemon's frames so. Everything else of the
// frame is checked as DecodeFrameInto checks it.
func DecodeFrameTrusted(f *Frame, data []byte) error {
	return decodeFrame(f, data, true)
}

func decodeFrame(f *Frame, data []byte, trust bool) error {
	d := frameDecoder{f: f, size: len(data), room: f.Events[:0], trust: trust}
	*f = Frame{}
	d.dec.Reset(data)
	err := d.dec.Object(d.frameField)
	if err == nil {
		err = d.dec.End()
	}
	if err != nil {
		return fmt.Errorf("decode frame: %w", err)
	}
	if f.V != Version {
		return fmt.Errorf("decode frame: unsupported version %d (want %d)", f.V, Version)
	}
	if f.Type != TypeEvents {
		return fmt.Errorf("decode frame: unexpected type %q", f.Type)
	}
	return nil
}

// frameDecoder holds DecodeFrame's state: the JSON decoder, which reads
// the message in one pass, the frame being filled, the event being
// decoded, and the last strings decoded for fields that tend to repeat
// from event to event, so that a frame whose events share a source and a
// raw object allocates those strings once.
type frameDecoder struct {
	dec  jsonscan.Decoder
	size int // of the message
	f    *Frame
	ev   *Event // the event being decoded, f.Events[n]
	n    int
	room []Event // the events slice of the Frame decoded into, reused

	source, rawKey lastString
	// fetchedAt is the same for the events of one response, and
	// eventTime often is (an upstream's times to the second, a batch
	// export's one time): a time written as the last one is not parsed.
	fetchedAt, eventTime lastTime
	// trust reads payloads without validating them (DecodeFrameTrusted).
	trust bool
}

// frameField decodes the value of one member of the frame object. The
// values of unknown members are left to the Decoder, which skips them.
func (d *frameDecoder) frameField(key []byte, plain bool) error {
	f := d.f
	switch string(keyText(key, plain)) {
	case "v":
		return decodeInt(&d.dec, &f.V, "v", nullLeaves)
	case "type":
		val, null, err := scalar(&d.dec, jsonscan.String, "type", nullLeaves)
		if err != nil || null {
			return err
		}
		if string(val) == TypeEvents {
			f.Type = TypeEvents // no need to allocate it
			return nil
		}
		return unquoteTo(&f.Type, val, "type")
	case "frame":
		return decodeInt(&d.dec, &f.ID, "frame", nullLeaves)
	case "delivery":
		return decodeInt(&d.dec, &f.Delivery, "delivery", nullLeaves)
	case "raw_store":
		return decodeString(&d.dec, &f.RawStore, "raw_store", nullLeaves)
	case "member":
		return decodeString(&d.dec, &f.Member, "member", nullLeaves)
	case "events":
		switch kind := d.dec.Peek(); kind {
		case jsonscan.Null:
			f.Events = nil
		case jsonscan.Array:
			if f.Events == nil {
				f.Events = d.room
			}
			f.Events = f.Events[:0]
			if err := d.dec.Array(d.event); err != nil {
				return err
			}
			if f.Events == nil {
				f.Events = []Event{}
			}
		default:
			return typeError("events", "an array", kind)
		}
	}
	return nil
}

// maxEventsHint bounds the number of events DecodeFrame makes room for
// from its estimate: the daemon's largest events_per_frame.
const maxEventsHint = 10000

// event decodes one element of the events array.
func (d *frameDecoder) event() error {
	start := d.dec.Offset()
	d.f.Events = append(d.f.Events, Event{})
	d.n = len(d.f.Events) - 1
	d.ev = &d.f.Events[d.n]
	switch kind := d.dec.Peek(); kind {
	case jsonscan.Null:
		return nil
	case jsonscan.Object:
		laidOut, err := d.eventLaidOut()
		if err != nil {
			return err
		}
		if !laidOut {
			*d.ev = Event{}
			if err := d.dec.ObjectNames(eventNames, d.eventField); err != nil {
				return err
			}
		}
	default:
		return typeError(fmt.Sprintf("events[%d]", d.n), "an object", kind)
	}
	if d.n == 0 {
		// Make room for as many more events as the rest of the message
		// holds if they are the size of the first, as they tend to be,
		// rather than growing the slice one doubling at a time. The
		// first is at least 2 bytes long: "{}".
		n := (d.size - d.dec.Offset()) / (d.dec.Offset() - start)
		d.f.Events = slices.Grow(d.f.Events, min(n+n/8, maxEventsHint))
	}
	return nil
}

// eventNames are the members of an event, in the order the Encoder writes
// them, for jsonscan.Decoder.ObjectNames; the event* constants index it.
var eventNames = []string{"key", "source", "seq", "fetched_at", "event_time", "traceparent", "tracestate", "raw", "payload", "payload_b64"}

const (
	eventKey = iota
	eventSource
	eventSeq
	eventFetchedAt
	eventEventTime
	eventTraceparent
	eventTracestate
	eventRaw
	eventPayload
	eventPayloadB64
)

// eventField decodes the value of one member of an event object: the
// member eventNames[name], or the one named key when name is -1.
func (d *frameDecoder) eventField(name int, key []byte, plain bool) error {
	if name < 0 {
		name = nameIndex(eventNames, key, plain)
	}
	ev := d.ev
	var err error
	switch name {
	case eventKey:
		err = decodeString(&d.dec, &ev.Key, "key", nullLeaves)
	case eventSource:
		err = d.source.decode(&d.dec, &ev.Source, "source", nullLeaves)
	case eventSeq:
		err = decodeInt(&d.dec, &ev.Seq, "seq", nullLeaves)
	case eventFetchedAt:
		err = d.fetchedAt.decode(&d.dec, &ev.FetchedAt, "fetched_at", nullLeaves)
	case eventEventTime:
		err = d.eventTime.decode(&d.dec, &ev.EventTime, "event_time", nullLeaves)
	case eventTraceparent:
		err = decodeString(&d.dec, &ev.Traceparent, "traceparent", nullLeaves)
	case eventTracestate:
		err = decodeString(&d.dec, &ev.Tracestate, "tracestate", nullLeaves)
	case eventRaw:
		switch kind := d.dec.Peek(); kind {
		case jsonscan.Null:
		case jsonscan.Object:
			err = d.dec.ObjectNames(rawNames, d.rawField)
		default:
			err = typeError("raw", "an object", kind)
		}
	case eventPayload:
		var val []byte
		var kind jsonscan.Kind
		if d.trust {
			val, kind, err = d.dec.Skim()
		} else {
			val, kind, err = d.dec.Value()
		}
		if err != nil {
			return err
		}
		if kind == jsonscan.String {
			// val lacks the quotes; the payload is the string with them.
			p := make([]byte, 0, len(val)+2)
			val = append(append(append(p, '"'), val...), '"')
		}
		ev.Payload = val
	case eventPayloadB64:
		err = decodeBase64(&d.dec, &ev.PayloadBase64, "payload_b64")
	}
	if err != nil {
		return within(err, fmt.Sprintf("events[%d]", d.n))
	}
	return nil
}

// eventLayout is how the Encoder lays out an event up to its payload:
// the text before each member's value, and the member, of the event or
// (raw) of its raw object. Optional members may be absent.
var eventLayout = [...]struct {
	lit      jsonscan.Lit
	name     int
	raw      bool
	optional bool
}{
	{jsonscan.NewLit(`{"key":`), eventKey, false, false},
	{jsonscan.NewLit(`,"source":`), eventSource, false, false},
	{jsonscan.NewLit(`,"seq":`), eventSeq, false, false},
	{jsonscan.NewLit(`,"fetched_at":`), eventFetchedAt, false, false},
	{jsonscan.NewLit(`,"event_time":`), eventEventTime, false, true},
	{jsonscan.NewLit(`,"traceparent":`), eventTraceparent, false, true},
	{jsonscan.NewLit(`,"tracestate":`), eventTracestate, false, true},
	{jsonscan.NewLit(`,"raw":{"key":`), rawKey, true, false},
	{jsonscan.NewLit(`,"off":`), rawOff, true, false},
	{jsonscan.NewLit(`,"len":`), rawLen, true, false},
}

// The text after an event's raw object: the payload's key, or the end.
var (
	litPayload    = jsonscan.NewLit(`},"payload":`)
	litPayloadB64 = jsonscan.NewLit(`},"payload_b64":`)
	litClose      = jsonscan.NewLit(`}`)
)

// eventLaidOut decodes the event object at the Decoder when it is laid out
// as the Encoder lays events out, reading the punctuation and keys between
// the values in one comparison each, and reports whether it was. When it
// is not, it reads nothing (what it decoded into the event stays there),
// and the event must be decoded with eventField. A value fails as it does
// in eventField.
func (d *frameDecoder) eventLaidOut() (bool, error) {
	m := d.dec.Mark()
	for k := range eventLayout {
		s := &eventLayout[k]
		if !d.dec.Expect(s.lit) {
			if s.optional {
				continue
			}
			d.dec.Rewind(m)
			return false, nil
		}
		var err error
		if s.raw {
			if err = d.rawField(s.name, nil, true); err != nil {
				err = within(err, fmt.Sprintf("events[%d]", d.n))
			}
		} else {
			err = d.eventField(s.name, nil, true)
		}
		if err != nil {
			return true, err
		}
	}
	// The raw object closes, then the payload, if any, and the event.
	var err error
	switch {
	case d.dec.Expect(litPayload):
		if val, ok := d.takePayload(); ok {
			d.ev.Payload = val
			break
		}
		err = d.eventField(eventPayload, nil, true)
	case d.dec.Expect(litPayloadB64):
		err = d.eventField(eventPayloadB64, nil, true)
	case d.dec.Expect(litClose):
	default:
		d.dec.Rewind(m)
		return false, nil
	}
	if err != nil {
		return true, err
	}
	if !d.dec.Expect(litClose) {
		d.dec.Rewind(m)
		return false, nil
	}
	return true, nil
}

// rawNames are the members of an event's raw object, in the order the
// Encoder writes them; the raw* constants index it.
var rawNames = []string{"key", "off", "len"}

const (
	rawKey = iota
	rawOff
	rawLen
)

// rawField decodes the value of one member of an event's raw object: the
// member rawNames[name], or the one named key when name is -1.
func (d *frameDecoder) rawField(name int, key []byte, plain bool) error {
	if name < 0 {
		name = nameIndex(rawNames, key, plain)
	}
	raw := &d.ev.Raw
	var err error
	switch name {
	case rawKey:
		err = d.rawKey.decode(&d.dec, &raw.Key, "key", nullLeaves)
	case rawOff:
		err = decodeInt(&d.dec, &raw.Off, "off", nullLeaves)
	case rawLen:
		err = decodeInt(&d.dec, &raw.Len, "len", nullLeaves)
	}
	if err != nil {
		return within(err, "raw")
	}
	return nil
}

// nameIndex returns the index in names of the object key key, as the
// Decoder hands it, or -1.
func nameIndex(names []string, key []byte, plain bool) int {
	text := keyText(key, plain)
	for i, n := range names {
		if string(text) == n {
			return i
		}
	}
	return -1
}

// keyText returns the text of an object key from the Decoder. Keys are
// compared in a switch on string(keyText(...)), which does not allocate.
func keyText(key []byte, plain bool) []byte {
	if plain {
		return key
	}
	// The Decoder validated the key, so Unquote cannot fail; were it to,
	// nil would match no field name.
	s, err := jsonscan.Unquote(key)
	if err != nil {
		return nil
	}
	return []byte(s)
}

// fieldError is a field that is of the wrong JSON type or does not decode.
// Its Field is a path in the frame, built up as the error is returned
// through the levels: "frame", "events[3].seq", "events[3].raw.off".
type fieldError struct {
	Field string
	Msg   string
}

func (e *fieldError) Error() string { return "field " + e.Field + ": " + e.Msg }

// within prefixes the path of a *fieldError with the path of the object
// the field is in, and returns any error.
func within(err error, path string) error {
	if fe, ok := err.(*fieldError); ok {
		fe.Field = path + "." + fe.Field
	}
	return err
}

// typeError reports a value of kind where want was expected.
func typeError(field, want string, kind jsonscan.Kind) error {
	return &fieldError{Field: field, Msg: "want " + want + ", found " + kindName(kind)}
}

func kindName(k jsonscan.Kind) string {
	switch k {
	case jsonscan.Object, jsonscan.Array:
		return "an " + k.String()
	case jsonscan.Null:
		return "null"
	}
	return "a " + k.String()
}

// nulls says what a null value does to a field: in a frame it leaves the
// field as it is, as encoding/json does; in an ack it is an error.
type nulls bool

const (
	nullLeaves nulls = true
	nullFails  nulls = false
)

// scalar reads the next value, which must be of kind want, or null. It
// returns the value's raw bytes (for a string, without the quotes), or
// reports null, which is an error with nullFails; any other kind is a type
// error.
func scalar(dec *jsonscan.Decoder, want jsonscan.Kind, field string, n nulls) (val []byte, null bool, err error) {
	val, kind, err := dec.Value()
	switch {
	case err != nil:
		return nil, false, err
	case kind == want:
		return val, false, nil
	case kind == jsonscan.Null && n == nullLeaves:
		return nil, true, nil
	}
	what := "a string"
	if want == jsonscan.Number {
		what = "an integer"
	}
	return nil, false, typeError(field, what, kind)
}

// integer is the field types decodeInt fills.
type integer interface{ ~int | ~int64 }

// decodeInt reads a JSON integer into *dst. A number with a fraction or
// exponent, or out of the range of T, is an error, as it is for
// encoding/json.
func decodeInt[T integer](dec *jsonscan.Decoder, dst *T, field string, n nulls) error {
	val, null, err := scalar(dec, jsonscan.Number, field, n)
	if err != nil || null {
		return err
	}
	i, ok := parseInt(val)
	if !ok || int64(T(i)) != i {
		return &fieldError{Field: field, Msg: "number " + string(val) + " is not an integer in range"}
	}
	*dst = T(i)
	return nil
}

// parseInt parses a valid JSON number as an int64 and reports whether it
// is an integer that fits.
func parseInt(b []byte) (int64, bool) {
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	// A valid JSON integer has no leading zeros, so 19 digits are all an
	// int64 can need, and 19 digits cannot overflow a uint64.
	if len(b) > 19 {
		return 0, false
	}
	var u uint64
	for _, c := range b {
		if c-'0' > 9 {
			return 0, false // a fraction or an exponent
		}
		u = u*10 + uint64(c-'0')
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true // -(1<<63) wraps to itself, as it should
	}
	if u > 1<<63-1 {
		return 0, false
	}
	return int64(u), true
}

// decodeTime reads a JSON string into *dst. It parses the raw text,
// escapes included, as time.Time.UnmarshalJSON does.
func decodeTime(dec *jsonscan.Decoder, dst *time.Time, field string, n nulls) error {
	val, null, err := scalar(dec, jsonscan.String, field, n)
	if err != nil || null {
		return err
	}
	return parseTime(dst, val, field)
}

// parseTime parses the raw text of a string value into *dst.
func parseTime(dst *time.Time, val []byte, field string) error {
	var t time.Time
	if err := t.UnmarshalText(val); err != nil {
		return &fieldError{Field: field, Msg: err.Error()}
	}
	*dst = t
	return nil
}

// decodeString reads a JSON string into *dst.
func decodeString(dec *jsonscan.Decoder, dst *string, field string, n nulls) error {
	val, null, err := scalar(dec, jsonscan.String, field, n)
	if err != nil || null {
		return err
	}
	return unquoteTo(dst, val, field)
}

// unquoteTo decodes the raw bytes of a string value into *dst.
func unquoteTo(dst *string, val []byte, field string) error {
	s, err := jsonscan.Unquote(val)
	if err != nil {
		return &fieldError{Field: field, Msg: err.Error()}
	}
	*dst = s
	return nil
}

// lastString remembers the last string a field decoded to, with its raw
// bytes, to hand the same string out again when the next value is written
// the same. Its zero value knows the empty string.
type lastString struct {
	raw []byte
	s   string
}

// decode is decodeString, reusing the last string when the value is
// written the same.
func (l *lastString) decode(dec *jsonscan.Decoder, dst *string, field string, n nulls) error {
	val, null, err := scalar(dec, jsonscan.String, field, n)
	if err != nil || null {
		return err
	}
	if bytes.Equal(val, l.raw) {
		*dst = l.s
		return nil
	}
	if err := unquoteTo(dst, val, field); err != nil {
		return err
	}
	l.raw, l.s = val, *dst
	return nil
}

// lastTime remembers the last time a field decoded to, with its raw bytes,
// to hand the same time out again when the next value is written the same,
// as the fetched_at of the events of one upstream response are.
type lastTime struct {
	raw []byte
	t   time.Time
	ok  bool
}

// decode is decodeTime, reusing the last time when the value is written
// the same.
func (l *lastTime) decode(dec *jsonscan.Decoder, dst *time.Time, field string, n nulls) error {
	val, null, err := scalar(dec, jsonscan.String, field, n)
	if err != nil || null {
		return err
	}
	if l.ok && bytes.Equal(val, l.raw) {
		*dst = l.t
		return nil
	}
	if err := parseTime(dst, val, field); err != nil {
		return err
	}
	l.raw, l.t, l.ok = val, *dst, true
	return nil
}

// decodeBase64 reads a JSON string as standard base64 into *dst, as
// encoding/json decodes a []byte: escapes resolved first, newlines
// ignored, padding required; null sets *dst to nil.
func decodeBase64(dec *jsonscan.Decoder, dst *[]byte, field string) error {
	val, null, err := scalar(dec, jsonscan.String, field, nullLeaves)
	if err != nil {
		return err
	}
	if null {
		*dst = nil
		return nil
	}
	src := val
	if bytes.IndexByte(val, '\\') >= 0 {
		s, err := jsonscan.Unquote(val)
		if err != nil {
			return &fieldError{Field: field, Msg: err.Error()}
		}
		src = []byte(s)
	}
	b := make([]byte, base64.StdEncoding.DecodedLen(len(src)))
	n, err := base64.StdEncoding.Decode(b, src)
	if err != nil {
		return &fieldError{Field: field, Msg: err.Error()}
	}
	*dst = b[:n]
	return nil
}

// takePayload reads, in a trusted frame, a JSON payload by its length: it
// is the raw bytes [off, off+len) (PROTOCOL.md), so raw.len, read before it
// in the Encoder's layout, says where it ends, and nothing of it needs
// reading. false, reading nothing, when the frame is not trusted or the
// length does not fit; a wrong length fails the event's layout after it,
// and the event is read again member by member.
func (d *frameDecoder) takePayload() ([]byte, bool) {
	if !d.trust {
		return nil, false
	}
	m := d.dec.Mark()
	val, ok := d.dec.Take(d.ev.Raw.Len)
	if !ok || !plausibleEnds(val) || !d.dec.ExpectAhead(eventEnd, eventsEnd) {
		d.dec.Rewind(m)
		return nil, false
	}
	return val, true
}

// eventEnd and eventsEnd are what follows an event's payload in the
// Encoder's layout: the next event, or the end of the events.
var eventEnd, eventsEnd = []byte(`},{`), []byte(`}]`)

// plausibleEnds reports whether val starts and ends as a JSON value can: a
// cheap check that a payload taken by its length was not cut short or run
// on (the layout after it is checked too).
func plausibleEnds(val []byte) bool {
	switch val[0] {
	case '{':
		return val[len(val)-1] == '}'
	case '[':
		return val[len(val)-1] == ']'
	case '"':
		// The closing quote must not be escaped: an even run of
		// backslashes before it.
		n := 0
		for i := len(val) - 2; i > 0 && val[i] == '\\'; i-- {
			n++
		}
		return len(val) > 1 && val[len(val)-1] == '"' && n%2 == 0
	case 't', 'n':
		return val[len(val)-1] == 'e' || val[len(val)-1] == 'l'
	case 'f':
		return val[len(val)-1] == 'e'
	default:
		c := val[len(val)-1]
		return (val[0] == '-' || val[0] >= '0' && val[0] <= '9') && c >= '0' && c <= '9'
	}
}
