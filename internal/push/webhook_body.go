package push

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// bodyRules say which fields of a webhook event matter. A body is one JSON
// object (one event) or a JSON array of objects (a batch, one event per
// element); anything else is refused.
type bodyRules struct {
	// idField and timeField are dotted paths in an event; "" means none.
	idField, timeField string
	// required are dotted paths every event must have, not null.
	required []string
}

// bodyEvent is one event found in a body.
type bodyEvent struct {
	// Off and Len locate the event's bytes in the body.
	Off, Len int
	// ID is the text of the event's idField (a string or a number), or "".
	ID string
	// Time is the event's timeField as an RFC 3339 time, or zero.
	Time time.Time
}

// decode validates body and finds its events. batch reports a JSON array.
// An error says what is wrong, in words for the sender. JSON text is UTF-8
// (RFC 8259): a body with other bytes, inside a string too, is refused, as
// ws_ingress refuses such an envelope, so every event that reaches
// processors is valid UTF-8 JSON.
func (r *bodyRules) decode(body []byte) (events []bodyEvent, batch bool, err error) {
	if !utf8.Valid(body) {
		return nil, false, fmt.Errorf("invalid JSON: the body is not valid UTF-8 (byte %d)", invalidUTF8At(body))
	}
	var d jsonscan.Decoder
	d.Reset(body)
	switch d.Peek() {
	case jsonscan.Object:
		off := d.Offset()
		if _, _, err := d.Value(); err != nil {
			return nil, false, fmt.Errorf("invalid JSON: %w", err)
		}
		end := d.Offset()
		if err := d.End(); err != nil {
			return nil, false, fmt.Errorf("invalid JSON: %w", err)
		}
		e, err := r.event(body, off, end-off)
		if err != nil {
			return nil, false, err
		}
		return []bodyEvent{e}, false, nil
	case jsonscan.Array:
		spans, err := jsonscan.SplitArray(body)
		if err != nil {
			return nil, true, fmt.Errorf("invalid JSON: %w", err)
		}
		if len(spans) == 0 {
			return nil, true, errors.New("the array holds no events")
		}
		events = make([]bodyEvent, 0, len(spans))
		for i, s := range spans {
			if body[s.Off] != '{' {
				return nil, true, fmt.Errorf("event %d is not a JSON object", i)
			}
			e, err := r.event(body, s.Off, s.Len)
			if err != nil {
				return nil, true, fmt.Errorf("event %d: %w", i, err)
			}
			events = append(events, e)
		}
		return events, true, nil
	default:
		kind := d.Peek()
		if _, _, err := d.Value(); err != nil {
			if kind == jsonscan.Invalid && d.Offset() >= len(body) {
				return nil, false, errors.New("empty body, want a JSON object or an array of objects")
			}
			return nil, false, fmt.Errorf("invalid JSON: %w", err)
		}
		return nil, false, fmt.Errorf("the body is a JSON %s, want an object or an array of objects", kind)
	}
}

// event reads the fields of the validated object body[off:off+n].
func (r *bodyRules) event(body []byte, off, n int) (bodyEvent, error) {
	obj := body[off : off+n]
	e := bodyEvent{Off: off, Len: n}
	for _, f := range r.required {
		if _, kind, ok := jsonscan.Field(obj, f); !ok || kind == jsonscan.Null {
			return e, fmt.Errorf("the required field %q is missing", f)
		}
	}
	if r.idField != "" {
		if val, kind, ok := jsonscan.Field(obj, r.idField); ok {
			e.ID = jsonscan.ScalarText(val, kind)
		}
	}
	if r.timeField != "" {
		if val, kind, ok := jsonscan.Field(obj, r.timeField); ok {
			e.Time = jsonscan.Time(val, kind)
		}
	}
	return e, nil
}

// invalidUTF8At returns the offset of the first byte of b that is not part
// of a valid UTF-8 sequence, or len(b).
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}
