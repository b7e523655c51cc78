package sources

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

func openDemo(t *testing.T, name string, spec DemoSpec) Source {
	t.Helper()
	src, err := spec.Open(Env{Name: name, Timeout: time.Second})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := src.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return src
}

type demoEvent struct {
	ID  string `json:"id"`
	Seq uint64 `json:"seq"`
	TS  string `json:"ts"`
	Msg string `json:"msg"`
}

// checkDemoBatch checks that every record slices to its event and agrees
// with it, and returns the events.
func checkDemoBatch(t *testing.T, b *Batch) []demoEvent {
	t.Helper()
	spans, err := jsonscan.SplitArray(b.Body)
	if err != nil {
		t.Fatalf("body is not a JSON array: %v", err)
	}
	if len(spans) != len(b.Records) {
		t.Fatalf("body has %d elements, batch %d records", len(spans), len(b.Records))
	}
	events := make([]demoEvent, len(b.Records))
	for i, r := range b.Records {
		if spans[i].Off != r.Off || spans[i].Len != r.Len {
			t.Fatalf("record %d at %d+%d, element at %d+%d", i, r.Off, r.Len, spans[i].Off, spans[i].Len)
		}
		raw := b.Body[r.Off : r.Off+r.Len]
		ev := &events[i]
		if err := json.Unmarshal(raw, ev); err != nil {
			t.Fatalf("record %d %q: %v", i, raw, err)
		}
		if ev.ID != r.Key || strconv.FormatUint(ev.Seq, 10) != r.Cursor {
			t.Errorf("record %d: key %q cursor %q, event id %q seq %d", i, r.Key, r.Cursor, ev.ID, ev.Seq)
		}
		if ts, err := time.Parse(time.RFC3339Nano, ev.TS); err != nil || !ts.Equal(r.Time) {
			t.Errorf("record %d: time %v, event ts %q (%v)", i, r.Time, ev.TS, err)
		}
	}
	return events
}

func TestDemoFetch(t *testing.T) {
	src := openDemo(t, "demo", DemoSpec{EventsPerTick: 5, EventSize: 200})
	b, err := src.Fetch(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	events := checkDemoBatch(t, b)
	for i, ev := range events {
		if want := "demo-" + strconv.Itoa(i+1); ev.ID != want || ev.Seq != uint64(i+1) {
			t.Errorf("event %d is %s seq %d, want %s", i, ev.ID, ev.Seq, want)
		}
		if l := b.Records[i].Len; l != 200 {
			t.Errorf("event %d is %d bytes, want 200", i, l)
		}
	}
	if b.Cursor != "5" {
		t.Errorf("batch cursor %q, want 5", b.Cursor)
	}
	if b.FetchedAt.IsZero() {
		t.Error("FetchedAt not set")
	}

	b, err = src.Fetch(t.Context(), b.Cursor)
	if err != nil {
		t.Fatal(err)
	}
	if events := checkDemoBatch(t, b); events[0].ID != "demo-6" || b.Cursor != "10" {
		t.Errorf("second fetch starts at %s, cursor %q; want demo-6 and 10", events[0].ID, b.Cursor)
	}
}

func TestDemoIDsStableAcrossRestarts(t *testing.T) {
	spec := DemoSpec{EventsPerTick: 50, EventSize: 128}
	a, err := openDemo(t, "feed", spec).Fetch(t.Context(), "1000")
	if err != nil {
		t.Fatal(err)
	}
	b, err := openDemo(t, "feed", spec).Fetch(t.Context(), "1000")
	if err != nil {
		t.Fatal(err)
	}
	checkDemoBatch(t, a)
	checkDemoBatch(t, b)
	for i := range a.Records {
		if a.Records[i].Key != b.Records[i].Key || a.Records[i].Cursor != b.Records[i].Cursor {
			t.Errorf("record %d: %q/%q vs %q/%q", i, a.Records[i].Key, a.Records[i].Cursor, b.Records[i].Key, b.Records[i].Cursor)
		}
	}
	if a.Records[0].Key != "feed-1001" || a.Cursor != "1050" || b.Cursor != "1050" {
		t.Errorf("first key %q, cursors %q and %q; want feed-1001, 1050", a.Records[0].Key, a.Cursor, b.Cursor)
	}
}

func TestDemoSizes(t *testing.T) {
	for _, size := range []int{100, 256, 1000, 4096} {
		src := openDemo(t, "d", DemoSpec{EventsPerTick: 3, EventSize: size})
		b, err := src.Fetch(t.Context(), "99999999")
		if err != nil {
			t.Fatal(err)
		}
		checkDemoBatch(t, b)
		for _, r := range b.Records {
			if r.Len != size {
				t.Errorf("event size %d, want %d", r.Len, size)
			}
		}
	}
	// A name too long for the size gives events as small as they can be.
	long := strings.Repeat("n", 100)
	b, err := openDemo(t, long, DemoSpec{EventsPerTick: 2, EventSize: 64}).Fetch(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if events := checkDemoBatch(t, b); events[0].Msg != "" || events[0].ID != long+"-1" {
		t.Errorf("long name: event %+v", events[0])
	}
}

func TestDemoEscapesName(t *testing.T) {
	name := "we\"ird\\name\n"
	b, err := openDemo(t, name, DemoSpec{EventsPerTick: 2, EventSize: 64}).Fetch(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if events := checkDemoBatch(t, b); events[1].ID != name+"-2" {
		t.Errorf("id %q, want %q", events[1].ID, name+"-2")
	}
}

func TestDemoMalformedEvery(t *testing.T) {
	src := openDemo(t, "demo", DemoSpec{EventsPerTick: 2, EventSize: 64, MalformedEvery: 3})
	cursor := ""
	for fetch := 1; fetch <= 7; fetch++ {
		b, err := src.Fetch(t.Context(), cursor)
		if fetch%3 != 0 {
			if err != nil {
				t.Fatalf("fetch %d: %v", fetch, err)
			}
			checkDemoBatch(t, b)
			cursor = b.Cursor
			continue
		}
		m, ok := AsMalformed(err)
		if !ok || b != nil {
			t.Fatalf("fetch %d: got %v, %v; want a *MalformedError", fetch, b, err)
		}
		if json.Valid(m.Body) || m.FetchedAt.IsZero() || !strings.Contains(m.Reason, "unexpected end of input") {
			t.Errorf("fetch %d: malformed body %q at %v, reason %q", fetch, m.Body, m.FetchedAt, m.Reason)
		}
	}
	// Two malformed fetches did not advance anything: 5 good fetches of 2.
	if cursor != "10" {
		t.Errorf("cursor after 7 fetches is %q, want 10", cursor)
	}
}

func TestDemoErrors(t *testing.T) {
	src := openDemo(t, "demo", DemoSpec{EventsPerTick: 2, EventSize: 64})
	for _, cursor := range []string{"x", "-1", "18446744073709551615"} {
		if _, err := src.Fetch(t.Context(), cursor); err == nil || !strings.Contains(err.Error(), `source "demo": demo: cursor`) {
			t.Errorf("Fetch(%q) error %v", cursor, err)
		}
	}
	if _, err := (&DemoSpec{EventsPerTick: 0, EventSize: 64}).Open(Env{Name: "demo"}); err == nil {
		t.Error("Open accepted events_per_tick 0")
	}
	if errs := (&DemoSpec{EventsPerTick: 1_000_000, EventSize: 1 << 20}).Validate(); len(errs) != 1 {
		t.Errorf("Validate of a 1 TiB fetch: %v", errs)
	}
}

func BenchmarkDemoFetch(b *testing.B) {
	src, err := (&DemoSpec{EventsPerTick: 1000, EventSize: 256}).Open(Env{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(1000 * 256)
	b.ReportAllocs()
	cursor := ""
	for b.Loop() {
		batch, err := src.Fetch(b.Context(), cursor)
		if err != nil {
			b.Fatal(err)
		}
		cursor = batch.Cursor
	}
}
