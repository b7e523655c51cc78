package queue

import (
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestInsertStoresKeysAndNumbersExactly appends events whose keys JSON
// must escape (quotes, backslashes, HTML characters, non-ASCII) or cannot
// carry (control characters, invalid UTF-8: inserted one by one), with
// times and offsets at the ends of their ranges, and reads every row back
// as it was given. Appending them again finds every one a duplicate, and a
// batch mixing new and known keys gets seqs for the new ones only.
func TestInsertStoresKeysAndNumbersExactly(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	ctx := t.Context()
	keys := []string{`a"b`, `c\d`, "é☃", "<tag>&'", "😀 emoji", "tab\there", "\x01ctl", "bad\xffutf8", "plain", "x"}
	times := []time.Time{time.Unix(0, math.MaxInt64), time.Unix(-5, 7), {}, time.Unix(0, math.MinInt64+1), time.Unix(1764000000, 123)}
	b := Batch{Source: "src", FetchedAt: time.Now(), RawKey: "src/raw-1", Cursor: "c1", SetCursor: true}
	for i, k := range keys {
		b.Events = append(b.Events, NewEvent{Key: k, EventTime: times[i%len(times)], RawOff: math.MaxInt32 - i, RawLen: i, Payload: []byte(`{}`)})
	}
	frames, err := q.Append(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	var got int
	for _, f := range frames {
		got += len(f.Events)
	}
	if got != len(keys) {
		t.Fatalf("%d events in the frames, want %d", got, len(keys))
	}
	// Read back from the database (frame_log), not from the frames Append
	// returned.
	i := 0
	for _, fr := range frames {
		f, ok, err := q.LoadFrame(ctx, fr.ID)
		if err != nil || !ok {
			t.Fatalf("load frame %d: %v %v", fr.ID, ok, err)
		}
		for _, e := range f.Events {
			want := b.Events[i]
			var et int64
			if !e.EventTime.IsZero() {
				et = e.EventTime.UnixNano()
			}
			if e.Key != want.Key || et != eventTime(&want) || e.RawOff != want.RawOff || e.RawLen != want.RawLen {
				t.Errorf("event %d: key %q time %d off %d len %d, want %q %d %d %d", i, e.Key, et, e.RawOff, e.RawLen, want.Key, eventTime(&want), want.RawOff, want.RawLen)
			}
			i++
		}
	}
	if i != len(keys) {
		t.Fatalf("%d events read back, want %d", i, len(keys))
	}

	b.RawKey = "src/raw-2"
	frames, err = q.Append(ctx, b)
	if err != nil || len(frames) != 0 || q.Duplicates() != int64(len(keys)) {
		t.Fatalf("the same keys again: %d frames (%v), %d duplicates; want none and %d", len(frames), err, q.Duplicates(), len(keys))
	}

	mixed := Batch{Source: "src", FetchedAt: time.Now(), RawKey: "src/raw-3"}
	for i, k := range []string{"new-1", `a"b`, "new-2", "\x01ctl", "new-3", "plain"} {
		mixed.Events = append(mixed.Events, NewEvent{Key: k, RawOff: 100 * i, RawLen: 1})
	}
	frames, err = q.Append(ctx, mixed)
	if err != nil {
		t.Fatal(err)
	}
	var fresh []string
	for _, f := range frames {
		for _, e := range f.Events {
			fresh = append(fresh, e.Key)
			var key string
			if err := q.rdb.QueryRow(`SELECT key FROM events WHERE id = ?`, e.Seq).Scan(&key); err != nil || key != e.Key {
				t.Errorf("seq %d holds %q (%v), want %q", e.Seq, key, err, e.Key)
			}
		}
	}
	if want := []string{"new-1", "new-2", "new-3"}; !slices.Equal(fresh, want) {
		t.Errorf("new events %v, want %v", fresh, want)
	}
}

// TestLogEventRoundTrip decodes what appendLogEvent encodes, at the ends
// of every field's range, and refuses a cut or overlong blob.
func TestLogEventRoundTrip(t *testing.T) {
	first := int64(1000)
	in := []logEvent{
		{seq: 1000, eventTime: 0, rawOff: 0, rawLen: 0, key: ""},
		{seq: 1001, eventTime: math.MaxInt64, rawOff: math.MaxInt32, rawLen: 7, key: "a\x00b"},
		{seq: 1099, eventTime: math.MinInt64, rawOff: 12, rawLen: math.MaxInt32, key: "é☃ \xff"},
	}
	var b []byte
	for _, e := range in {
		b = appendLogEvent(b, first, e)
	}
	out, err := decodeLog(first, b)
	if err != nil || !slices.Equal(out, in) {
		t.Fatalf("decoded %+v (%v), want %+v", out, err, in)
	}
	for _, bad := range [][]byte{b[:len(b)-1], append(slices.Clip(b), 0x80)} {
		if _, err := decodeLog(first, bad); err == nil {
			t.Errorf("decodeLog(%d bytes) succeeded, want an error", len(bad))
		}
	}
}
