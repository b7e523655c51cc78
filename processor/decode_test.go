package processor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/wire"
)

// BenchmarkDecode measures what Run spends on a received message before
// a worker takes it: decoding a frame of 100 events of about 500 B of JSON
// each, the daemon's default frame size, and building the events the
// Handler sees.
func BenchmarkDecode(b *testing.B) {
	c, err := New(Options{Endpoint: "tcp://127.0.0.1:1", AckEndpoint: "tcp://127.0.0.1:2"})
	if err != nil {
		b.Fatal(err)
	}
	const events = 100
	fetched := time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)
	var enc wire.Encoder
	enc.Begin(42, 1, "s3://ingest-raw/prod")
	for i := range events {
		ev := wire.Event{
			Key:       fmt.Sprintf("evt-%08d", i),
			Source:    "github",
			Seq:       int64(1_000_000 + i),
			FetchedAt: fetched,
			EventTime: fetched.Add(-time.Duration(i) * time.Second),
			Raw:       wire.RawRef{Key: "github/2024/05/01/100000-000042.json", Off: i * 500, Len: len(benchPayload(i))},
		}
		enc.Add(&ev, benchPayload(i), true)
	}
	msg := enc.End()
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	var wf wire.Frame
	var f frame // recycled, as with Options.RecycleFrames
	for b.Loop() {
		if !c.decode(&wf, msg, 1) {
			b.Fatal("frame not decoded")
		}
		fillFrame(&f, &wf)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
}

// benchPayload returns the payload of event i of a benchmark: a JSON
// record of about 500 B, typical of an upstream API item.
func benchPayload(i int) []byte {
	p := fmt.Appendf(nil, `{"id":"evt-%08d","type":"PushEvent","actor":{"id":%d,"login":"user-%d"},"payload":{"ref":"refs/heads/main","size":3,"commits":[`, i, i, i)
	for len(p) < 470 {
		p = append(p, `{"sha":"0123456789abcdef"},`...)
	}
	return append(p[:len(p)-1], `]},"public":true}`...)
}

// TestDecodeCarriesEveryField decodes a frame whose events fill every
// field: the events the Handler sees match the protocol's events field
// for field, JSON encoding included, and their payloads are the bytes of
// the message, not copies; each carries its frame's delivery number.
func TestDecodeCarriesEveryField(t *testing.T) {
	c, err := New(Options{Endpoint: "tcp://127.0.0.1:1", AckEndpoint: "tcp://127.0.0.1:2"})
	if err != nil {
		t.Fatal(err)
	}
	// Delivery and Member, the frame's, are the fields Event has beyond
	// wire.Event.
	if pt, wt := reflect.TypeFor[Event](), reflect.TypeFor[wire.Event](); pt.NumField() != wt.NumField()+2 {
		t.Fatalf("Event has %d fields, wire.Event %d: convert the new ones in fillFrame", pt.NumField(), wt.NumField())
	}
	at := time.Date(2024, 5, 1, 10, 0, 0, 123, time.UTC)
	sent := []wire.Event{
		{Key: "k1", Source: "gh", Seq: 7, FetchedAt: at, EventTime: at.Add(-time.Hour), Raw: wire.RawRef{Key: "obj", Off: 3, Len: 9}},
		{Key: "k2", Source: "gl", Seq: 8, FetchedAt: at, Raw: wire.RawRef{Key: "obj2", Off: 0, Len: 2}},
	}
	var enc wire.Encoder
	enc.SetMember("m7")
	enc.Begin(42, 3, "file:///raw")
	enc.Add(&sent[0], []byte(`{"a":1}`), true)
	enc.Add(&sent[1], []byte{0, 0xff}, false)
	msg := enc.End()
	var wf wire.Frame
	if !c.decode(&wf, msg, 1) {
		t.Fatal("frame not decoded")
	}
	f := new(frame)
	fillFrame(f, &wf)
	want, err := wire.DecodeFrame(msg)
	if err != nil {
		t.Fatal(err)
	}
	if f.id != 42 || f.delivery != 3 || len(f.events) != len(want.Events) {
		t.Fatalf("frame %d delivery %d with %d events, want 42, 3, %d", f.id, f.delivery, len(f.events), len(want.Events))
	}
	for i := range f.events {
		if f.events[i].Delivery != 3 || f.events[i].Member != "m7" {
			t.Errorf("event %d: delivery %d, member %q, want its frame's, 3 and m7", i, f.events[i].Delivery, f.events[i].Member)
		}
		got, err := json.Marshal(&f.events[i])
		if err != nil {
			t.Fatal(err)
		}
		w, err := json.Marshal(&want.Events[i])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, w) {
			t.Errorf("event %d: %s, want %s", i, got, w)
		}
	}
	if p, off := f.events[0].Data(), bytes.Index(msg, []byte(`{"a":1}`)); string(p) != `{"a":1}` || off < 0 || &p[0] != &msg[off] {
		t.Errorf("JSON payload %q: want the message's own bytes", p)
	}
	if p := f.events[1].Data(); !bytes.Equal(p, []byte{0, 0xff}) {
		t.Errorf("base64 payload %q, want 00 ff", p)
	}
	if f.events[0].EventTime != at.Add(-time.Hour) || !f.events[1].EventTime.IsZero() {
		t.Errorf("event times %v and %v", f.events[0].EventTime, f.events[1].EventTime)
	}
	for i := range wf.Events {
		if !reflect.ValueOf(wf.Events[i]).IsZero() {
			t.Errorf("decoding buffer still holds event %d: %+v", i, wf.Events[i])
		}
	}
}

// TestTrustedAndValidatedDecoding: by default the client trusts the
// daemon's payloads and decodes one with invalid JSON (which the daemon
// never sends) without noticing; with ValidatePayloads it drops that
// frame as malformed. A valid frame decodes the same either way.
func TestTrustedAndValidatedDecoding(t *testing.T) {
	msg := func(payload string) []byte {
		var enc wire.Encoder
		enc.Begin(3, 1, "file:///r")
		ev := wire.Event{Key: "k", Source: "s", Seq: 1, FetchedAt: time.Unix(1, 0).UTC(), Raw: wire.RawRef{Key: "r", Len: len(payload)}}
		enc.Add(&ev, []byte(payload), true)
		return bytes.Clone(enc.End())
	}
	for _, validate := range []bool{false, true} {
		c, err := New(Options{Endpoint: "tcp://127.0.0.1:1", AckEndpoint: "tcp://127.0.0.1:2", ValidatePayloads: validate})
		if err != nil {
			t.Fatal(err)
		}
		var wf wire.Frame
		if !c.decode(&wf, msg(`{"a":[1,2]}`), 1) || string(wf.Events[0].Payload) != `{"a":[1,2]}` {
			t.Fatalf("validate=%v: valid frame decoded as %+v", validate, wf)
		}
		ok := c.decode(&wf, msg(`{"a":[1,,2]}`), 1)
		switch {
		case validate && (ok || c.malformed.Load() != 1):
			t.Errorf("ValidatePayloads: an invalid payload was not dropped as malformed")
		case !validate && (!ok || string(wf.Events[0].Payload) != `{"a":[1,,2]}`):
			t.Errorf("trusting: the frame was not decoded as it came: %+v", wf)
		}
	}
}
