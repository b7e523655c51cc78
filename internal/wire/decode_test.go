package wire

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// TestDecodeFrameSeedsAgree runs FuzzDecodeFrame's comparison on its seeds
// and checks that they exercise it: most Encoder frames and variations
// decode, a few are divergent on purpose.
func TestDecodeFrameSeedsAgree(t *testing.T) {
	var decoded, divergentSeeds int
	for _, data := range seedFrames(t) {
		got, err := DecodeFrame(data)
		if divergent(t, data) {
			divergentSeeds++
			continue
		}
		want, stdErr := decodeFrameStd(data)
		if (err == nil) != (stdErr == nil) {
			t.Errorf("%.80s…: DecodeFrame error %v, encoding/json error %v", data, err, stdErr)
			continue
		}
		if err == nil {
			decoded++
			compareFrames(t, got, want)
		}
	}
	if decoded < 10 || divergentSeeds < 2 {
		t.Errorf("%d seeds decoded and %d divergent; the seeds no longer cover the comparison", decoded, divergentSeeds)
	}
}

func TestDecodeFrameFieldErrors(t *testing.T) {
	const head = `{"v":1,"type":"events","frame":1,`
	for _, tc := range []struct {
		name, data, wantErr string
	}{
		{"fraction", head + `"delivery":1.5}`, "decode frame: field delivery: number 1.5 is not an integer in range"},
		{"exponent", `{"frame":1e3}`, "decode frame: field frame: number 1e3 is not an integer in range"},
		{"too big", `{"frame":9223372036854775808}`, "field frame: number 9223372036854775808 is not an integer in range"},
		{"version as string", `{"v":"1"}`, "decode frame: field v: want an integer, found a string"},
		{"type as bool", `{"type":true}`, "decode frame: field type: want a string, found a bool"},
		{"events an object", head + `"events":{}}`, "decode frame: field events: want an array, found an object"},
		{"event a number", head + `"events":[{},7]}`, "decode frame: field events[1]: want an object, found a number"},
		{"raw an array", head + `"events":[{"raw":[]}]}`, "decode frame: field events[0].raw: want an object, found an array"},
		{"raw.off a string", head + `"events":[{},{"raw":{"key":"k","off":"3"}}]}`, "decode frame: field events[1].raw.off: want an integer, found a string"},
		{"seq null is fine, key a number", head + `"events":[{"seq":null,"key":5}]}`, "field events[0].key: want a string, found a number"},
		{"bad time", head + `"events":[{"fetched_at":"yesterday"}]}`, `decode frame: field events[0].fetched_at: parsing time "yesterday"`},
		{"time a number", head + `"events":[{"event_time":0}]}`, "field events[0].event_time: want a string, found a number"},
		{"bad base64", head + `"events":[{"payload_b64":"AP8"}]}`, "decode frame: field events[0].payload_b64: illegal base64 data at input byte"},
		{"base64 an array", head + `"events":[{"payload_b64":[]}]}`, "field events[0].payload_b64: want a string, found an array"},
		// The whole message must be valid JSON, including what is skipped.
		{"bad unknown field", head + `"future":[1,],"events":[]}`, "decode frame: invalid character ']' looking for a value at offset 45"},
		{"bad payload", head + `"events":[{"payload":{"a":01}}]}`, "decode frame: expected ',' or '}' after object element at offset 60"},
		{"bad after events", head + `"events":[],"x":tru}`, "decode frame: invalid literal, expected true"},
		{"trailing data", head + `"events":[]} {}`, "decode frame: unexpected data after the value at offset 46"},
		{"empty", ``, "decode frame: no JSON value, expected an object at offset 0"},
		{"array", `[]`, "decode frame: not a JSON object (found '[')"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := DecodeFrame([]byte(tc.data))
			if err == nil {
				t.Fatalf("DecodeFrame(%s) = %+v, want an error", tc.data, f)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestDecodeFrameSyntaxErrorUnwraps(t *testing.T) {
	_, err := DecodeFrame([]byte(`{"v":1,"events":[`))
	var se *jsonscan.SyntaxError
	if !errors.As(err, &se) || se.Offset != 17 {
		t.Errorf("DecodeFrame error %v, want a *jsonscan.SyntaxError at offset 17", err)
	}
}

// TestDecodeFramePayloadAliases checks what DecodeFrame documents: a JSON
// payload is a slice of the message, except a string, which is copied
// with its quotes.
func TestDecodeFramePayloadAliases(t *testing.T) {
	data := []byte(`{"v":1,"type":"events","frame":1,"events":[{"payload": {"a" : [1, 2]} },{"payload":"s\"x"},{"payload":null},{"payload_b64":"AP8="}]}`)
	f, err := DecodeFrame(data)
	if err != nil {
		t.Fatal(err)
	}
	evs := f.Events
	if string(evs[0].Payload) != `{"a" : [1, 2]}` || !aliases(evs[0].Payload, data) {
		t.Errorf("object payload %q, want the bytes of the message, not a copy", evs[0].Payload)
	}
	if string(evs[1].Payload) != `"s\"x"` || aliases(evs[1].Payload, data) {
		t.Errorf("string payload %q, want a copy with its quotes", evs[1].Payload)
	}
	if string(evs[2].Payload) != "null" || string(evs[2].Data()) != "null" {
		t.Errorf("null payload %q, want the JSON null", evs[2].Payload)
	}
	if evs[3].Payload != nil || !bytes.Equal(evs[3].Data(), []byte{0, 0xff}) {
		t.Errorf("base64 payload: Payload %q, Data %q", evs[3].Payload, evs[3].Data())
	}
}

// TestDecodeFrameSharesRepeatedStrings checks that reusing the last
// source and raw key decoded never hands out a stale one.
func TestDecodeFrameSharesRepeatedStrings(t *testing.T) {
	data := []byte(`{"v":1,"type":"events","events":[` +
		`{"key":"a","source":"gh","raw":{"key":"obj-1"}},` +
		`{"key":"b","source":"gh","raw":{"key":"obj-1"}},` +
		`{"key":"c","source":"g\u0068","raw":{"key":"obj-2"}},` +
		`{"key":"d","source":"gl","raw":{"key":"obj-2"}}]}`)
	f, err := DecodeFrame(data)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range f.Events {
		got = append(got, ev.Key+":"+ev.Source+":"+ev.Raw.Key)
	}
	if want := "a:gh:obj-1 b:gh:obj-1 c:gh:obj-2 d:gl:obj-2"; strings.Join(got, " ") != want {
		t.Errorf("decoded %q, want %q", got, want)
	}
}

// TestDecodeFrameAllocations checks that DecodeFrame allocates a string per
// event for its key, the source and raw key only once for events that
// share them, and nothing for payloads.
func TestDecodeFrameAllocations(t *testing.T) {
	evs, payloads := benchFrame()
	var enc Encoder
	enc.Begin(42, 1, "s3://ingest-raw/prod")
	for i := range evs {
		enc.Add(&evs[i], payloads[i], true)
	}
	data := enc.End()
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := DecodeFrame(data); err != nil {
			t.Fatal(err)
		}
	})
	// A key per event, and a handful per frame: the frame, its events
	// slice twice (for the first event, then grown to the estimate of the
	// rest), the raw store, one source and one raw key; the race detector
	// adds one.
	if want := float64(len(evs) + 8); allocs > want {
		t.Errorf("DecodeFrame of %d events made %v allocations, want at most %v", len(evs), allocs, want)
	}
}

// TestDecodeFrameIntoReuses decodes frames of different shapes into one
// Frame: each comes out as DecodeFrame decodes it, with nothing left of
// the frame before, and a frame no larger than the last needs no new
// events slice.
func TestDecodeFrameIntoReuses(t *testing.T) {
	evs, payloads := benchFrame()
	var enc Encoder
	enc.Begin(42, 3, "s3://ingest-raw/prod")
	for i := range evs {
		enc.Add(&evs[i], payloads[i], true)
	}
	big := enc.End()
	messages := [][]byte{
		big,
		[]byte(`{"v":1,"type":"events","frame":7,"events":[{"key":"a","source":"s","payload_b64":"AP8="}]}`),
		[]byte(`{"v":1,"type":"events","frame":8,"events":[]}`),
		[]byte(`{"v":1,"type":"events","frame":9}`),
		[]byte(`{"v":1,"type":"events","frame":10,"events":[{"key":"x"}],"events":[{"key":"y"},{"key":"z"}]}`),
		big,
	}
	var f Frame
	for i, data := range messages {
		want, err := DecodeFrame(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := DecodeFrameInto(&f, data); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(&f, want) {
			t.Errorf("message %d: DecodeFrameInto gave %+v, DecodeFrame %+v", i, f, *want)
		}
	}
	allocs := testing.AllocsPerRun(20, func() {
		if err := DecodeFrameInto(&f, big); err != nil {
			t.Fatal(err)
		}
	})
	// A key per event, the raw store, one source and one raw key; the
	// race detector adds one.
	if want := float64(len(evs) + 4); allocs > want {
		t.Errorf("DecodeFrameInto of %d events into a used Frame made %v allocations, want at most %v", len(evs), allocs, want)
	}
	if err := DecodeFrameInto(&f, []byte(`{"v":2,"type":"events"}`)); err == nil || !strings.Contains(err.Error(), "unsupported version 2") {
		t.Errorf("version 2: err = %v, want unsupported version", err)
	}
}

// TestDecodeFrameLaidOutEvents checks events laid out as the Encoder lays
// them out, which the decoder reads by comparing the text between values,
// and the same broken or varied at the seams: DecodeFrame accepts only
// valid JSON, agrees with encoding/json, and fails a bad value of a laid
// out event as it fails it in any other.
func TestDecodeFrameLaidOutEvents(t *testing.T) {
	const head = `{"v":1,"type":"events","frame":1,"delivery":1,"raw_store":"file:///r","events":[`
	const ev = `{"key":"k","source":"s","seq":1,"fetched_at":"2024-05-01T10:00:00Z","raw":{"key":"r","off":0,"len":1}`
	for _, tc := range []struct {
		name, events, wantErr string
	}{
		{"payload", ev + `,"payload":{"a":[1]}}`, ""},
		{"payload_b64 and event_time", `{"key":"k","source":"s","seq":1,"fetched_at":"2024-05-01T10:00:00Z","event_time":"2024-05-01T09:00:00Z","raw":{"key":"r","off":0,"len":1},"payload_b64":"AP8="}`, ""},
		{"no payload", ev + `}`, ""},
		{"both payloads", ev + `,"payload":1,"payload_b64":"AA=="}`, ""},
		{"two events", ev + `,"payload":1},` + ev + `,"payload":"x"}`, ""},
		{"whitespace", ev + ` ,"payload":1}`, ""},
		{"unknown member", ev + `,"payload":1,"x":[]}`, ""},
		{"repeated key", `{"key":"k","key":"j"}`, ""},
		// Invalid at a seam: a second member after the event closed.
		{"member after the event", ev + `,"payload":1},"payload_b64":"AA=="}`, "decode frame: "},
		{"raw not closed", ev + `,"payload":1}`[1:], "decode frame: "},
		{"event not closed", ev + `,"payload":1`, "decode frame: "},
		{"extra brace", ev + `,"payload":1}}`, "decode frame: "},
		// Bad values fail as in any event.
		{"bad off", `{"key":"k","source":"s","seq":1,"fetched_at":"2024-05-01T10:00:00Z","raw":{"key":"r","off":"0","len":1},"payload":1}`,
			"decode frame: field events[0].raw.off: want an integer, found a string"},
		{"bad time", `{"key":"k","source":"s","seq":1,"fetched_at":"then","raw":{"key":"r","off":0,"len":1},"payload":1}`,
			`decode frame: field events[0].fetched_at: parsing time "then"`},
		{"bad payload", ev + `,"payload":{"a":01}}`, "decode frame: expected ',' or '}' after object element"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(head + tc.events + `]}`)
			got, err := DecodeFrame(data)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("DecodeFrame(%s): error %v, want one containing %q (frame %+v)", data, err, tc.wantErr, got)
				}
				if _, stdErr := decodeFrameStd(data); stdErr == nil {
					t.Errorf("encoding/json accepts %s", data)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeFrame(%s): %v", data, err)
			}
			want, err := decodeFrameStd(data)
			if err != nil {
				t.Fatalf("encoding/json: %v", err)
			}
			compareFrames(t, got, want)
		})
	}
}
