package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// awkwardStrings are keys and sources that need escaping or replacement.
var awkwardStrings = []string{
	"",
	"plain-key-42",
	`say "hi"`,
	`C:\path\to\file`,
	"tab\there\nnewline\rreturn",
	"\x00\x01\x07\x08\x0b\x0c\x1b\x1f\x7f",
	"html <b>&amp;</b>",
	"café ☕ 日本語 🎉",
	"line\u2028separator\u2029paragraph",
	"bad \xff utf-8 \xc3\x28 and a cut rune \xe2\x82",
	"\xed\xa0\x80 surrogate half",
	"\ufffd already a replacement char",
}

// viaJSON returns s as encoding/json returns it after a round trip: invalid
// UTF-8 replaced by U+FFFD.
func viaJSON(t testing.TB, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("marshal %q: %v", s, err)
	}
	var out string
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	return out
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range awkwardStrings {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("marshal %q: %v", s, err)
		}
		got := AppendString([]byte("prefix"), s)
		if !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Errorf("AppendString(%q)\n got %s\nwant prefix%s", s, got, want)
		}
	}
}

func TestEncoderRoundTrip(t *testing.T) {
	fetched := time.Date(2024, 5, 1, 10, 0, 0, 123456789, time.UTC)
	// A non-UTC event time must come out as the same instant.
	eventTime := time.Date(2024, 5, 1, 11, 30, 0, 0, time.FixedZone("CEST", 2*3600))
	jsonPayload := []byte("{ \"id\" : \"a\\\"b\",\n  \"n\": [1, 2.5e3, null, true], \"s\": \"<tag> & \\u00e9\" }")
	binPayload := []byte{0x00, 0xff, 0xfe, '"', '\\', 0x80, 'x', '\n'}

	type input struct {
		ev      Event
		payload []byte
		isJSON  bool
	}
	var inputs []input
	for i, s := range awkwardStrings {
		in := input{
			ev: Event{
				Key:       s,
				Source:    "src-" + s,
				Seq:       int64(1000 + i),
				FetchedAt: fetched,
				Raw:       RawRef{Key: "raw/" + s, Off: i * 10, Len: 10},
			},
			payload: jsonPayload,
			isJSON:  true,
		}
		if i%2 == 1 {
			in.ev.EventTime = eventTime
		}
		if i%3 == 2 {
			in.payload, in.isJSON = binPayload, false
		}
		if i%4 == 1 { // a traced event, with and without a tracestate
			in.ev.Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
			if i%8 == 1 {
				in.ev.Tracestate = "vendor=" + strconv.Itoa(i)
			}
		}
		inputs = append(inputs, in)
	}
	// Payloads that are JSON scalars and an empty non-JSON payload.
	inputs = append(inputs,
		input{ev: Event{Key: "scalar", Source: "s", Seq: 1, FetchedAt: fetched}, payload: []byte(`"just a string"`), isJSON: true},
		input{ev: Event{Key: "number", Source: "s", Seq: 2, FetchedAt: fetched}, payload: []byte(`-12.5e-3`), isJSON: true},
		input{ev: Event{Key: "empty-binary", Source: "s", Seq: 3, FetchedAt: fetched}, payload: []byte{}, isJSON: false},
	)

	var enc Encoder
	// Encode an unrelated frame first: Begin must reset the reused buffer.
	enc.Begin(1, 1, "stale")
	enc.Add(&Event{Key: "stale", Source: "stale", FetchedAt: fetched}, []byte(`{}`), true)
	enc.End()

	rawStore := "s3://bucket/prefix \"quoted\" \xff"
	enc.Begin(77, 3, rawStore)
	for i := range inputs {
		enc.Add(&inputs[i].ev, inputs[i].payload, inputs[i].isJSON)
	}
	data := enc.End()
	if !json.Valid(data) {
		t.Fatalf("encoder output is not valid JSON:\n%s", data)
	}
	if !bytes.Contains(data, jsonPayload) {
		t.Errorf("JSON payload is not embedded verbatim in\n%s", data)
	}

	f, err := DecodeFrame(data)
	if err != nil {
		t.Fatalf("DecodeFrame: %v\n%s", err, data)
	}
	if f.V != Version || f.Type != TypeEvents || f.ID != 77 || f.Delivery != 3 || f.RawStore != viaJSON(t, rawStore) {
		t.Errorf("frame header = v %d type %q id %d delivery %d raw_store %q", f.V, f.Type, f.ID, f.Delivery, f.RawStore)
	}
	if len(f.Events) != len(inputs) {
		t.Fatalf("decoded %d events, want %d", len(f.Events), len(inputs))
	}
	for i, got := range f.Events {
		in := inputs[i]
		want := in.ev
		if got.Key != viaJSON(t, want.Key) || got.Source != viaJSON(t, want.Source) || got.Seq != want.Seq {
			t.Errorf("event %d: key %q source %q seq %d, want %q %q %d", i, got.Key, got.Source, got.Seq, viaJSON(t, want.Key), viaJSON(t, want.Source), want.Seq)
		}
		if !got.FetchedAt.Equal(want.FetchedAt) {
			t.Errorf("event %d: fetched_at %v, want %v", i, got.FetchedAt, want.FetchedAt)
		}
		if !got.EventTime.Equal(want.EventTime) {
			t.Errorf("event %d: event_time %v, want %v", i, got.EventTime, want.EventTime)
		}
		if got.Raw != (RawRef{Key: viaJSON(t, want.Raw.Key), Off: want.Raw.Off, Len: want.Raw.Len}) {
			t.Errorf("event %d: raw %+v, want %+v", i, got.Raw, want.Raw)
		}
		if in.isJSON {
			if !bytes.Equal(got.Payload, in.payload) || got.PayloadBase64 != nil {
				t.Errorf("event %d: payload %q payload_b64 %q, want payload %q verbatim", i, got.Payload, got.PayloadBase64, in.payload)
			}
		} else if got.Payload != nil || !bytes.Equal(got.PayloadBase64, in.payload) {
			t.Errorf("event %d: payload %q payload_b64 %q, want payload_b64 %q", i, got.Payload, got.PayloadBase64, in.payload)
		}
		if !bytes.Equal(got.Data(), in.payload) {
			t.Errorf("event %d: Data() = %q, want %q", i, got.Data(), in.payload)
		}
	}

	// event_time is left out, not sent as a zero time, when it is unknown.
	var generic struct {
		Events []map[string]json.RawMessage `json:"events"`
	}
	if err := json.Unmarshal(data, &generic); err != nil {
		t.Fatal(err)
	}
	for i, m := range generic.Events {
		_, has := m["event_time"]
		if wantHas := !inputs[i].ev.EventTime.IsZero(); has != wantHas {
			t.Errorf("event %d: event_time present = %v, want %v", i, has, wantHas)
		}
		_, hasJSON := m["payload"]
		_, hasB64 := m["payload_b64"]
		if hasJSON != inputs[i].isJSON || hasB64 == inputs[i].isJSON {
			t.Errorf("event %d: payload present %v, payload_b64 present %v; payload is JSON: %v", i, hasJSON, hasB64, inputs[i].isJSON)
		}
	}
}

// TestEncoderMatchesEncodingJSON checks the encoder byte for byte against
// json.Marshal of the same Frame, for compact payloads (json.Marshal
// compacts and HTML-escapes a json.RawMessage; the encoder embeds it as is).
func TestEncoderMatchesEncodingJSON(t *testing.T) {
	fetched := time.Date(2023, 12, 31, 23, 59, 59, 5000, time.UTC)
	f := Frame{V: Version, Type: TypeEvents, ID: 9, Delivery: 1, RawStore: "file://./data/raw"}
	var enc Encoder
	enc.Begin(f.ID, f.Delivery, f.RawStore)
	for i, s := range awkwardStrings {
		// Pairs of events share a fetch time, as a frame's events do, and
		// then it changes: the encoder's cached fetched_at must follow.
		ev := Event{
			Key: s, Source: "github", Seq: int64(i + 1), FetchedAt: fetched.Add(time.Duration(i/2) * time.Millisecond),
			Raw: RawRef{Key: "github/2023/12/31/" + s, Off: 100 * i, Len: 99},
		}
		payload := []byte(fmt.Sprintf(`{"n":%d,"tags":["a","b"]}`, i))
		isJSON := i%2 == 0
		if isJSON {
			ev.Payload = payload
		} else {
			ev.EventTime = fetched.Add(-time.Hour)
			ev.PayloadBase64 = payload
		}
		enc.Add(&ev, payload, isJSON)
		f.Events = append(f.Events, ev)
	}
	got := enc.End()
	want, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("encoder and json.Marshal differ\nencoder: %s\n   json: %s", got, want)
	}
}

// TestEncoderMemberMatchesEncodingJSON: a cluster member's frames carry
// "member" where encoding/json puts it, and it decodes back; a frame
// without one has no "member" at all.
func TestEncoderMemberMatchesEncodingJSON(t *testing.T) {
	f := Frame{V: Version, Type: TypeEvents, ID: 3, Delivery: 2, RawStore: "file://./data/raw", Member: `ingestor-0 "eu"`,
		Events: []Event{{Key: "k", Source: "s", Seq: 1, FetchedAt: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC), Payload: []byte(`{}`)}}}
	var enc Encoder
	enc.SetMember(f.Member)
	enc.Begin(f.ID, f.Delivery, f.RawStore)
	enc.Add(&f.Events[0], f.Events[0].Payload, true)
	got := enc.End()
	want, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("encoder and json.Marshal differ\nencoder: %s\n   json: %s", got, want)
	}
	back, err := DecodeFrame(got)
	if err != nil || back.Member != f.Member {
		t.Fatalf("decoded member %q (%v), want %q", back.Member, err, f.Member)
	}
	enc.SetMember("")
	enc.Begin(4, 1, "")
	if data := enc.End(); bytes.Contains(data, []byte(`"member"`)) {
		t.Errorf("a frame without a member carries one: %s", data)
	}
}

func TestEncoderEmptyFrame(t *testing.T) {
	var enc Encoder
	enc.Begin(5, 1, "")
	data := enc.End()
	f, err := DecodeFrame(data)
	if err != nil {
		t.Fatalf("DecodeFrame(%s): %v", data, err)
	}
	if f.ID != 5 || len(f.Events) != 0 {
		t.Errorf("decoded %+v, want frame 5 with no events", f)
	}
}

// TestEncoderSendsInvalidUTF8AsBase64 checks the rule of PROTOCOL.md's
// Events frame: a JSON payload holding bytes that are not valid UTF-8 (a
// raw 0xFF inside a string, as an upstream may send) travels as
// payload_b64 with exactly its bytes, so the frame stays valid UTF-8, while
// a valid payload next to it is still embedded verbatim.
func TestEncoderSendsInvalidUTF8AsBase64(t *testing.T) {
	good := []byte(`{"id":"g","s":"caf\u00e9 é"}`)
	bad := []byte("{\"id\":\"b\",\"s\":\"caf\xe9 \xff\"}")
	var enc Encoder
	enc.Begin(9, 1, "file:///raw")
	enc.Add(&Event{Key: "g", Source: "s"}, good, true)
	enc.Add(&Event{Key: "b", Source: "s"}, bad, true)
	data := enc.End()
	if !utf8.Valid(data) || !json.Valid(data) {
		t.Fatalf("frame is not valid UTF-8 JSON:\n%q", data)
	}
	f, err := DecodeFrame(data)
	if err != nil {
		t.Fatalf("DecodeFrame: %v\n%s", err, data)
	}
	if g := f.Events[0]; !bytes.Equal(g.Payload, good) || g.PayloadBase64 != nil {
		t.Errorf("valid payload = %s / b64 %q, want it embedded verbatim", g.Payload, g.PayloadBase64)
	}
	if b := f.Events[1]; b.Payload != nil || !bytes.Equal(b.PayloadBase64, bad) {
		t.Errorf("invalid UTF-8 payload = %s / b64 %q, want payload_b64 holding %q", b.Payload, b.PayloadBase64, bad)
	}
}

func TestDecodeFrameIgnoresUnknownFields(t *testing.T) {
	data := []byte(`{"v":1,"type":"events","frame":3,"delivery":2,"raw_store":"r","future":{"x":[1]},
		"events":[{"key":"k","source":"s","seq":7,"fetched_at":"2024-01-02T03:04:05Z","raw":{"key":"o","off":0,"len":2,"crc":1},
		"payload":{},"priority":"high"}]}`)
	f, err := DecodeFrame(data)
	if err != nil {
		t.Fatalf("DecodeFrame: %v", err)
	}
	if len(f.Events) != 1 || f.Events[0].Key != "k" || f.Events[0].Raw.Len != 2 || string(f.Events[0].Payload) != "{}" {
		t.Errorf("decoded %+v", f)
	}
}

func TestDecodeFrameErrors(t *testing.T) {
	for _, tc := range []struct {
		name, data, wantErr string
	}{
		{"not JSON", `hello`, "decode frame: invalid character"},
		{"truncated", `{"v":1,"type":"events","frame":1,"events":[`, "decode frame: unexpected end of input at offset 43"},
		{"wrong field type", `{"v":1,"type":"events","frame":"one"}`, "decode frame: field frame: want an integer, found a string"},
		{"no version", `{"type":"events","frame":1,"events":[]}`, "decode frame: unsupported version 0 (want 1)"},
		{"newer version", `{"v":2,"type":"events","frame":1,"events":[]}`, "decode frame: unsupported version 2 (want 1)"},
		{"ack type", `{"v":1,"type":"ack","frames":[1]}`, `decode frame: unexpected type "ack"`},
		{"no type", `{"v":1,"frame":1,"events":[]}`, `decode frame: unexpected type ""`},
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

func TestAckRoundTrip(t *testing.T) {
	for _, a := range []Ack{
		{Frames: []int64{1, 2, 1 << 53}},
		{Keys: []KeyAck{{Frame: 4, Source: "github", Key: `k"1\` + "\n"}}},
		// V and Type are set by EncodeAck whatever the caller passed.
		{V: 7, Type: "bogus", Frames: []int64{9}, Keys: []KeyAck{{Frame: 10, Source: "s", Key: "a"}, {Frame: 10, Source: "s", Key: "b"}}},
	} {
		data, err := EncodeAck(a)
		if err != nil {
			t.Fatalf("EncodeAck(%+v): %v", a, err)
		}
		got, err := DecodeAck(data)
		if err != nil {
			t.Fatalf("DecodeAck(%s): %v", data, err)
		}
		want := a
		want.V, want.Type = Version, TypeAck
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("round trip of %s = %+v, want %+v", data, *got, want)
		}
	}
}

func TestEncodeAckWireShape(t *testing.T) {
	data, err := EncodeAck(Ack{Frames: []int64{3}})
	if err != nil {
		t.Fatal(err)
	}
	// "keys" is left out when empty: receivers must accept either field alone.
	if want := `{"v":1,"type":"ack","frames":[3]}`; string(data) != want {
		t.Errorf("EncodeAck = %s, want %s", data, want)
	}
}

func TestDecodeAckErrors(t *testing.T) {
	empty, err := EncodeAck(Ack{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, data, wantErr string
	}{
		{"empty ack", string(empty), "decode ack: no frames, keys or nacks"},
		{"empty lists", `{"v":1,"type":"ack","frames":[],"keys":[]}`, "decode ack: no frames, keys or nacks"},
		{"not JSON", `\x00\x01`, "decode ack: invalid character"},
		{"frames not numbers", `{"v":1,"type":"ack","frames":["1"]}`, "decode ack: field frames[0]: want an integer, found a string"},
		{"newer version", `{"v":2,"type":"ack","frames":[1]}`, "decode ack: unsupported version 2 (want 1)"},
		{"events type", `{"v":1,"type":"events","frames":[1]}`, `decode ack: unexpected type "events"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := DecodeAck([]byte(tc.data))
			if err == nil {
				t.Fatalf("DecodeAck(%s) = %+v, want an error", tc.data, a)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not contain %q", err, tc.wantErr)
			}
		})
	}
}

// benchFrame returns 100 events of about 500 B JSON payload each, the
// daemon's default frame size, with their payloads.
func benchFrame() ([]Event, [][]byte) {
	const events = 100
	fetched := time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)
	evs := make([]Event, events)
	payloads := make([][]byte, events)
	for i := range evs {
		evs[i] = Event{
			Key:       fmt.Sprintf("evt-%08d", i),
			Source:    "github",
			Seq:       int64(1_000_000 + i),
			FetchedAt: fetched,
			EventTime: fetched.Add(-time.Duration(i) * time.Second),
			Raw:       RawRef{Key: "github/2024/05/01/100000-000042.json", Off: i * 500, Len: 500},
		}
		// A ~500 B JSON record, typical of an upstream API item.
		p := fmt.Appendf(nil, `{"id":"evt-%08d","type":"PushEvent","actor":{"id":%d,"login":"user-%d"},"payload":{"ref":"refs/heads/main","size":3,"commits":[`, i, i, i)
		for len(p) < 470 {
			p = append(p, `{"sha":"0123456789abcdef"},`...)
		}
		p = append(p[:len(p)-1], `]},"public":true}`...)
		payloads[i] = p
		evs[i].Raw.Len = len(p) // as in a real frame: the payload is the raw bytes
	}
	return evs, payloads
}

func BenchmarkEncodeFrame(b *testing.B) {
	evs, payloads := benchFrame()
	var enc Encoder
	encode := func() []byte {
		enc.Begin(42, 1, "s3://ingest-raw/prod")
		for i := range evs {
			enc.Add(&evs[i], payloads[i], true)
		}
		return enc.End()
	}
	size := len(encode())
	b.SetBytes(int64(size))
	b.ReportMetric(float64(size)/float64(len(evs)), "B/event")
	b.ReportAllocs()
	for b.Loop() {
		encode()
	}
}

// BenchmarkDecodeFrame measures what a Go processor spends per frame
// before its handler runs.
func BenchmarkDecodeFrame(b *testing.B) { benchmarkDecode(b, DecodeFrame) }

// BenchmarkDecodeFrameTrusted measures DecodeFrameTrusted, which skims the
// payloads instead of validating them.
func BenchmarkDecodeFrameTrusted(b *testing.B) {
	benchmarkDecode(b, func(data []byte) (*Frame, error) {
		f := new(Frame)
		return f, DecodeFrameTrusted(f, data)
	})
}

// BenchmarkDecodeFrameTrustedOneTime is BenchmarkDecodeFrameTrusted with
// one event_time for every event of the frame, as a page of records
// stamped to the second, or the firehose of ingestor-bench -mode real,
// has.
func BenchmarkDecodeFrameTrustedOneTime(b *testing.B) {
	benchmarkDecodeFrame(b, func(evs []Event) {
		for i := range evs {
			evs[i].EventTime = evs[0].EventTime
		}
	}, func(data []byte) (*Frame, error) {
		f := new(Frame)
		return f, DecodeFrameTrusted(f, data)
	})
}

// BenchmarkDecodeFrameStd measures the encoding/json decoder DecodeFrame
// replaced, for comparison.
func BenchmarkDecodeFrameStd(b *testing.B) { benchmarkDecode(b, decodeFrameStd) }

func benchmarkDecode(b *testing.B, decode func([]byte) (*Frame, error)) {
	benchmarkDecodeFrame(b, func([]Event) {}, decode)
}

// benchmarkDecodeFrame measures decode on benchFrame's frame, its events
// changed by change first.
func benchmarkDecodeFrame(b *testing.B, change func([]Event), decode func([]byte) (*Frame, error)) {
	evs, payloads := benchFrame()
	change(evs)
	var enc Encoder
	enc.Begin(42, 1, "s3://ingest-raw/prod")
	for i := range evs {
		enc.Add(&evs[i], payloads[i], true)
	}
	data := enc.End()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decode(data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/event")
}

// TestDecodeAckTruncatesReason sends a 100 kB reason: the nack applies
// with its first MaxReasonBytes bytes, not splitting a character.
func TestDecodeAckTruncatesReason(t *testing.T) {
	reason := "x" + strings.Repeat("é", 50_000) // é is 2 bytes: byte 1024 is inside one
	data, err := EncodeAck(Ack{Nacks: []Nack{{Frame: 1, Source: "s", Key: "k", Reason: reason, Permanent: true}}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := DecodeAck(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Nacks[0].Reason; got != reason[:MaxReasonBytes-1] || !a.Nacks[0].Permanent {
		t.Fatalf("reason of %d bytes, permanent %v; want the first %d bytes", len(got), a.Nacks[0].Permanent, MaxReasonBytes-1)
	}
}

// TestTrustedDecodeTakesPayloadsByLength: a trusted frame's payloads are
// taken by raw.len, aliasing the message; a raw.len that does not match
// its payload (shorter, longer, past the end) falls back to skimming, and
// the frame decodes as DecodeFrame decodes it.
func TestTrustedDecodeTakesPayloadsByLength(t *testing.T) {
	payloads := [][]byte{[]byte(`{"a":"},{","b":[1,2]}`), []byte(`"s\"}]"`), []byte(`-1.5e3`), []byte(`true`)}
	for _, delta := range []int{0, -1, 1, -3, 1000} {
		var enc Encoder
		enc.Begin(7, 1, "file:///r")
		for i, p := range payloads {
			ev := Event{Key: fmt.Sprint("k", i), Source: "s", Seq: int64(i + 1), FetchedAt: time.Unix(1, 0).UTC(),
				Raw: RawRef{Key: "r", Off: 0, Len: len(p) + delta}}
			enc.Add(&ev, p, true)
		}
		data := enc.End()
		want, err := DecodeFrame(data)
		if err != nil {
			t.Fatal(err)
		}
		var got Frame
		if err := DecodeFrameTrusted(&got, data); err != nil {
			t.Fatalf("raw.len off by %d: %v", delta, err)
		}
		for i := range payloads {
			if !bytes.Equal(got.Events[i].Payload, want.Events[i].Payload) || got.Events[i].Key != want.Events[i].Key {
				t.Errorf("raw.len off by %d: event %d payload %q key %q, want %q %q", delta, i,
					got.Events[i].Payload, got.Events[i].Key, want.Events[i].Payload, want.Events[i].Key)
			}
			if delta == 0 && !aliases(got.Events[i].Payload, data) {
				t.Errorf("event %d: payload taken by length is a copy", i)
			}
		}
	}
}
