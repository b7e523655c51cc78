package queue

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// keysBatch is a batch of source s with the given keys.
func keysBatch(s, raw string, keys ...string) Batch {
	b := Batch{Source: s, FetchedAt: time.Now(), RawKey: raw}
	for i, k := range keys {
		b.Events = append(b.Events, NewEvent{Key: k, RawOff: i, RawLen: 1})
	}
	return b
}

// appendNew appends b and returns how many of its events were new, and
// the frames.
func appendNew(t *testing.T, q *Queue, b Batch) (int, []Frame) {
	t.Helper()
	frames, err := q.Append(t.Context(), b)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range frames {
		n += len(f.Events)
	}
	return n, frames
}

// ackAll acks frames whole.
func ackAll(t *testing.T, q *Queue, frames []Frame) {
	t.Helper()
	ids := make([]int64, len(frames))
	for i, f := range frames {
		ids[i] = f.ID
	}
	if _, err := q.Ack(t.Context(), ids, nil); err != nil {
		t.Fatal(err)
	}
}

// prune runs Prune and checks how many events it forgot.
func prune(t *testing.T, q *Queue, want int64, why string) {
	t.Helper()
	if n, err := q.Prune(t.Context()); err != nil || n != want {
		t.Fatalf("prune forgot %d (err %v), want %d: %s", n, err, want, why)
	}
}

func seqKeys(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

// TestGenerationsRememberKeys drives the ledger's generations with a
// dedupe window of a nanosecond, so that every Prune switches when it
// may: a key is remembered across one switch (a re-fetch is a duplicate,
// counted on its row, looked up below the other generation's bound and
// not above it), forgotten at the second; a pending frame holds the
// switch back; the keys of dead letters survive it, and replay moves them;
// the state survives a reopen.
func TestGenerationsRememberKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	q, err := Open(Options{Path: path, EventsPerFrame: 4, DedupeWindow: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	a := seqKeys("a", 10)
	n, fa := appendNew(t, q, keysBatch("s", "s/raw-a", a...))
	if n != 10 {
		t.Fatalf("%d new of 10", n)
	}
	ackAll(t, q, fa)
	prune(t, q, 0, "the first switch empties the other generation, empty")

	// a is in the other generation now: duplicates, counted there. "a05x"
	// sits below its bound and is looked up; "b..." are above it.
	if n, _ := appendNew(t, q, keysBatch("s", "s/raw-a2", a...)); n != 0 {
		t.Fatalf("a re-fetch across one switch queued %d events, want none", n)
	}
	if got := attempts(t, q, "s", "a03"); got != 2 {
		t.Fatalf("attempts of a03 = %d, want 2", got)
	}
	if st, ok, err := q.EventByKey(ctx, "s", "a03"); err != nil || !ok || st.Status != StatusAcked || st.Received != 2 {
		t.Fatalf("status of a03 = %+v %v %v", st, ok, err)
	}
	b := append(seqKeys("b", 6), "a05x")
	n, fb := appendNew(t, q, keysBatch("s", "s/raw-b", b...))
	if n != len(b) {
		t.Fatalf("%d new of %d (keys above and below the bound, none known)", n, len(b))
	}
	ackAll(t, q, fb)
	before := q.LedgerGeneration()
	prune(t, q, 10, "the second switch forgets a")
	if q.Forgotten() != 10 || !q.LedgerGeneration().After(before) {
		t.Fatalf("after the second switch: Forgotten() = %d, generation since %v (before %v); want 10 and later", q.Forgotten(), q.LedgerGeneration(), before)
	}
	n, fa3 := appendNew(t, q, keysBatch("s", "s/raw-a3", a[:3]...))
	if n != 3 {
		t.Fatalf("a re-fetch after two switches queued %d of 3", n)
	}
	if n, _ := appendNew(t, q, keysBatch("s", "s/raw-b2", b...)); n != 0 {
		t.Fatalf("b re-fetched across one switch queued %d, want none", n)
	}

	// A pending frame of the generation a switch would empty holds it back.
	c := seqKeys("c", 4)
	_, fc := appendNew(t, q, keysBatch("s", "s/raw-c", c...))
	prune(t, q, 7, "b and a05x: c was queued in the current generation")
	prune(t, q, 0, "c is pending in the generation this switch would empty")
	if n, _ := appendNew(t, q, keysBatch("s", "s/raw-c2", c...)); n != 0 {
		t.Fatalf("pending c re-fetched queued %d", n)
	}

	ackAll(t, q, fa3)

	// Reopen: the generation state and the pending frame are kept.
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q, err = Open(Options{Path: path, EventsPerFrame: 4, DedupeWindow: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	if q.PendingEvents() != 4 {
		t.Fatalf("pending after reopen = %d, want 4", q.PendingEvents())
	}
	prune(t, q, 0, "c is still pending after the reopen")
	if n, _ := appendNew(t, q, keysBatch("s", "s/raw-c3", c...)); n != 0 {
		t.Fatalf("pending c re-fetched after reopen queued %d", n)
	}

	// Dead letters keep their keys through switches; replay moves them.
	if n, err := q.DeadLetterFrame(ctx, fc[0].ID, "poison"); err != nil || n != 4 {
		t.Fatalf("dead-lettered %d (%v)", n, err)
	}
	for range 3 {
		if _, err := q.Prune(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := appendNew(t, q, keysBatch("s", "s/raw-c4", c...)); n != 0 {
		t.Fatalf("dead c re-fetched after three switches queued %d", n)
	}
	replayed, frames, err := q.ReplayDeadLetters(ctx, DLQFilter{Source: "s"})
	if err != nil || replayed != 4 || len(frames) != 1 || frames[0].Events[0].RawKey != "s/raw-c" {
		t.Fatalf("replay = %d %+v %v", replayed, frames, err)
	}
	f, ok, err := q.LoadFrame(ctx, frames[0].ID)
	if err != nil || !ok || len(f.Events) != 4 || f.Events[3].Key != "c03" || f.Events[3].RawOff != 3 || f.Events[0].Seq <= fc[0].Events[3].Seq {
		t.Fatalf("replayed frame read back = %+v %v %v", f, ok, err)
	}
	if st, ok, err := q.EventBySeq(ctx, "s", f.Events[0].Seq); err != nil || !ok || st.Key != "c00" || st.Status != StatusQueued {
		t.Fatalf("status of the replayed c00 = %+v %v %v", st, ok, err)
	}
}

// TestPruneKeepsWhatStillNeedsIt checks what a switch deletes beside the
// keys: raw-object rows, trace contexts and verdicts of forgotten events
// go, those of remembered or dead ones stay.
func TestPruneKeepsWhatStillNeedsIt(t *testing.T) {
	q := openWindow(t, filepath.Join(t.TempDir(), "q.db"), 4, time.Nanosecond)
	ctx := t.Context()
	old := keysBatch("s", "s/raw-old", seqKeys("o", 4)...)
	old.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	_, fo := appendNew(t, q, old)
	_, fd := appendNew(t, q, keysBatch("s", "s/raw-dead", "d0"))
	ackAll(t, q, fo)
	if _, err := q.DeadLetterFrame(ctx, fd[0].ID, "poison"); err != nil {
		t.Fatal(err)
	}
	prune(t, q, 0, "first switch")
	prune(t, q, 4, "the old batch is forgotten, the dead event kept")
	var raws []string
	rows, err := q.rdb.QueryContext(ctx, `SELECT key FROM raw_objects ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		raws = append(raws, k)
	}
	if err := rows.Close(); err != nil || len(raws) != 1 || raws[0] != "s/raw-dead" {
		t.Fatalf("raw objects after the switch = %v (%v), want only the dead event's", raws, err)
	}
	dl, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dl) != 1 || dl[0].RawKey != "s/raw-dead" || dl[0].RawLen != 1 {
		t.Fatalf("dead letter after the switch = %+v %v", dl, err)
	}
	if st, ok, err := q.EventByKey(context.Background(), "s", "d0"); err != nil || !ok || st.Status != StatusDeadLettered || st.CreatedAt.IsZero() {
		t.Fatalf("status of the dead event after the switch = %+v %v %v", st, ok, err)
	}
}

// TestMigrateLedgerFromV9 fills a database of the schema before the
// ledger generations (v9) by hand, as that schema's queue left it (an
// acked frame, a pending frame with a key-acked event and a nacked one,
// a dead event in an active dead letter) and opens it: the migration
// keeps the pending events and their marks, the dead letter's raw
// reference, every key as a duplicate with its attempts, and the seq and
// frame counters.
func TestMigrateLedgerFromV9(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	if err := migrateTo(db, 0, 9); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`INSERT INTO raw_objects(id, key, fetched_at, seq_floor) VALUES (1, 'a/raw-1', 1000, 1), (2, 'a/raw-2', 2000, 4)`,
		// Frame 1 (seqs 1-3) was acked whole: its row is gone.
		`INSERT INTO events(id, source, key, frame_id, event_time, raw_id, raw_off, raw_len, acked, attempts) VALUES
			(1, 'a', 'k1', 1, 0, 1, 0, 10, 0, 3), (2, 'a', 'k2', 1, 0, 1, 10, 10, 0, 1), (3, 'a', 'k3', 1, 0, 1, 20, 10, 0, 1)`,
		// Frame 2 (seqs 4-7): k4 acked by key, k5 nacked, k6 dead, k7 pending.
		`INSERT INTO events(id, source, key, frame_id, event_time, raw_id, raw_off, raw_len, acked, dead, last_error) VALUES
			(4, 'a', 'k4', 2, 0, 2, 0, 5, 1, 0, ''), (5, 'a', 'k5', 2, 77, 2, 5, 5, 0, 0, 'busy'),
			(6, 'a', 'k6', 2, 0, 2, 10, 5, 1, 1, ''), (7, 'a', 'k7', 2, 0, 2, 15, 5, 0, 0, '')`,
		`INSERT INTO frames(id, source, n, first_seq, last_seq, deliveries, created_at) VALUES (2, 'a', 2, 4, 7, 1, 2000)`,
		`INSERT INTO dead_letters(source, reason, raw_key, frame_id, created_at, seq, event_key) VALUES ('a', 'poison', 'a/raw-2', 2, 2000, 6, 'k6')`,
		`UPDATE sqlite_sequence SET seq = 9 WHERE name = 'events'`,
		`UPDATE meta SET value = 5 WHERE key = 'frame_high'`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	var logged bytes.Buffer
	q, err := Open(Options{Path: path, EventsPerFrame: 10, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	if !strings.Contains(logged.String(), "upgrading the queue's ledger") || !strings.Contains(logged.String(), "events=7") {
		t.Errorf("the migration logged %q, want its announcement with the 7 events", logged.String())
	}
	ctx := t.Context()
	if q.PendingEvents() != 2 || q.PendingFrames() != 1 {
		t.Fatalf("pending = %d events in %d frames, want 2 in 1", q.PendingEvents(), q.PendingFrames())
	}
	f, ok, err := q.LoadFrame(ctx, 2)
	if err != nil || !ok || len(f.Events) != 2 || f.Events[0].Key != "k5" || f.Events[0].EventTime.UnixNano() != 77 ||
		f.Events[1].Key != "k7" || f.Events[1].RawKey != "a/raw-2" || f.Events[1].RawOff != 15 || f.Deliveries != 1 {
		t.Fatalf("pending frame after the migration = %+v %v %v", f, ok, err)
	}
	if st, ok, err := q.EventByKey(ctx, "a", "k5"); err != nil || !ok || st.LastError != "busy" || st.Status != StatusDelivered {
		t.Fatalf("status of k5 = %+v %v %v", st, ok, err)
	}
	if st, ok, err := q.EventByKey(ctx, "a", "k1"); err != nil || !ok || st.Status != StatusAcked || st.Received != 3 || st.CreatedAt.UnixNano() != 1000 {
		t.Fatalf("status of k1 = %+v %v %v", st, ok, err)
	}
	dl, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dl) != 1 || dl[0].Key != "k6" || dl[0].RawOff != 10 || dl[0].RawLen != 5 {
		t.Fatalf("dead letters = %+v %v", dl, err)
	}
	if n, fr := appendNew(t, q, keysBatch("a", "a/raw-3", "k1", "k4", "k6", "k7", "k8")); n != 1 || fr[0].Events[0].Seq <= 9 || fr[0].ID <= 5 {
		t.Fatalf("after the migration: %d new, frames %+v; want only k8, with a seq above 9 and a frame id above 5", n, fr)
	}
	if got := attempts(t, q, "a", "k1"); got != 4 {
		t.Fatalf("attempts of k1 = %d, want 4", got)
	}
	var n int
	if err := q.rdb.QueryRow(`SELECT count(*) FROM events WHERE source = 'a'`).Scan(&n); err != nil || n != 8 {
		t.Fatalf("the events view holds %d rows (err %v), want 8", n, err)
	}
}
