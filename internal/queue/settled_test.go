package queue

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"testing"
	"time"
)

func openSettled(t *testing.T, path string) *Queue {
	t.Helper()
	q, err := Open(Options{Path: path, EventsPerFrame: 2, TrackSettled: true})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func wantSettled(t *testing.T, q *Queue, want map[string]string, sources ...string) {
	t.Helper()
	got, err := q.SettledCursors(context.Background(), sources)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("SettledCursors(%v) = %v, want %v", sources, got, want)
	}
}

func ackFrames(t *testing.T, q *Queue, frames []Frame) {
	t.Helper()
	ids := make([]int64, 0, len(frames))
	for _, f := range frames {
		ids = append(ids, f.ID)
	}
	if _, err := q.Ack(context.Background(), ids, nil); err != nil {
		t.Fatal(err)
	}
}

// TestSettledCursorWaitsForEveryEventUpToIt: a cursor is settled only once
// every event committed up to it is acked or dead-lettered, whatever the
// order of the acks; a commit without events moves a settled cursor at
// once; another source's pending events never hold it back.
func TestSettledCursorWaitsForEveryEventUpToIt(t *testing.T) {
	q := openSettled(t, filepath.Join(t.TempDir(), "q.db"))
	defer q.Close()
	ctx := t.Context()
	first, err := q.Append(ctx, batch("a", 0, 3, "c1")) // frames (k0 k1) (k2)
	if err != nil {
		t.Fatal(err)
	}
	second, err := q.Append(ctx, batch("a", 3, 2, "c2"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := q.Append(ctx, batch("b", 0, 2, "b1"))
	if err != nil {
		t.Fatal(err)
	}
	wantSettled(t, q, map[string]string{}, "a", "b")
	// The second commit acked first: nothing is settled, the first's
	// events are still pending.
	ackFrames(t, q, second)
	wantSettled(t, q, map[string]string{}, "a")
	// The first commit's frames: one acked, one dead-lettered.
	ackFrames(t, q, first[:1])
	wantSettled(t, q, map[string]string{}, "a")
	res, err := q.Settle(ctx, nil, nil, []NackInput{{Frame: first[1].ID, Source: "a", Key: "k2", Reason: "bad", Permanent: true}})
	if err != nil || res.DeadLettered != 1 {
		t.Fatalf("dead-letter k2: %+v %v", res, err)
	}
	wantSettled(t, q, map[string]string{"a": "c2"}, "a", "b")
	// A page with no events moves the settled cursor at once.
	if _, err := q.Append(ctx, Batch{Source: "a", FetchedAt: time.Now(), Cursor: "c3", SetCursor: true}); err != nil {
		t.Fatal(err)
	}
	wantSettled(t, q, map[string]string{"a": "c3"}, "a")
	// A partly acked frame holds its source back.
	third, err := q.Append(ctx, batch("a", 10, 2, "c4"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Ack(ctx, nil, []KeyAck{{Frame: third[0].ID, Source: "a", Key: "k10"}}); err != nil {
		t.Fatal(err)
	}
	wantSettled(t, q, map[string]string{"a": "c3"}, "a")
	ackFrames(t, q, append(third, other...))
	wantSettled(t, q, map[string]string{"a": "c4", "b": "b1"}, "a", "b")
	if n := len(q.marks.marks["a"]); n != 1 {
		t.Errorf("source a keeps %d marks once settled, want 1", n)
	}
}

// TestSettledCursorAfterRestart: a cursor stored before a restart is
// settled only once the events queued before the restart are.
func TestSettledCursorAfterRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	q := openSettled(t, path)
	frames, err := q.Append(t.Context(), batch("a", 0, 2, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q = openSettled(t, path)
	defer q.Close()
	wantSettled(t, q, map[string]string{}, "a")
	ackFrames(t, q, frames)
	wantSettled(t, q, map[string]string{"a": "c1"}, "a")
	// SetCursor (a source taken over) starts the source's marks afresh.
	if err := q.SetCursor(t.Context(), "a", "handed"); err != nil {
		t.Fatal(err)
	}
	wantSettled(t, q, map[string]string{"a": "handed"}, "a")
	q.ForgetSettled("a")
	wantSettled(t, q, map[string]string{}, "a")
}

// TestSettledCursorsOff: without TrackSettled nothing is remembered.
func TestSettledCursorsOff(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 2)
	if _, err := q.Append(t.Context(), Batch{Source: "a", FetchedAt: time.Now(), Cursor: "c", SetCursor: true}); err != nil {
		t.Fatal(err)
	}
	wantSettled(t, q, map[string]string{}, "a")
}

// TestSettledMarksStayBounded: a backlog of many small commits keeps at
// most maxMarks marks per source; the settled cursor found is then older
// than or equal to the exact one, never newer, and the newest is kept.
func TestSettledMarksStayBounded(t *testing.T) {
	q := openSettled(t, filepath.Join(t.TempDir(), "q.db"))
	defer q.Close()
	ctx := t.Context()
	var frames [][]Frame
	for i := range 3 * maxMarks {
		fr, err := q.Append(ctx, batch("a", i, 1, fmt.Sprintf("c%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, fr)
	}
	if n := len(q.marks.marks["a"]); n > maxMarks {
		t.Fatalf("%d marks kept, want at most %d", n, maxMarks)
	}
	// The first 100 commits acked: the settled cursor is at most c99.
	for _, fr := range frames[:100] {
		ackFrames(t, q, fr)
	}
	got, err := q.SettledCursors(ctx, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if _, err := fmt.Sscanf(got["a"], "c%d", &n); err != nil || n > 99 || n < 50 {
		t.Fatalf("settled cursor %q after acking c0..c99, want c50..c99", got["a"])
	}
	for _, fr := range frames[100:] {
		ackFrames(t, q, fr)
	}
	wantSettled(t, q, map[string]string{"a": fmt.Sprintf("c%d", 3*maxMarks-1)}, "a")
}
