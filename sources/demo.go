package sources

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// DemoSpec configures kind "demo": a synthetic generator that needs no
// network, so the daemon does real work offline out of the box.
type DemoSpec struct {
	// EventsPerTick is how many events one fetch produces.
	EventsPerTick int `toml:"events_per_tick"`
	// EventSize is the approximate size of one event in bytes.
	EventSize int `toml:"event_size"`
	// MalformedEvery makes every Nth fetch return a malformed payload, to
	// exercise the dead-letter path; 0 never does.
	MalformedEvery int `toml:"malformed_every"`
}

// maxDemoBatch caps the bytes one demo fetch generates.
const maxDemoBatch = 256 << 20

func newDemoSpec() *DemoSpec {
	return &DemoSpec{EventsPerTick: 100, EventSize: 256}
}

// Validate implements Spec.
func (s *DemoSpec) Validate() []FieldError {
	var errs []FieldError
	if s.EventsPerTick < 1 || s.EventsPerTick > 1_000_000 {
		errs = append(errs, FieldError{"events_per_tick", "must be between 1 and 1000000"})
	}
	if s.EventSize < 64 || s.EventSize > 1<<20 {
		errs = append(errs, FieldError{"event_size", "must be between 64 and 1048576"})
	}
	if s.EventsPerTick > 0 && s.EventSize > 0 && int64(s.EventsPerTick)*int64(s.EventSize) > maxDemoBatch {
		errs = append(errs, FieldError{"event_size", "events_per_tick * event_size must be at most 256 MiB per fetch"})
	}
	if s.MalformedEvery < 0 {
		errs = append(errs, FieldError{"malformed_every", "must not be negative"})
	}
	return errs
}

// Open implements Spec.
func (s *DemoSpec) Open(env Env) (Source, error) {
	if errs := s.Validate(); len(errs) > 0 {
		return nil, specErrors(env.Name, "demo", errs)
	}
	return &demoSource{
		spec:     *s,
		name:     env.Name,
		idPrefix: append(appendJSONStringBody(nil, env.Name), '-'),
	}, nil
}

// demoSource generates events. Event seq (1, 2, ...) is always
//
//	{"id":"NAME-SEQ","seq":SEQ,"ts":"RFC3339Nano","msg":"filler"}
//
// with its id a function of the name and seq only, so a restart from a
// durable cursor produces the same ids for the same events.
type demoSource struct {
	spec DemoSpec
	name string
	// idPrefix is the name, escaped for a JSON string, and "-".
	idPrefix []byte
	// fetches counts Fetch calls, for MalformedEvery.
	fetches int
}

// demoFiller pads events to EventSize.
const demoFiller = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt. "

// Fetch implements Source: it returns the EventsPerTick events after
// cursor, the decimal seq of the last event produced ("" before the first).
func (d *demoSource) Fetch(ctx context.Context, cursor string) (*Batch, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var last uint64
	if cursor != "" {
		var err error
		if last, err = strconv.ParseUint(cursor, 10, 64); err != nil {
			return nil, fmt.Errorf("source %q: demo: cursor %q is not a sequence number", d.name, cursor)
		}
	}
	n := uint64(d.spec.EventsPerTick)
	if last > ^uint64(0)-n {
		return nil, fmt.Errorf("source %q: demo: cursor %q is too large", d.name, cursor)
	}
	d.fetches++
	now := time.Now().UTC()
	if d.spec.MalformedEvery > 0 && d.fetches%d.spec.MalformedEvery == 0 {
		return nil, d.malformed(last, now)
	}

	ts := now.AppendFormat(make([]byte, 0, len(time.RFC3339Nano)), time.RFC3339Nano)
	body := make([]byte, 0, min(n*uint64(d.spec.EventSize+1)+2, maxDemoBatch))
	body = append(body, '[')
	recs := make([]Record, n)
	var key []byte
	for k := range recs {
		if k&4095 == 4095 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		seq := last + 1 + uint64(k)
		if k > 0 {
			body = append(body, ',')
		}
		off := len(body)
		body = append(body, `{"id":"`...)
		body = append(body, d.idPrefix...)
		digits := len(body)
		body = strconv.AppendUint(body, seq, 10)
		seqText := body[digits:]
		body = append(body, `","seq":`...)
		body = append(body, seqText...)
		body = append(body, `,"ts":"`...)
		body = append(body, ts...)
		body = append(body, `","msg":"`...)
		for fill := d.spec.EventSize - (len(body) - off) - len(`"}`); fill > 0; {
			chunk := min(fill, len(demoFiller))
			body = append(body, demoFiller[:chunk]...)
			fill -= chunk
		}
		body = append(body, `"}`...)

		key = append(append(append(key[:0], d.name...), '-'), body[digits:digits+len(seqText)]...)
		id := string(key)
		recs[k] = Record{
			Key:    id,
			Cursor: id[len(d.name)+1:],
			Time:   now,
			Off:    off,
			Len:    len(body) - off,
		}
	}
	body = append(body, ']')
	return &Batch{Body: body, FetchedAt: now, Records: recs, Cursor: recs[n-1].Cursor}, nil
}

// malformed returns the injected bad payload: the start of the next event,
// cut off.
func (d *demoSource) malformed(last uint64, now time.Time) error {
	body := append([]byte(`[{"id":"`), d.idPrefix...)
	body = strconv.AppendUint(body, last+1, 10)
	body = append(body, `","oops": `...)
	reason := "injected malformed payload"
	if _, err := jsonscan.SplitArray(body); err != nil {
		reason += ": " + err.Error()
	}
	return &MalformedError{Body: body, FetchedAt: now, Reason: reason}
}

// Close implements Source.
func (d *demoSource) Close() error { return nil }

// specErrors reports every problem Validate found, for an Open called
// without the config package's validation.
func specErrors(name, kind string, errs []FieldError) error {
	all := make([]error, len(errs))
	for i, e := range errs {
		all[i] = fmt.Errorf("source %q: %s: %w", name, kind, e)
	}
	return errors.Join(all...)
}

// appendJSONStringBody appends s escaped for use between the quotes of a JSON
// string.
func appendJSONStringBody(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}
