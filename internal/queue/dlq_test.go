package queue

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestReplayDeadLetters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	q, err := Open(Options{Path: path, EventsPerFrame: 4, DedupeWindow: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	frames, err := q.Append(ctx, batch("a", 0, 4, ""))
	if err != nil {
		t.Fatal(err)
	}
	old := frames[0]
	if _, err := q.Ack(ctx, nil, []KeyAck{{Frame: old.ID, Source: "a", Key: "k0"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.DeadLetterFrame(ctx, old.ID, "not acked after 3 deliveries"); err != nil {
		t.Fatal(err)
	}
	if err := q.DeadLetter(ctx, "a", "malformed", "deadletter/a/x", ""); err != nil {
		t.Fatal(err)
	}
	all, err := q.DeadLetters(ctx, 10)
	if err != nil || len(all) != 4 {
		t.Fatalf("dead letters = %+v %v", all, err)
	}
	// Newer events arrive meanwhile; replay must not disturb them.
	if _, err := q.Append(ctx, batch("a", 10, 2, "")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := q.ReplayDeadLetters(ctx, DLQFilter{IDs: []int64{all[3].ID}}); !errors.Is(err, ErrPayloadDeadLetter) {
		t.Fatalf("replaying a payload dead letter: %v, want ErrPayloadDeadLetter", err)
	}
	n, fr, err := q.ReplayDeadLetters(ctx, DLQFilter{Source: "a"})
	if err != nil || n != 3 || len(fr) != 1 || len(fr[0].Events) != 3 || fr[0].ID <= old.ID {
		t.Fatalf("replay = %d %+v %v", n, fr, err)
	}
	if fr[0].Events[0].Seq <= old.Events[3].Seq || fr[0].Events[2].Seq-fr[0].Events[0].Seq != 2 {
		t.Fatalf("replayed seqs %+v not new and contiguous", fr[0].Events)
	}
	loaded, ok, err := q.LoadFrame(ctx, fr[0].ID)
	if err != nil || !ok || len(loaded.Events) != 3 || loaded.Deliveries != 0 || loaded.Events[0].Key != "k1" ||
		loaded.Events[0].RawKey != "a/raw-0" || loaded.Events[0].RawOff != 10 {
		t.Fatalf("replayed frame = %+v %v %v", loaded, ok, err)
	}
	active, err := q.DeadLetters(ctx, 10)
	if err != nil || len(active) != 1 || !active[0].IsPayload() {
		t.Fatalf("active after replay = %+v %v; want only the payload", active, err)
	}
	d, err := q.DeadLetterByID(ctx, all[0].ID)
	if err != nil || d.ReplayedAt.IsZero() || len(d.History) != 2 || d.History[1].Action != "replayed" {
		t.Fatalf("replayed entry = %+v %v", d, err)
	}
	withOld, err := q.ListDeadLetters(ctx, DLQFilter{IncludeReplayed: true})
	if err != nil || len(withOld) != 4 {
		t.Fatalf("list with replayed = %d %v", len(withOld), err)
	}
	// The replayed events are pending again: a re-fetch is a duplicate,
	// prune keeps them, an ack clears them, and a reopen keeps it all.
	if dup, err := q.Append(ctx, batch("a", 1, 1, "")); err != nil || len(dup) != 0 {
		t.Fatalf("re-fetch of a replayed event: %v %v", dup, err)
	}
	if _, err := q.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q = openTest(t, path, 4)
	if q.PendingFrames() != 2 || q.PendingEvents() != 5 {
		t.Fatalf("after reopen pending = %d frames %d events, want 2 and 5", q.PendingFrames(), q.PendingEvents())
	}
	loaded, ok, err = q.LoadFrame(ctx, fr[0].ID)
	if err != nil || !ok || len(loaded.Events) != 3 {
		t.Fatalf("replayed frame after prune and reopen = %+v %v %v", loaded, ok, err)
	}
	if cleared, err := q.Ack(ctx, []int64{fr[0].ID}, nil); err != nil || len(cleared) != 1 {
		t.Fatalf("ack replayed frame: %v %v", cleared, err)
	}
}

func TestListDeadLettersFilters(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 10)
	ctx := t.Context()
	for _, s := range []struct{ src, reason string }{{"a", "bad json"}, {"b", "bad json"}, {"a", "empty body"}} {
		if err := q.DeadLetter(ctx, s.src, s.reason, "deadletter/"+s.src, ""); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		f    DLQFilter
		want int
	}{
		{DLQFilter{}, 3},
		{DLQFilter{Source: "a"}, 2},
		{DLQFilter{Reason: "json"}, 2},
		{DLQFilter{Source: "a", Reason: "json"}, 1},
		{DLQFilter{Limit: 1}, 1},
		{DLQFilter{Since: time.Now().Add(time.Hour)}, 0},
		{DLQFilter{Until: time.Now().Add(time.Hour)}, 3},
	}
	for _, c := range cases {
		got, err := q.ListDeadLetters(ctx, c.f)
		if err != nil || len(got) != c.want {
			t.Errorf("list %+v = %d entries (err %v), want %d", c.f, len(got), err, c.want)
		}
	}
	first, err := q.ListDeadLetters(ctx, DLQFilter{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	rest, err := q.ListDeadLetters(ctx, DLQFilter{AfterID: first[0].ID})
	if err != nil || len(rest) != 2 {
		t.Fatalf("page after %d = %d %v", first[0].ID, len(rest), err)
	}
	if n, err := q.DropDeadLetters(ctx, DLQFilter{IDs: []int64{first[0].ID}}); err != nil || n != 1 {
		t.Fatalf("drop = %d %v", n, err)
	}
	if _, err := q.DeadLetterByID(ctx, first[0].ID); !errors.Is(err, ErrNoDeadLetter) {
		t.Fatalf("dropped entry by id: %v", err)
	}
}

func TestResolveDeadLetters(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	ctx := t.Context()
	for _, d := range []struct{ source, raw, cursor string }{
		{"a", "deadletter/a/1", "c1"},
		{"a", "deadletter/a/2", "c1"},
		{"a", "deadletter/a/3", "c2"},
		{"b", "deadletter/b/1", "c1"},
	} {
		if err := q.DeadLetter(ctx, d.source, "truncated", d.raw, d.cursor); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := q.ResolveDeadLetters(ctx, "a", "c1"); err != nil || n != 2 {
		t.Fatalf("resolve a/c1: %d, %v; want 2", n, err)
	}
	if n, err := q.ResolveDeadLetters(ctx, "a", "c1"); err != nil || n != 0 {
		t.Fatalf("resolve a/c1 again: %d, %v; want 0", n, err)
	}
	active, err := q.DeadLetters(ctx, 10)
	if err != nil || len(active) != 2 || active[0].RawKey != "deadletter/a/3" || active[1].RawKey != "deadletter/b/1" {
		t.Fatalf("active dead letters = %+v, %v; want a/3 and b/1", active, err)
	}
	if st, err := q.Stats(ctx); err != nil || st.DeadLetters != 2 {
		t.Errorf("stats count %d dead letters (%v), want 2", st.DeadLetters, err)
	}
	all, err := q.ListDeadLetters(ctx, DLQFilter{IncludeReplayed: true})
	if err != nil || len(all) != 4 || all[0].ResolvedAt.IsZero() || !all[2].ResolvedAt.IsZero() {
		t.Fatalf("all dead letters = %+v, %v; want 4, the first two resolved", all, err)
	}
	d, err := q.DeadLetterByID(ctx, all[0].ID)
	if err != nil || len(d.History) != 2 || d.History[1].Action != "resolved" {
		t.Fatalf("dead letter %d history = %+v, %v; want dead-lettered then resolved", all[0].ID, d.History, err)
	}
	// A resolved entry is no longer active: dropping everything leaves it.
	if n, err := q.DropDeadLetters(ctx, DLQFilter{Source: "a"}); err != nil || n != 1 {
		t.Errorf("drop a: %d, %v; want the one active entry", n, err)
	}
}

// TestSamePayloadDeadLetteredOnce: the same bytes from the same source
// (the content hash their raw keys end with), dead-lettered again while
// their entry is active, count on it (count, last seen, the latest reason
// and request) instead of adding one; other bytes, another source, and
// the same bytes once their entry was resolved each make an entry.
func TestSamePayloadDeadLetteredOnce(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	ctx := t.Context()
	const same = "0123456789abcdef0123456789abcdef"
	for _, d := range []struct{ source, raw, cursor, reason string }{
		{"a", "deadletter/a/2026/11/27/1000-" + same + ".json", "c1", "truncated"},
		{"a", "deadletter/a/2026/11/27/2000-" + same + ".json", "c1", "truncated"},
		{"a", "deadletter/a/2026/11/27/3000-" + same + ".json", "c2", "not JSON"},
		{"a", "deadletter/a/2026/11/27/4000-ffffffffffffffffffffffffffffffff.json", "c2", "not JSON"},
		{"b", "deadletter/b/2026/11/27/5000-" + same + ".json", "c1", "truncated"},
	} {
		if err := q.DeadLetter(ctx, d.source, d.reason, d.raw, d.cursor); err != nil {
			t.Fatal(err)
		}
	}
	all, err := q.ListDeadLetters(ctx, DLQFilter{IncludeReplayed: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 {
		t.Fatalf("%d entries, want 3 (the same bytes of a once, other bytes of a, b): %+v", len(all), all)
	}
	first := all[0]
	if first.Count != 3 || first.Reason != "not JSON" || !first.LastSeen.After(first.CreatedAt) || first.RawKey != "deadletter/a/2026/11/27/1000-"+same+".json" {
		t.Errorf("the repeated payload's entry: %+v; want count 3, the latest reason, last seen after created, the first raw key", first)
	}
	if all[1].Count != 1 || !all[1].LastSeen.Equal(all[1].CreatedAt) || all[2].Count != 1 || all[2].Source != "b" {
		t.Errorf("the single entries: %+v, %+v; want count 1 each, last seen = created", all[1], all[2])
	}
	// The entry took the latest request: a good fetch of c2 resolves it.
	if n, err := q.ResolveDeadLetters(ctx, "a", "c2"); err != nil || n != 2 {
		t.Fatalf("resolve a/c2: %d, %v; want both entries of a", n, err)
	}
	if err := q.DeadLetter(ctx, "a", "truncated", "deadletter/a/2026/11/27/6000-"+same+".json", "c3"); err != nil {
		t.Fatal(err)
	}
	if active, err := q.DeadLetters(ctx, 10); err != nil || len(active) != 2 || active[1].Count != 1 || active[1].Source != "a" {
		t.Errorf("after the resolve, the same bytes again: active %+v, %v; want a new entry beside b's", active, err)
	}
}
