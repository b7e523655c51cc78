package queue

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestVerdictStoredWithEvent appends a batch whose events carry a verdict
// beside one whose events carry none: the status look-up answers each
// new event's verdict (a duplicate keeps the first), none for the others,
// and Prune deletes the verdicts of the events it deletes.
func TestVerdictStoredWithEvent(t *testing.T) {
	q := openWindow(t, filepath.Join(t.TempDir(), "q.db"), 10, time.Nanosecond)
	ctx := t.Context()
	received := time.Date(2026, 11, 24, 21, 0, 0, 123, time.UTC)
	v := &Verdict{Scheme: "slack", Secret: 1, SignedAt: time.Unix(1531420618, 0).UTC(), ReceivedAt: received}
	signed := Batch{Source: "s", RawKey: "s/raw-0", FetchedAt: time.Now()}
	for i := range 25 {
		signed.Events = append(signed.Events, NewEvent{Key: "k" + strconv.Itoa(i), RawOff: i, RawLen: 1, Verdict: v})
	}
	frames, err := q.Append(ctx, signed)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := q.Append(ctx, Batch{Source: "s", RawKey: "s/raw-1", FetchedAt: time.Now(), Events: []NewEvent{
		{Key: "k0", Verdict: &Verdict{Scheme: "slack", Secret: 0, ReceivedAt: time.Now()}}, {Key: "plain", RawOff: 1, RawLen: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"k0", "k24"} {
		st, ok, err := q.EventByKey(ctx, "s", key)
		if err != nil || !ok || st.Verdict == nil || *st.Verdict != *v {
			t.Fatalf("EventByKey(%s) = %+v (ok %v, err %v), verdict %+v; want %+v", key, st, ok, err, st.Verdict, v)
		}
	}
	if st, ok, err := q.EventBySeq(ctx, "s", frames[2].Events[0].Seq); err != nil || !ok || st.Verdict == nil || st.Verdict.Secret != 1 {
		t.Fatalf("EventBySeq = %+v, %v, %v", st, ok, err)
	}
	if st, ok, err := q.EventByKey(ctx, "s", "plain"); err != nil || !ok || st.Verdict != nil {
		t.Fatalf("the unsigned event's status = %+v (ok %v, err %v), want no verdict", st, ok, err)
	}
	var stored int
	if err := q.rdb.QueryRowContext(ctx, `SELECT count(*) FROM event_verdicts`).Scan(&stored); err != nil || stored != 25 {
		t.Fatalf("%d verdicts stored (err %v), want one per new signed event: 25 (in statements of 16, 8 and 1 rows)", stored, err)
	}
	ids := make([]int64, 0, len(frames)+1)
	for _, f := range append(frames, plain...) {
		ids = append(ids, f.ID)
	}
	if _, err := q.Ack(ctx, ids, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Prune(ctx); err != nil || n != 0 { // empties the other, empty generation
		t.Fatalf("first prune forgot %d (err %v), want 0", n, err)
	}
	if n, err := q.Prune(ctx); err != nil || n != 26 {
		t.Fatalf("prune forgot %d (err %v), want the 26 acked", n, err)
	}
	var left int
	if err := q.rdb.QueryRowContext(ctx, `SELECT count(*) FROM event_verdicts`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d verdicts left after the prune (err %v), want 0", left, err)
	}
}
