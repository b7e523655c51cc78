package sources

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// sseLineSlack is how many bytes a line may have beyond max_event_bytes
// before it is cut: room for the field name, so that a data line whose
// value fits is never cut.
const sseLineSlack = 16

// sseBOM is the byte order mark a stream may start with; it is skipped.
var sseBOM = []byte{0xEF, 0xBB, 0xBF}

// sseEvent is what one dispatch of a stream yields: an event, or only a
// new last event ID (a block with an id line and no data).
type sseEvent struct {
	// event reports a dispatched event; when false only lastID moved.
	event bool
	// typ is the event type, "message" unless an event line said
	// otherwise.
	typ string
	// data is the data lines of the event joined with "\n"; for an event
	// larger than max_event_bytes, its first max_event_bytes bytes.
	data []byte
	// id is the value of the block's own id line, and hasID reports that
	// it had one (an event without one carries the last event ID over,
	// which is in lastID only).
	id    string
	hasID bool
	// lastID is the stream's last event ID once the block is dispatched.
	lastID string
	// tooBig reports that the event, or one of its lines, was larger than
	// max_event_bytes: data holds its first bytes only.
	tooBig bool
}

// sseScanner reads a text/event-stream incrementally, as the WHATWG HTML
// standard's "Server-sent events" section parses (§9.2.5) and interprets
// (§9.2.6) it: lines end in CRLF, LF or CR; a leading BOM is skipped; a
// line starting with ":" is a comment; "field: value" loses one space
// after the colon, a line without a colon is a field with an empty value;
// data lines are joined with "\n"; an empty line dispatches the event,
// unless its data is empty; event sets the type (default "message"); id
// sets the last event ID unless its value holds a NUL; retry with only
// ASCII digits sets the reconnection time; other fields are ignored; an
// event cut off by the end of the stream is discarded.
//
// It reads bytes, not text: the standard's UTF-8 decoding is not applied,
// so the data reaches the raw store byte for byte as sent.
//
// Memory is bounded by max (max_event_bytes): a line is kept up to max
// plus sseLineSlack bytes and the data up to max bytes; a longer line or
// data makes the event tooBig, its first bytes kept and the rest read and
// dropped. Comments and unknown fields are dropped whatever their length.
type sseScanner struct {
	r   *bufio.Reader
	max int
	// started reports that a leading BOM has been looked for; skipLF that
	// the last line ended in CR, so that an LF right after it is the rest
	// of a CRLF.
	started, skipLF bool
	// line is the line being read, without its end.
	line []byte

	// data, typ and lastID are the standard's data buffer, event type
	// buffer and last event ID buffer.
	data   []byte
	typ    string
	lastID string
	// reported is the last event ID the latest dispatch returned, so that
	// a block that moves nothing is not reported.
	reported string
	// blockID and hasID are the value of the id line of the block being
	// read, if it had one; tooBig reports that it has outgrown max.
	blockID       string
	hasID, tooBig bool
	// retry is the reconnection time of the last valid retry field, if
	// hasRetry.
	retry    time.Duration
	hasRetry bool
}

// newSSEScanner returns a scanner of r for events of at most maxEvent
// bytes. lastID is the last event ID the connection resumed from: like a
// browser's EventSource, the stream starts with it, so that an event
// without an id line keeps it.
func newSSEScanner(r io.Reader, maxEvent int, lastID string) *sseScanner {
	return &sseScanner{r: bufio.NewReaderSize(r, 64<<10), max: maxEvent, lastID: lastID, reported: lastID}
}

// next returns the next dispatch: an event, or a block that moved the last
// event ID. At the end of the stream it returns io.EOF (or the read
// error), discarding an event not yet dispatched.
func (s *sseScanner) next() (sseEvent, error) {
	if !s.started {
		if err := s.skipBOM(); err != nil {
			return sseEvent{}, err
		}
		s.started = true
	}
	for {
		cut, err := s.readLine()
		if err != nil {
			return sseEvent{}, err
		}
		if len(s.line) == 0 { // a cut line is never empty
			if ev, ok := s.dispatch(); ok {
				return ev, nil
			}
			continue
		}
		s.field(cut)
	}
}

// reconnection returns the reconnection time the stream set, if any.
func (s *sseScanner) reconnection() (time.Duration, bool) { return s.retry, s.hasRetry }

// skipBOM skips a leading byte order mark, reading no further than the
// bytes that could still be one.
func (s *sseScanner) skipBOM() error {
	for i := 1; i <= len(sseBOM); i++ {
		b, err := s.r.Peek(i)
		if len(b) < i {
			return err
		}
		if !bytes.Equal(b, sseBOM[:i]) {
			return nil
		}
	}
	_, err := s.r.Discard(len(sseBOM))
	return err
}

// readLine reads the next line into s.line, without its end: at most
// max+sseLineSlack bytes of it, the rest read and dropped (cut reports
// it). It returns the read error, io.EOF at the end of the stream, even
// after a partial line, which the standard discards.
func (s *sseScanner) readLine() (cut bool, err error) {
	s.line = s.line[:0]
	limit := s.max + sseLineSlack
	for {
		buf, err := s.r.Peek(max(s.r.Buffered(), 1))
		if len(buf) == 0 {
			return cut, err
		}
		if s.skipLF {
			s.skipLF = false
			if buf[0] == '\n' {
				if _, err := s.r.Discard(1); err != nil {
					return cut, err
				}
				continue
			}
		}
		i := bytes.IndexAny(buf, "\r\n")
		end := i
		if i < 0 {
			end = len(buf)
		}
		keep := min(end, limit-len(s.line))
		s.line = append(s.line, buf[:keep]...)
		cut = cut || keep < end
		if i < 0 {
			if _, err := s.r.Discard(len(buf)); err != nil {
				return cut, err
			}
			continue
		}
		s.skipLF = buf[i] == '\r'
		_, err = s.r.Discard(i + 1)
		return cut, err
	}
}

// field processes the line in s.line, cut or not.
func (s *sseScanner) field(cut bool) {
	name, value, colon := bytes.Cut(s.line, []byte{':'})
	switch {
	case colon && len(name) == 0:
		return // a comment
	case !colon:
		value = nil
	case len(value) > 0 && value[0] == ' ':
		value = value[1:]
	}
	switch string(name) {
	case "data":
		// The buffer holds each line and an LF; the event's data is
		// the buffer less its last LF, at most s.max bytes.
		if room := s.max - len(s.data); cut || len(value) > room {
			s.tooBig = true
			s.data = append(s.data, value[:min(len(value), max(room, 0))]...)
			return
		}
		s.data = append(append(s.data, value...), '\n')
	case "event":
		s.typ = string(value)
		s.tooBig = s.tooBig || cut
	case "id":
		if cut {
			s.tooBig = true // its value is unknown: the id is left as it was
		} else if bytes.IndexByte(value, 0) < 0 {
			s.lastID = string(value)
			s.blockID, s.hasID = s.lastID, true
		}
	case "retry":
		if !cut && isDigits(string(value)) {
			s.retry, s.hasRetry = retryMillis(value), true
		}
	}
}

// retryMillis returns the duration of digits milliseconds, saturated.
func retryMillis(digits []byte) time.Duration {
	ms, err := strconv.ParseInt(string(digits), 10, 64)
	if err != nil || ms > math.MaxInt64/int64(time.Millisecond) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ms) * time.Millisecond
}

// dispatch ends the block at an empty line: it returns the event, or the
// last event ID when only that moved, and false when there is nothing to
// report.
func (s *sseScanner) dispatch() (sseEvent, bool) {
	ev := sseEvent{typ: s.typ, id: s.blockID, hasID: s.hasID, lastID: s.lastID, tooBig: s.tooBig}
	s.typ, s.blockID, s.hasID, s.tooBig = "", "", false, false
	if len(s.data) == 0 {
		if s.lastID == s.reported {
			return sseEvent{}, false
		}
		s.reported = s.lastID
		return sseEvent{lastID: s.lastID}, true
	}
	s.reported = s.lastID
	data := s.data
	if !ev.tooBig || data[len(data)-1] == '\n' {
		data = data[:len(data)-1]
	}
	ev.event, ev.data = true, bytes.Clone(data)
	if ev.typ == "" {
		ev.typ = "message"
	}
	s.data = s.data[:0]
	return ev, true
}

// sseParser finds the records in an event's data.
type sseParser struct {
	// idField is id_field; types holds event_types (nil: every type).
	idField string
	types   map[string]bool
	// ws reads the data as websocket reads a message: records_path and
	// time_field.
	ws wsParser
}

// wanted reports whether events of type typ hold records.
func (p sseParser) wanted(typ string) bool { return p.types == nil || p.types[typ] }

// records validates data, one JSON value, and appends its records to dst,
// with Off relative to data. A record's key is its id_field when set and
// present; else the event's own id (id, when hasID and not empty),
// followed by "#" and the record's index when the event holds several;
// else the SHA-256 of the record's bytes. Its Cursor is the event's own
// id.
func (p sseParser) records(dst []Record, data []byte, id string, hasID bool) ([]Record, error) {
	start := len(dst)
	// ws has no idField: it keys every record on its SHA-256, which the
	// loop below replaces where an id applies.
	dst, err := p.ws.records(dst, data)
	if err != nil {
		return dst[:start], err
	}
	for i := start; i < len(dst); i++ {
		r := &dst[i]
		if key := scalarField(data[r.Off:r.Off+r.Len], p.idField); key != "" {
			r.Key = key
		} else if id != "" {
			r.Key = id
			if len(dst)-start > 1 {
				r.Key += "#" + strconv.Itoa(i-start)
			}
		}
		if hasID {
			r.Cursor = id
		}
	}
	return dst, nil
}

// sseEnvelope builds the envelope of an event in a batch Body,
// {"id":"…","event":"…","data":<data>} (no id when the block had no id
// line), and returns where data starts in it.
func sseEnvelope(ev sseEvent) ([]byte, int) {
	env := make([]byte, 0, len(ev.data)+len(ev.id)+len(ev.typ)+32)
	env = append(env, '{')
	if ev.hasID {
		env = append(env, `"id":"`...)
		env = append(appendJSONStringBody(env, ev.id), `",`...)
	}
	env = append(env, `"event":"`...)
	env = append(appendJSONStringBody(env, ev.typ), `","data":`...)
	off := len(env)
	env = append(env, ev.data...)
	return append(env, '}'), off
}

// readEnvelope reads an envelope back: the event's type, own id and data,
// and where the data starts in env.
func readEnvelope(env []byte) (sseEvent, int, error) {
	val, kind, ok := jsonscan.Field(env, "data")
	if !ok {
		return sseEvent{}, 0, errors.New(`not an event envelope: no "data"`)
	}
	// val aliases env, so the capacities tell where it starts; a string's
	// val is what is between its quotes.
	off := cap(env) - cap(val)
	if kind == jsonscan.String {
		off--
		val = env[off : off+len(val)+2]
	}
	ev := sseEvent{event: true, typ: "message", data: val}
	for _, f := range []struct {
		name string
		dst  *string
		has  *bool
	}{{"event", &ev.typ, nil}, {"id", &ev.id, &ev.hasID}} {
		raw, kind, ok := jsonscan.Field(env, f.name)
		if !ok {
			continue
		}
		if kind != jsonscan.String {
			return sseEvent{}, 0, fmt.Errorf("envelope %q is a %s, want a string", f.name, kind)
		}
		s, err := jsonscan.Unquote(raw)
		if err != nil {
			return sseEvent{}, 0, err
		}
		*f.dst = s
		if f.has != nil {
			*f.has = true
		}
	}
	return ev, off, nil
}

// Parse implements Parser: body is a batch Body, a JSON array of event
// envelopes (see sseEnvelope). Events of a type not in event_types hold no
// records.
func (w *sseSource) Parse(body []byte, fetchedAt time.Time) (*Batch, error) {
	spans, err := jsonscan.SplitArray(body)
	if err != nil {
		return nil, &MalformedError{Body: body, FetchedAt: fetchedAt, Reason: "not a JSON array of events: " + err.Error()}
	}
	b := &Batch{Body: body, FetchedAt: fetchedAt}
	for i, sp := range spans {
		ev, off, err := readEnvelope(body[sp.Off : sp.Off+sp.Len])
		if err == nil && !w.parser.wanted(ev.typ) {
			continue
		}
		start := len(b.Records)
		if err == nil {
			b.Records, err = w.parser.records(b.Records, ev.data, ev.id, ev.hasID)
		}
		if err != nil {
			return nil, &MalformedError{Body: body, FetchedAt: fetchedAt, Reason: fmt.Sprintf("event %d: %v", i, err)}
		}
		for j := start; j < len(b.Records); j++ {
			b.Records[j].Off += sp.Off + off
		}
	}
	return b, nil
}
