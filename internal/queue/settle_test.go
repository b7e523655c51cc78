package queue

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLedgerCountsDuplicateArrivals(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	ctx := t.Context()
	if _, err := q.Append(ctx, batch("a", 0, 6, "")); err != nil {
		t.Fatal(err)
	}
	// All duplicates: the fast path inserts nothing.
	if fr, err := q.Append(ctx, batch("a", 0, 2, "")); err != nil || len(fr) != 0 {
		t.Fatalf("append: %v %v", fr, err)
	}
	// Mixed: k4 and k5 are known, k6 and k7 new.
	fr, err := q.Append(ctx, batch("a", 4, 4, ""))
	if err != nil || len(fr) != 1 || len(fr[0].Events) != 2 {
		t.Fatalf("append mixed: %+v %v", fr, err)
	}
	want := map[string]int{"k0": 2, "k1": 2, "k2": 1, "k3": 1, "k4": 2, "k5": 2, "k6": 1, "k7": 1}
	for k, w := range want {
		if got := attempts(t, q, "a", k); got != w {
			t.Errorf("attempts of %s = %d, want %d", k, got, w)
		}
	}
	if k, ok, err := lookupKey(t.Context(), q.rdb, "a", "k4"); err != nil || !ok || k.lastSeen == 0 {
		t.Errorf("last_seen of k4 = %d (ok %v, err %v), want set", k.lastSeen, ok, err)
	}
	if got := q.Duplicates(); got != 4 {
		t.Errorf("Duplicates() = %d, want 4", got)
	}
	// Another source's key is not the same event.
	if _, err := q.Append(ctx, batch("b", 0, 1, "")); err != nil {
		t.Fatal(err)
	}
	if got := attempts(t, q, "a", "k0"); got != 2 {
		t.Errorf("attempts of a/k0 = %d after b/k0 arrived, want 2", got)
	}
}

func TestPermanentNackDeadLettersOnlyThatEvent(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 3)
	ctx := t.Context()
	frames, err := q.Append(ctx, batch("a", 0, 6, "")) // (k0 k1 k2) (k3 k4 k5)
	if err != nil {
		t.Fatal(err)
	}
	f0 := frames[0].ID
	res, err := q.Settle(ctx, nil, []KeyAck{{Frame: f0, Source: "a", Key: "k0"}}, []NackInput{
		{Frame: f0, Source: "a", Key: "k1", Reason: "schema violation", Permanent: true},
		{Frame: f0, Source: "a", Key: "k2", Reason: "db down"},
		{Frame: f0, Source: "a", Key: "nope", Reason: "x", Permanent: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.DeadLettered != 1 || res.Retryable != 1 || res.Unknown != 1 || len(res.Cleared) != 0 {
		t.Fatalf("settled = %+v", res)
	}
	f, ok, err := q.LoadFrame(ctx, f0)
	if err != nil || !ok || len(f.Events) != 1 || f.Events[0].Key != "k2" {
		t.Fatalf("frame after nack = %+v %v %v; want only k2 left", f, ok, err)
	}
	dl, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dl) != 1 || dl[0].Key != "k1" || dl[0].Reason != "schema violation" || dl[0].Frame != f0 || dl[0].RawLen != 10 {
		t.Fatalf("dead letters = %+v %v", dl, err)
	}
	// The last event's permanent nack clears the frame, like an ack.
	cleared, err := q.Nack(ctx, []NackInput{{Frame: f0, Source: "a", Key: "k2", Reason: "still bad", Permanent: true}})
	if err != nil || !slices.Equal(cleared, []int64{f0}) {
		t.Fatalf("cleared = %v %v, want [%d]", cleared, err, f0)
	}
	if q.PendingEvents() != 3 || q.PendingFrames() != 1 {
		t.Fatalf("pending = %d events %d frames, want 3 and 1", q.PendingEvents(), q.PendingFrames())
	}
	d, err := q.DeadLetterByID(ctx, dl[0].ID)
	if err != nil || len(d.History) != 1 || d.History[0].Action != "dead-lettered" {
		t.Fatalf("dead letter by id = %+v %v", d, err)
	}
	// Late acks and nacks of what is gone are counted, not errors.
	res, err = q.Settle(ctx, []int64{f0, 9999}, []KeyAck{{Frame: f0, Source: "a", Key: "k2"}},
		[]NackInput{{Frame: f0, Source: "a", Key: "k2", Reason: "again"}})
	if err != nil || res.Unknown != 4 || len(res.Cleared) != 0 {
		t.Fatalf("late settle = %+v %v", res, err)
	}
}

func TestDeadLetterFrameKeepsLastError(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 3)
	ctx := t.Context()
	frames, err := q.Append(ctx, batch("a", 0, 3, ""))
	if err != nil {
		t.Fatal(err)
	}
	id := frames[0].ID
	if _, err := q.Ack(ctx, nil, []KeyAck{{Frame: id, Source: "a", Key: "k0"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Nack(ctx, []NackInput{{Frame: id, Source: "a", Key: "k1", Reason: "upstream 503"}}); err != nil {
		t.Fatal(err)
	}
	n, err := q.DeadLetterFrame(ctx, id, "not acked after 5 deliveries")
	if err != nil || n != 2 {
		t.Fatalf("dead-lettered %d (err %v), want the 2 remaining", n, err)
	}
	dl, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dl) != 2 {
		t.Fatalf("dead letters = %+v %v", dl, err)
	}
	if dl[0].Key != "k1" || !strings.Contains(dl[0].Reason, "not acked after 5 deliveries") || !strings.Contains(dl[0].Reason, "upstream 503") {
		t.Errorf("k1 dead letter = %+v, want the reason and the last error", dl[0])
	}
	if dl[1].Key != "k2" || dl[1].Reason != "not acked after 5 deliveries" {
		t.Errorf("k2 dead letter = %+v", dl[1])
	}
	if q.PendingEvents() != 0 || q.PendingFrames() != 0 {
		t.Fatalf("pending = %d/%d, want 0", q.PendingEvents(), q.PendingFrames())
	}
}

// TestNackWinsInOneSettle checks Settle's rule: a nack wins over every ack
// of its event settled with it, in any order.
func TestNackWinsInOneSettle(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	ctx := t.Context()
	frames, err := q.Append(ctx, batch("a", 0, 8, "")) // (k0 k1 k2 k3) (k4 k5 k6 k7)
	if err != nil {
		t.Fatal(err)
	}
	f0, f1 := frames[0].ID, frames[1].ID
	res, err := q.Settle(ctx, []int64{f0, f1, f0},
		[]KeyAck{{Frame: f0, Source: "a", Key: "k1"}, {Frame: f1, Source: "a", Key: "k5"}},
		[]NackInput{
			{Frame: f0, Source: "a", Key: "k1", Reason: "bad", Permanent: true},
			{Frame: f0, Source: "a", Key: "k2", Reason: "later"},
			{Frame: f1, Source: "a", Key: "k5", Reason: "bad too", Permanent: true},
			{Frame: f1, Source: "a", Key: "k5", Reason: "retry"}, // the permanent one wins
		})
	if err != nil {
		t.Fatal(err)
	}
	// f0: k0 and k3 acked by the frame ack, k1 dead, k2 pending; f1: k5
	// dead, the rest acked, so the frame is cleared.
	want := Settled{Cleared: []int64{f1}, DeadLettered: 2, Unknown: 2, Overridden: 5}
	if !slices.Equal(res.Cleared, want.Cleared) || res.DeadLettered != 2 || res.Retryable != 1 || res.Unknown != 2 || res.Overridden != 5 {
		t.Fatalf("settled = %+v, want %+v and 1 retryable", res, want)
	}
	f, ok, err := q.LoadFrame(ctx, f0)
	if err != nil || !ok || len(f.Events) != 1 || f.Events[0].Key != "k2" {
		t.Fatalf("frame %d = %+v %v %v, want only k2 pending", f0, f, ok, err)
	}
	if q.PendingEvents() != 1 || q.PendingFrames() != 1 {
		t.Fatalf("pending = %d events %d frames, want 1 and 1", q.PendingEvents(), q.PendingFrames())
	}
	dl, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dl) != 2 || dl[0].Key != "k1" || dl[0].Reason != "bad" || dl[1].Key != "k5" || dl[1].Reason != "bad too" {
		t.Fatalf("dead letters = %+v %v", dl, err)
	}
	// A later frame ack clears k2: it may be for a later delivery.
	res, err = q.Settle(ctx, []int64{f0}, nil, nil)
	if err != nil || !slices.Equal(res.Cleared, []int64{f0}) || q.PendingEvents() != 0 {
		t.Fatalf("settled = %+v %v, pending %d; want %d cleared", res, err, q.PendingEvents(), f0)
	}
}

// BenchmarkSettleMaximalAck settles one ack of wire.MaxAckEntries (16384)
// entries of each kind, none of which names a pending event: the work one
// processor can make the daemon do with a single message. Frames of 100
// events are pending, so that nacks naming them look into them.
func BenchmarkSettleMaximalAck(b *testing.B) {
	const entries = 16384
	q := openTest(b, filepath.Join(b.TempDir(), "q.db"), 100)
	ctx := b.Context()
	frames, err := q.Append(ctx, batch("a", 0, 1000, ""))
	if err != nil {
		b.Fatal(err)
	}
	known := frames[0].ID
	ids := make([]int64, entries)
	keys := make([]KeyAck, entries)
	nacks := make([]NackInput, entries)
	for i := range entries {
		ids[i] = int64(1_000_000 + i)
		keys[i] = KeyAck{Frame: known, Source: "a", Key: fmt.Sprintf("unknown-%d", i)}
		nacks[i] = NackInput{Frame: known, Source: "a", Key: keys[i].Key, Reason: "x"}
	}
	perm := slices.Clone(nacks)
	for i := range perm {
		perm[i].Permanent = true
	}
	for _, bc := range []struct {
		name   string
		frames []int64
		keys   []KeyAck
		nacks  []NackInput
	}{
		{"frames", ids, nil, nil},
		{"keys", nil, keys, nil},
		{"retryable-nacks", nil, nil, nacks},
		{"permanent-nacks", nil, nil, perm},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				res, err := q.Settle(ctx, bc.frames, bc.keys, bc.nacks)
				if err != nil || res.Unknown != entries {
					b.Fatalf("settled = %+v %v, want all unknown", res, err)
				}
			}
		})
	}
}

// TestSettleCountsAnEventNamedTwiceOnce names events twice in one call,
// with other entries between: each is acked or dead-lettered once, and
// the second entry is unknown.
func TestSettleCountsAnEventNamedTwiceOnce(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 4)
	ctx := t.Context()
	frames, err := q.Append(ctx, batch("a", 0, 8, "")) // (k0 k1 k2 k3) (k4 k5 k6 k7)
	if err != nil {
		t.Fatal(err)
	}
	f0, f1 := frames[0].ID, frames[1].ID
	k := func(f int64, key string) KeyAck { return KeyAck{Frame: f, Source: "a", Key: key} }
	nk := func(f int64, key string) NackInput {
		return NackInput{Frame: f, Source: "a", Key: key, Reason: "bad " + key, Permanent: true}
	}
	res, err := q.Settle(ctx, nil, []KeyAck{k(f0, "k0"), k(f0, "k1"), k(f0, "k0")},
		[]NackInput{nk(f1, "k4"), nk(f1, "k5"), nk(f1, "k4")})
	if err != nil {
		t.Fatal(err)
	}
	if res.DeadLettered != 2 || res.Unknown != 2 || len(res.Cleared) != 0 {
		t.Fatalf("settled = %+v, want 2 dead-lettered and 2 unknown", res)
	}
	if q.PendingEvents() != 4 || q.PendingFrames() != 2 {
		t.Fatalf("pending = %d events %d frames, want 4 and 2", q.PendingEvents(), q.PendingFrames())
	}
	if dl, err := q.DeadLetters(ctx, 10); err != nil || len(dl) != 2 {
		t.Fatalf("dead letters = %+v %v, want k4 and k5 once each", dl, err)
	}
	// The rest clears both frames: their counts were kept right.
	res, err = q.Settle(ctx, nil, []KeyAck{k(f0, "k2"), k(f0, "k3"), k(f1, "k6"), k(f1, "k7")}, nil)
	if err != nil || len(res.Cleared) != 2 || q.PendingEvents() != 0 || q.PendingFrames() != 0 {
		t.Fatalf("settled = %+v %v, pending %d/%d; want both frames cleared", res, err, q.PendingEvents(), q.PendingFrames())
	}
}
