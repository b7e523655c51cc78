package sources

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

// sseEv is an sseEvent in a form tests compare and print well.
type sseEv struct {
	Event      bool
	Type, Data string
	ID         string
	HasID      bool
	LastID     string
	TooBig     bool
}

func evOf(ev sseEvent) sseEv {
	return sseEv{Event: ev.event, Type: ev.typ, Data: string(ev.data), ID: ev.id, HasID: ev.hasID, LastID: ev.lastID, TooBig: ev.tooBig}
}

// msg is an event of type "message" with data and no id line.
func msg(data, lastID string) sseEv {
	return sseEv{Event: true, Type: "message", Data: data, LastID: lastID}
}

// scanAll reads every dispatch of r with events of at most maxEvent bytes,
// starting from lastID, and returns them with the scanner at the end.
func scanAll(t testing.TB, r io.Reader, maxEvent int, lastID string) ([]sseEv, *sseScanner) {
	t.Helper()
	sc := newSSEScanner(r, maxEvent, lastID)
	var out []sseEv
	for {
		ev, err := sc.next()
		if errors.Is(err, io.EOF) {
			return out, sc
		}
		if err != nil {
			t.Fatalf("scan: %v", err)
		}
		if ev.event && ev.data == nil {
			t.Fatalf("event %+v has nil data", ev)
		}
		out = append(out, evOf(ev))
	}
}

// TestSSEScannerSpecExamples runs the examples of the WHATWG HTML
// standard's "Server-sent events" section, and the rules of its parsing
// and interpretation, through the scanner.
func TestSSEScannerSpecExamples(t *testing.T) {
	cases := []struct {
		name, stream, lastID string
		want                 []sseEv
	}{
		{"three data lines are one event", "data: YHOO\ndata: +2\ndata: 10\n\n", "",
			[]sseEv{msg("YHOO\n+2\n10", "")}},
		{"comment, ids, a bare id line, one space stripped",
			": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n", "",
			[]sseEv{
				{Event: true, Type: "message", Data: "first event", ID: "1", HasID: true, LastID: "1"},
				{Event: true, Type: "message", Data: "second event", HasID: true, LastID: ""},
				msg(" third event", ""),
			}},
		{"bare data lines; an event cut off by the end is discarded", "data\n\ndata\ndata\n\ndata:", "",
			[]sseEv{msg("", ""), msg("\n", "")}},
		{"the space after the colon is optional", "data:test\n\ndata: test\n\n", "",
			[]sseEv{msg("test", ""), msg("test", "")}},
		{"event types", "event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\nevent: add\ndata: 113411\n\n", "",
			[]sseEv{
				{Event: true, Type: "add", Data: "73857293"},
				{Event: true, Type: "remove", Data: "2153"},
				{Event: true, Type: "add", Data: "113411"},
			}},
		{"CRLF, CR and LF line ends", "data: a\r\ndata: b\r\rdata: c\n\r\n", "",
			[]sseEv{msg("a\nb", ""), msg("c", "")}},
		{"a leading BOM is skipped", "\xEF\xBB\xBFdata: x\n\n", "", []sseEv{msg("x", "")}},
		{"only one BOM is skipped", "\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n", "", nil},
		{"a BOM later is data", "data: \xEF\xBB\xBFx\n\n", "", []sseEv{msg("\xEF\xBB\xBFx", "")}},
		{"an id with NUL is ignored", "id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n", "", []sseEv{
			{Event: true, Type: "message", Data: "a", ID: "1", HasID: true, LastID: "1"},
			msg("b", "1"),
		}},
		{"the last event ID carries over", "id: 5\ndata: a\n\ndata: b\n\n", "", []sseEv{
			{Event: true, Type: "message", Data: "a", ID: "5", HasID: true, LastID: "5"},
			msg("b", "5"),
		}},
		{"the stream starts from the id it resumed from", "data: a\n\nid: 10\n\n", "9", []sseEv{
			msg("a", "9"), {LastID: "10"},
		}},
		{"a block with only an id moves the last event ID once", "id: 7\n\nid: 7\n\n:\n\n\n\nid: 8\nevent: x\n\n", "", []sseEv{
			{LastID: "7"}, {LastID: "8"},
		}},
		{"unknown fields, colons in values, empty event type",
			"foo: bar\nDATA: no\ndata: a:b\nevent:\n\nevent: \ndata: c\n\n", "",
			[]sseEv{msg("a:b", ""), msg("c", "")}},
		{"an event type does not outlive its event", "event: x\ndata: a\n\ndata: b\n\n", "",
			[]sseEv{{Event: true, Type: "x", Data: "a"}, msg("b", "")}},
		{"an event type of an event with no data is dropped", "event: x\n\ndata: b\n\n", "",
			[]sseEv{msg("b", "")}},
		{"an unterminated last line is discarded", "data: a\n\ndata: b\n", "", []sseEv{msg("a", "")}},
		{"a field with no colon has an empty value", "data\ndata: x\n\n", "", []sseEv{msg("\nx", "")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := scanAll(t, strings.NewReader(tc.stream), 1<<20, tc.lastID)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("events\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestSSEScannerRetry(t *testing.T) {
	for _, tc := range []struct {
		stream string
		want   time.Duration
		ok     bool
	}{
		{"retry: 1500\n", 1500 * time.Millisecond, true},
		{"retry:250\nretry: 15x\n", 250 * time.Millisecond, true},
		{"retry: -1\nretry: 1.5\nretry:\nretry\nretry:  5\n", 0, false},
		{"retry: 99999999999999999999999\n", time.Duration(1<<63 - 1), true},
		{"retry: 0\n", 0, true},
		{"retry: 20", 0, false}, // unterminated
	} {
		_, sc := scanAll(t, strings.NewReader(tc.stream), 1<<20, "")
		if got, ok := sc.reconnection(); got != tc.want || ok != tc.ok {
			t.Errorf("%q: reconnection %v, %v; want %v, %v", tc.stream, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSSEScannerOversize(t *testing.T) {
	long := strings.Repeat("x", 100)
	stream := "id: 1\ndata: 0123456789AB\n\n" + // one line too long
		"id: 2\ndata: 01234\ndata: 56789\n\n" + // 11 bytes with the LF
		"id: 3\ndata: 0123\ndata: 4\n\n" + // 6: fits
		":" + long + "\n" + long + ": ignored\n" + // long comment and unknown field: harmless
		"id: 4\nevent: " + long + "\ndata: a\n\n" +
		"id: " + long + "\ndata: b\n\n" +
		"data: 0123456789\n\n" // exactly max
	got, _ := scanAll(t, strings.NewReader(stream), 10, "")
	want := []sseEv{
		{Event: true, Type: "message", Data: "0123456789", ID: "1", HasID: true, LastID: "1", TooBig: true},
		{Event: true, Type: "message", Data: "01234\n5678", ID: "2", HasID: true, LastID: "2", TooBig: true},
		{Event: true, Type: "message", Data: "0123\n4", ID: "3", HasID: true, LastID: "3"},
		// The event line is cut at max_event_bytes + sseLineSlack bytes.
		{Event: true, Type: long[:10+sseLineSlack-len("event: ")], Data: "a", ID: "4", HasID: true, LastID: "4", TooBig: true},
		{Event: true, Type: "message", Data: "b", LastID: "4", TooBig: true},
		msg("0123456789", "4"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n%+v\nwant\n%+v", got, want)
	}
}

// chunkReader returns data in chunks whose sizes cycle through cuts (each
// 1 + cut%16 bytes).
type chunkReader struct {
	data, cuts []byte
	i          int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(c.cuts) > 0 {
		n = 1 + int(c.cuts[c.i%len(c.cuts)]%16)
		c.i++
	}
	n = copy(p, c.data[:min(n, len(c.data))])
	c.data = c.data[n:]
	return n, nil
}

// refSSE parses a whole stream by the standard's algorithm, line by line,
// as a reference for the incremental scanner (events of any size).
func refSSE(in []byte, lastID string) (out []sseEv, retry time.Duration, hasRetry bool) {
	in = bytes.TrimPrefix(in, sseBOM)
	var data []byte
	var typ, blockID string
	var hasID bool
	reported := lastID
	for {
		i := bytes.IndexAny(in, "\r\n")
		if i < 0 {
			return out, retry, hasRetry // an unterminated line is discarded
		}
		line := in[:i]
		if in[i] == '\r' && i+1 < len(in) && in[i+1] == '\n' {
			i++
		}
		in = in[i+1:]
		if len(line) == 0 {
			ev := sseEv{Type: typ, ID: blockID, HasID: hasID, LastID: lastID}
			typ, blockID, hasID = "", "", false
			switch {
			case len(data) > 0:
				ev.Event, ev.Data = true, string(data[:len(data)-1])
				if ev.Type == "" {
					ev.Type = "message"
				}
				out, reported, data = append(out, ev), lastID, nil
			case lastID != reported:
				out, reported = append(out, sseEv{LastID: lastID}), lastID
			}
			continue
		}
		name, value, colon := strings.Cut(string(line), ":")
		if colon && name == "" {
			continue
		}
		value = strings.TrimPrefix(value, " ")
		switch name {
		case "data":
			data = append(append(data, value...), '\n')
		case "event":
			typ = value
		case "id":
			if !strings.Contains(value, "\x00") {
				lastID, blockID, hasID = value, value, true
			}
		case "retry":
			if isDigits(value) {
				retry, hasRetry = retryMillis([]byte(value)), true
			}
		}
	}
}

// FuzzSSEParse checks that the scanner never panics, that a stream cut
// into arbitrary chunks scans to the same events (and reconnection time)
// as the stream read whole, and, when no event can be too big, to what
// the reference line-by-line parser gives.
func FuzzSSEParse(f *testing.F) {
	for _, seed := range []string{
		"data: YHOO\ndata: +2\ndata: 10\n\n",
		": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n",
		"data\n\ndata\ndata\n\ndata:",
		"\xEF\xBB\xBFevent: add\r\ndata: 1\r\n\r\nid: 2\x00\rretry: 300\r\r",
		"id: 7\n\nid: 7\n\nid: 8\ndata: {\"a\":1}\n\n",
	} {
		f.Add([]byte(seed), []byte{0, 3, 1, 15}, uint16(8))
		f.Add([]byte(seed), []byte{}, uint16(1000))
	}
	f.Fuzz(func(t *testing.T, in, cuts []byte, maxEvent uint16) {
		limit := int(maxEvent) + 1
		whole, wsc := scanAll(t, bytes.NewReader(in), limit, "0")
		chunked, csc := scanAll(t, &chunkReader{data: in, cuts: cuts}, limit, "0")
		if !reflect.DeepEqual(whole, chunked) {
			t.Fatalf("chunked %q differently:\nwhole   %+v\nchunked %+v", cuts, whole, chunked)
		}
		wr, wok := wsc.reconnection()
		cr, cok := csc.reconnection()
		if wr != cr || wok != cok {
			t.Fatalf("reconnection whole %v %v, chunked %v %v", wr, wok, cr, cok)
		}
		if limit < len(in) {
			return
		}
		ref, rr, rok := refSSE(in, "0")
		if !reflect.DeepEqual(whole, ref) || rr != wr || rok != wok {
			t.Fatalf("scanner and reference differ:\nscanner   %+v (retry %v %v)\nreference %+v (retry %v %v)", whole, wr, wok, ref, rr, rok)
		}
	})
}

func TestSSERecordKeys(t *testing.T) {
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return hex.EncodeToString(h[:])
	}
	cases := []struct {
		name, idField, data, id string
		hasID                   bool
		want                    []string // keys
	}{
		{"id_field wins", "id", `{"id":"a","n":1}`, "9", true, []string{"a"}},
		{"the event's id without id_field", "", `{"n":1}`, "9", true, []string{"9"}},
		{"the event's id when id_field is absent", "id", `{"n":1}`, "9", true, []string{"9"}},
		{"the event's id and index for several records", "id", `[{"n":1},{"id":"b"},{"n":3}]`, "9", true, []string{"9#0", "b", "9#2"}},
		{"the hash without an id", "id", ` {"n":1} `, "", false, []string{sum(`{"n":1}`)}},
		{"the hash with an empty id", "", `"text"`, "", true, []string{sum(`"text"`)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := sseParser{idField: tc.idField}
			recs, err := p.records(nil, []byte(tc.data), tc.id, tc.hasID)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range recs {
				got = append(got, r.Key)
				if tc.hasID && r.Cursor != tc.id {
					t.Errorf("record cursor %q, want the event id %q", r.Cursor, tc.id)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("keys %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSSEParseEnvelopes checks that Parse reads back batch bodies as
// assembled from envelopes: the same records at the same offsets, with
// event_types applied, and the payload exactly the data (or an element).
func TestSSEParseEnvelopes(t *testing.T) {
	w := &sseSource{parser: sseParser{idField: "id", types: map[string]bool{"message": true, "add": true},
		ws: wsParser{timeField: "ts"}}}
	events := []sseEvent{
		{event: true, typ: "message", data: []byte(` {"id":"a","ts":"2026-01-02T03:04:05Z"}`), id: "1", hasID: true},
		{event: true, typ: "add", data: []byte("[{\"n\":1},\n\"two\", 3]"), id: "q\"\\\x01", hasID: true},
		{event: true, typ: "message", data: []byte(`"a string"`)},
		{event: true, typ: "skip", data: []byte(`{"id":"skipped"}`)},
	}
	var items []*sseItem
	for _, ev := range events {
		it := w.item(ev)
		if !w.parser.wanted(ev.typ) {
			if it.env != nil {
				t.Fatalf("an event of a type not wanted has an envelope: %s", it.env)
			}
			continue
		}
		if it.bad != "" {
			t.Fatal(it.bad)
		}
		items = append(items, &it)
	}
	b := w.assemble(items)
	var payloads []string
	for _, r := range b.Records {
		payloads = append(payloads, string(b.Body[r.Off:r.Off+r.Len]))
	}
	want := []string{`{"id":"a","ts":"2026-01-02T03:04:05Z"}`, `{"n":1}`, `"two"`, `3`, `"a string"`}
	if !reflect.DeepEqual(payloads, want) {
		t.Fatalf("payloads %q, want %q\nbody %s", payloads, want, b.Body)
	}
	if b.Records[0].Key != "a" || b.Records[0].Time.IsZero() || b.Records[1].Key != "q\"\\\x01#0" {
		t.Fatalf("records %+v", b.Records)
	}
	p, err := w.Parse(b.Body, b.FetchedAt)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Records, b.Records) {
		t.Fatalf("Parse gave\n%+v\nFetch gave\n%+v", p.Records, b.Records)
	}
	// A narrower event_types at replay keeps fewer records.
	w.parser.types = map[string]bool{"add": true}
	if p, err = w.Parse(b.Body, b.FetchedAt); err != nil || len(p.Records) != 3 {
		t.Fatalf("Parse with event_types [add]: %+v, %v", p, err)
	}
	for _, body := range []string{``, `{}`, `[{"id":"1","event":"message"}]`, `[{"event":1,"data":2}]`, `[{"id":7,"data":2}]`, `[{"event":"message","data":{"a":1}}`} {
		if _, err := w.Parse([]byte(body), time.Time{}); err == nil {
			t.Errorf("Parse(%q) succeeded", body)
		} else if _, ok := AsMalformed(err); !ok {
			t.Errorf("Parse(%q): %v, want a *MalformedError", body, err)
		}
	}
}
