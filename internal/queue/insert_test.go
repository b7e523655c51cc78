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
	rows, err := q.rdb.Query(`SELECT key, event_time, raw_off, raw_len FROM events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	for rows.Next() {
		var key string
		var et, off, n int64
		if err := rows.Scan(&key, &et, &off, &n); err != nil {
			t.Fatal(err)
		}
		want := b.Events[i]
		if key != want.Key || et != eventTime(&want) || off != int64(want.RawOff) || n != int64(want.RawLen) {
			t.Errorf("row %d: key %q time %d off %d len %d, want %q %d %d %d", i, key, et, off, n, want.Key, eventTime(&want), want.RawOff, want.RawLen)
		}
		i++
	}
	if err := rows.Close(); err != nil || i != len(keys) {
		t.Fatalf("%d rows (%v), want %d", i, err, len(keys))
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

// TestAppendNum reads every number back as insertFrame does.
func TestAppendNum(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	for _, v := range []int64{0, 1, -1, 42, -42, math.MaxInt64, math.MinInt64, 1764000000000000000} {
		b := appendNum(nil, v)
		if len(b) != numWidth {
			t.Fatalf("appendNum(%d) = %q: %d bytes, want %d", v, b, len(b), numWidth)
		}
		var got int64
		if err := q.rdb.QueryRow(`SELECT CAST(? AS INTEGER)`, b).Scan(&got); err != nil || got != v {
			t.Errorf("CAST(%q AS INTEGER) = %d (%v), want %d", b, got, err, v)
		}
	}
}
