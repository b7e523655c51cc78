package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzDecodeFrame checks DecodeFrame against decodeFrameStd, the
// encoding/json decoder it replaced: on any input both fail or both
// succeed with equal frames, except where DecodeFrame diverges on purpose
// (see divergent). DecodeFrame must never accept invalid JSON.
//
// The seeds are frames from the Encoder, built by seedFrames, and
// hand-written variations on them; inputs the fuzzer finds go to
// testdata/fuzz/FuzzDecodeFrame.
func FuzzDecodeFrame(f *testing.F) {
	for _, data := range seedFrames(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DecodeFrame(data)
		if err == nil && !json.Valid(data) {
			t.Fatalf("DecodeFrame accepted invalid JSON: %+v", got)
		}
		if err != nil && got != nil {
			t.Fatalf("DecodeFrame returned a frame with error %v", err)
		}
		if divergent(t, data) {
			return
		}
		want, stdErr := decodeFrameStd(data)
		if (err == nil) != (stdErr == nil) {
			t.Fatalf("DecodeFrame error %v, encoding/json error %v", err, stdErr)
		}
		if err != nil {
			return
		}
		for i := range got.Events {
			if p := got.Events[i].Payload; len(p) > 0 && p[0] != '"' && !aliases(p, data) {
				t.Fatalf("event %d: payload %q is a copy, not a slice of the input", i, p)
			}
		}
		compareFrames(t, got, want)
	})
}

// compareFrames fails t unless got and want are equal, times compared
// with Equal and by their zone, and no events equal to empty events.
func compareFrames(t *testing.T, got, want *Frame) {
	t.Helper()
	g, w := *got, *want
	if len(g.Events) != len(w.Events) {
		t.Fatalf("DecodeFrame found %d events, encoding/json %d", len(g.Events), len(w.Events))
	}
	g.Events = cloneEvents(g.Events)
	w.Events = cloneEvents(w.Events)
	for i := range g.Events {
		ge, we := &g.Events[i], &w.Events[i]
		for _, ts := range [][2]*time.Time{{&ge.FetchedAt, &we.FetchedAt}, {&ge.EventTime, &we.EventTime}} {
			if !ts[0].Equal(*ts[1]) || ts[0].String() != ts[1].String() {
				t.Fatalf("event %d: time %v, encoding/json %v", i, *ts[0], *ts[1])
			}
			*ts[0], *ts[1] = time.Time{}, time.Time{}
		}
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("frames differ\nDecodeFrame:   %+v\nencoding/json: %+v", g, w)
	}
}

// cloneEvents copies events so that normalising them leaves the decoded
// frame alone, and makes no events nil.
func cloneEvents(evs []Event) []Event {
	if len(evs) == 0 {
		return nil
	}
	return slices.Clone(evs)
}

// aliases reports whether sub is a slice of b's backing array.
func aliases(sub, b []byte) bool {
	for i := range b {
		if &b[i] == &sub[0] {
			return i+len(sub) <= len(b)
		}
	}
	return false
}

// Field names at each level of a frame, for divergent.
var (
	frameFields = []string{"v", "type", "frame", "delivery", "raw_store", "events"}
	eventFields = []string{"key", "source", "seq", "fetched_at", "event_time", "raw", "payload", "payload_b64"}
	rawFields   = []string{"key", "off", "len"}
)

// divergent reports whether data is valid JSON on which DecodeFrame may
// differ from encoding/json by design, as its doc comment says:
//
//   - A key that matches a field name only ignoring case ("V", "Key",
//     "ſeq" with a long s) sets that field for encoding/json and is an
//     unknown field for DecodeFrame. The protocol's field names are
//     lowercase and exact; a processor must not depend on a sender's
//     spelling.
//   - A frame with two or more "events" arrays: encoding/json decodes the
//     later ones over the events already decoded, merging them field by
//     field (even with stale elements of a longer earlier array), where
//     DecodeFrame lets the last array replace them. No sender repeats a
//     key, and merging two arrays element by element is not a behaviour
//     worth reproducing.
//
// Other repeated fields decode alike (the last wins; null leaves a field
// as it was; repeated "raw" objects merge), so those inputs are compared.
func divergent(t *testing.T, data []byte) bool {
	if !json.Valid(data) {
		return false
	}
	keys, vals, ok := members(t, data)
	if !ok {
		return false
	}
	if foldOnly(keys, frameFields) {
		return true
	}
	arrays := 0
	for k, key := range keys {
		if key != "events" {
			continue
		}
		var evs []json.RawMessage
		if json.Unmarshal(vals[k], &evs) != nil || evs == nil {
			continue // null, or an error for both decoders
		}
		if arrays++; arrays > 1 {
			return true
		}
		for _, ev := range evs {
			ekeys, evals, ok := members(t, ev)
			if !ok {
				continue
			}
			if foldOnly(ekeys, eventFields) {
				return true
			}
			for k, key := range ekeys {
				if key != "raw" {
					continue
				}
				if rkeys, _, ok := members(t, evals[k]); ok && foldOnly(rkeys, rawFields) {
					return true
				}
			}
		}
	}
	return false
}

// foldOnly reports whether a key matches one of names ignoring case but
// not exactly, as encoding/json's fallback matching would take it.
func foldOnly(keys, names []string) bool {
	for _, k := range keys {
		for _, n := range names {
			if k != n && strings.EqualFold(k, n) {
				return true
			}
		}
	}
	return false
}

// members returns the keys of a valid JSON object, unescaped and with
// duplicates, with their raw values; ok is false for another kind of value.
func members(t *testing.T, obj []byte) (keys []string, vals []json.RawMessage, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		keys = append(keys, tok.(string))
		vals = append(vals, v)
	}
	return keys, vals, true
}

// seedFrames returns frames from the Encoder covering what it writes
// (escapes, unicode and invalid UTF-8 in strings, event_time present and
// absent, JSON payloads of every kind, base64 payloads) and hand-written
// frames a future sender could write: fields reordered, unknown fields,
// whitespace, escapes the Encoder does not use, nulls, repeated and
// case-folded keys, and wrong types and ranges.
func seedFrames(tb testing.TB) [][]byte {
	fetched := time.Date(2024, 5, 1, 10, 0, 2, 517000000, time.UTC)
	payloads := []struct {
		data   string
		isJSON bool
	}{
		{`{"id":"evt-1","actor":{"id":1,"login":"a"},"commits":[{"sha":"0123"},{"sha":"4567"}],"public":true}`, true},
		{`{ "nested" : { "deeper" : [ { "k" : "v\"\\" } , null , -1.5e-3 ] } }`, true},
		{`"just a string with \"quotes\" and \u00e9"`, true},
		{`-12.5e3`, true},
		{`[]`, true},
		{`null`, true},
		{"\x00\xff binary \"payload\"\n", false},
		{"", false},
	}
	var enc Encoder
	var seeds [][]byte
	add := func(b []byte) { seeds = append(seeds, bytes.Clone(b)) }

	// Small frames of two events each: the fuzzer minimizes every input
	// it finds interesting, and a big one stalls it for minutes.
	for i, s := range awkwardStrings {
		if i%2 == 0 {
			enc.Begin(int64(70+i), 1+i%3, "s3://bucket/prefix \"q\" \xff"[:5+i])
		}
		ev := Event{
			Key: s, Source: "src-" + s, Seq: int64(1000 + i), FetchedAt: fetched.Add(time.Duration(i) * time.Millisecond),
			Raw: RawRef{Key: "raw/" + s, Off: i * 10, Len: 10},
		}
		if i%3 == 1 {
			ev.EventTime = fetched.Add(-time.Duration(i) * time.Hour)
		}
		p := payloads[i%len(payloads)]
		enc.Add(&ev, []byte(p.data), p.isJSON)
		if i%2 == 1 || i == len(awkwardStrings)-1 {
			add(enc.End())
		}
	}

	var indented bytes.Buffer
	if err := json.Indent(&indented, seeds[0], "\r\n", " \t"); err != nil {
		tb.Fatal(err)
	}
	add(indented.Bytes())

	evs, benchPayloads := benchFrame()
	enc.Begin(42, 1, "s3://ingest-raw/prod")
	enc.Add(&evs[0], benchPayloads[0], true)
	add(enc.End())

	enc.Begin(1, 1, "")
	add(enc.End())

	const ev = `{"key":"k","source":"s","seq":1,"fetched_at":"2024-05-01T10:00:00Z","raw":{"key":"r","off":0,"len":2},"payload":{}}`
	for _, s := range []string{
		// Reordered, unknown fields at every level, escapes.
		`{"events":[{"payload":[1,{"a":"b"}],"raw":{"len":2,"crc":[1],"off":3,"key":"r\u00e9"},"fetched_at":"2024-05-01T10:00:00.123456789Z","future":{"x":[]},"seq":9,"source":"\u0067ithub","key":"a\/b"}],"raw_store":"r","delivery":2,"frame":3,"type":"ev\u0065nts","v":1,"extra":null}`,
		`{"\u0076":1,"t\u0079pe":"events","frame":1,"events":[` + ev + `]}`,
		// Other time zones and formats.
		`{"v":1,"type":"events","frame":1,"events":[{"fetched_at":"2024-05-01T12:00:00+02:00","event_time":"2024-02-29T23:59:59.5-07:30"}]}`,
		`{"v":1,"type":"events","frame":1,"events":[{"fetched_at":"2024-05-01T10:00:00.1234567891Z"}]}`,
		`{"v":1,"type":"events","frame":1,"events":[{"fetched_at":"2023-02-29T10:00:00Z"}]}`,
		`{"v":1,"type":"events","frame":1,"events":[{"fetched_at":"2024-05-01t10:00:00z"}]}`,
		`{"v":1,"type":"events","frame":1,"events":[{"fetched_at":"2024-05-01T10:00:00\u005a"}]}`,
		// Base64 forms.
		`{"v":1,"type":"events","frame":1,"events":[{"payload_b64":"AP8=","payload":null},{"payload_b64":"AP\n8="},{"payload_b64":"\u0041P8="},{"payload_b64":"AP8"},{"payload_b64":null}]}`,
		// Nulls, null events, repeated fields.
		`{"v":1,"type":"events","frame":null,"delivery":null,"raw_store":null,"events":[null,{"key":null,"raw":null,"fetched_at":null,"payload":null}]}`,
		`{"v":1,"type":"events","frame":1,"frame":2,"events":[{"key":"a","key":"b","raw":{"key":"x","off":1},"raw":{"len":2},"payload":1,"payload":[2]}]}`,
		`{"v":1,"type":"events","events":[` + ev + `],"events":[{"seq":5}]}`,
		`{"v":1,"type":"events","events":null,"events":[` + ev + `]}`,
		// Case-folded keys, which DecodeFrame does not match.
		`{"V":1,"Type":"events","frame":1,"events":[{"KEY":"k","ſource":"s","Raw":{"Off":1}}]}`,
		// Numbers at and past the limits.
		`{"v":1,"type":"events","frame":9223372036854775807,"delivery":-9223372036854775808,"events":[{"seq":-0}]}`,
		`{"v":1,"type":"events","frame":9223372036854775808}`,
		`{"v":1,"type":"events","frame":1e3}`,
		`{"v":1.0,"type":"events"}`,
		// Wrong types.
		`{"v":1,"type":"events","events":{}}`,
		`{"v":1,"type":"events","events":[1]}`,
		`{"v":1,"type":"events","events":[{"raw":[]}]}`,
		`{"v":1,"type":"events","events":[{"fetched_at":1}]}`,
		`{"v":"1","type":"events"}`,
		`{"v":1,"type":true}`,
		// Wrong version and type, not objects, malformed JSON.
		`{"v":2,"type":"events","events":[]}`,
		`{"v":1,"type":"ack","frames":[1]}`,
		`null`, `[]`, `"events"`, ``,
		`{"v":1,"type":"events","events":[` + ev + `,]}`,
		`{"v":1,"type":"events","events":[{"payload":{"a":01}}]}`,
		`{"v":1,"type":"events","unknown":[1,}`,
		`{"v":1,"type":"events"} trailing`,
		"{\"v\":1,\"type\":\"events\",\"raw_store\":\"tab\there\"}",
	} {
		add([]byte(s))
	}
	return seeds
}

// FuzzDecodeFrameTrusted checks DecodeFrameTrusted on any input: it never
// panics, and on a frame DecodeFrame accepts whose every payload is as
// long as its raw.len says (as in every frame the daemon sends) it decodes
// the same frame. A payload whose raw.len is wrong is read by skimming,
// so it decodes the same too unless the wrong length happens to land on
// a plausible event end, which only a sender that is not the daemon makes.
func FuzzDecodeFrameTrusted(f *testing.F) {
	for _, data := range seedFrames(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got Frame
		err := DecodeFrameTrusted(&got, data)
		want, wantErr := DecodeFrame(data)
		if wantErr != nil {
			return // invalid frames: trusted decoding need not notice
		}
		for _, e := range want.Events {
			if e.Payload != nil && len(e.Payload) != e.Raw.Len {
				return // a length the daemon would never send
			}
		}
		if err != nil {
			t.Fatalf("DecodeFrameTrusted failed on a frame DecodeFrame accepts: %v", err)
		}
		compareFrames(t, &got, want)
	})
}
