package queue

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// TestAnOldDeadLetterPinsOnlyItsOwnRows: a dead letter nobody handles for
// weeks must not keep every newer raw-object row, trace context and
// verdict in queue.db. One event of the first batch is dead-lettered;
// then batch after batch (each with a raw object, a trace context and a
// verdict per event) is acked and forgotten by the generation switch.
// The three tables must stay as small as the last two generations plus
// the dead event's rows, whatever the number of batches, and the dead
// letter must still replay from its raw object. Before, Prune deleted
// only below the oldest dead event, so they grew by a row per batch (and
// per event) for as long as the dead letter stayed.
func TestAnOldDeadLetterPinsOnlyItsOwnRows(t *testing.T) {
	q := openWindow(t, filepath.Join(t.TempDir(), "q.db"), 4, time.Nanosecond)
	ctx := t.Context()
	v := &Verdict{Scheme: "github", Secret: 0, ReceivedAt: time.Now().UTC()}
	signed := func(from int) Batch {
		b := batch("a", from, 4, "")
		for i := range b.Events {
			b.Events[i].Verdict = v
			b.Events[i].Traceparent = fmt.Sprintf("00-%032x-%016x-01", from+i+1, from+i+1)
		}
		return b
	}
	frames, err := q.Append(ctx, signed(0))
	if err != nil {
		t.Fatal(err)
	}
	first := frames[0]
	var acks []KeyAck
	for _, e := range first.Events[1:] {
		acks = append(acks, KeyAck{Frame: first.ID, Source: "a", Key: e.Key})
	}
	if _, err := q.Ack(ctx, nil, acks); err != nil {
		t.Fatal(err)
	}
	if _, err := q.DeadLetterFrame(ctx, first.ID, "not acked after 3 deliveries"); err != nil {
		t.Fatal(err)
	}
	count := func(table string) int {
		var n int
		if err := q.rdb.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const rounds = 30
	for round := 1; round <= rounds; round++ {
		frames, err := q.Append(ctx, signed(round*10))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.Ack(ctx, []int64{frames[0].ID}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := q.Prune(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The dead event's rows, and at most the two generations' batches.
	for table, most := range map[string]int{"raw_objects": 1 + 2, "event_traces": 1 + 2*4, "event_verdicts": 1 + 2*4} {
		if n := count(table); n > most {
			t.Errorf("%s holds %d rows after %d acked and forgotten batches behind one dead letter, want at most %d", table, n, rounds, most)
		}
	}
	dead := first.Events[0].Seq
	for _, table := range []string{"event_traces", "event_verdicts"} {
		var n int
		if err := q.rdb.QueryRowContext(ctx, `SELECT count(*) FROM `+table+` WHERE seq = ?`, dead).Scan(&n); err != nil || n != 1 {
			t.Errorf("%s has %d rows of the dead event (err %v), want its 1", table, n, err)
		}
	}
	t.Logf("after %d batches: raw_objects %d, event_traces %d, event_verdicts %d rows", rounds, count("raw_objects"), count("event_traces"), count("event_verdicts"))
	_, replayed, err := q.ReplayDeadLetters(ctx, DLQFilter{Source: "a"})
	if err != nil || len(replayed) != 1 || len(replayed[0].Events) != 1 {
		t.Fatalf("replaying the old dead letter: %+v, %v", replayed, err)
	}
	loaded, ok, err := q.LoadFrame(ctx, replayed[0].ID)
	if err != nil || !ok || len(loaded.Events) != 1 || loaded.Events[0].Key != "k0" || loaded.Events[0].RawKey != "a/raw-0" || loaded.Events[0].RawOff != 0 {
		t.Fatalf("the replayed frame = %+v (ok %v, err %v), want k0 from a/raw-0 at 0", loaded, ok, err)
	}
}

// TestExpireDeadLettersKeepsActiveOnes: a replayed and a resolved dead
// letter are deleted once they have been inactive past the cutoff, and
// their raw objects are no longer in use; an active one stays, however
// old.
func TestExpireDeadLettersKeepsActiveOnes(t *testing.T) {
	q := openWindow(t, filepath.Join(t.TempDir(), "q.db"), 4, time.Hour)
	ctx := t.Context()
	frames, err := q.Append(ctx, batch("a", 0, 2, ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.DeadLetterFrame(ctx, frames[0].ID, "poison"); err != nil {
		t.Fatal(err)
	}
	for _, dl := range []struct{ raw, cursor string }{{"deadletter/a/resolved", "c1"}, {"deadletter/a/active", "c2"}} {
		if err := q.DeadLetter(ctx, "a", "malformed", dl.raw, dl.cursor); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := q.ResolveDeadLetters(ctx, "a", "c1"); err != nil || n != 1 {
		t.Fatalf("resolve = %d, %v", n, err)
	}
	if _, _, err := q.ReplayDeadLetters(ctx, DLQFilter{Source: "a", Reason: "poison"}); err != nil {
		t.Fatal(err)
	}
	inUse := func() map[string]bool {
		keys, err := q.RawKeysInUse(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	if keys := inUse(); !keys["deadletter/a/resolved"] || !keys["deadletter/a/active"] {
		t.Fatalf("raw keys in use before expiry = %v, want both payload dead letters'", keys)
	}
	if n, err := q.ExpireDeadLetters(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("expiring what turned inactive over an hour ago: %d, %v; want none", n, err)
	}
	if n, err := q.ExpireDeadLetters(ctx, time.Now().Add(time.Second)); err != nil || n != 3 {
		t.Fatalf("expiring every inactive one: %d, %v; want the 2 replayed events' entries and the resolved payload", n, err)
	}
	all, err := q.ListDeadLetters(ctx, DLQFilter{IncludeReplayed: true})
	if err != nil || len(all) != 1 || all[0].RawKey != "deadletter/a/active" {
		t.Fatalf("dead letters after expiry = %+v, %v; want only the active one", all, err)
	}
	if keys := inUse(); keys["deadletter/a/resolved"] || !keys["deadletter/a/active"] {
		t.Fatalf("raw keys in use after expiry = %v, want the active one's only", keys)
	}
}
