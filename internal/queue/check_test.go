package queue

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// fillForCheck appends n events in pages of 1000 to q.
func fillForCheck(t testing.TB, q *Queue, n int) {
	t.Helper()
	for i := 0; i < n; i += 1000 {
		bt := Batch{Source: "firehose", FetchedAt: time.Now(), RawKey: fmt.Sprintf("firehose/2026/11/25/%d-pages.seg", i),
			Events: make([]NewEvent, min(1000, n-i))}
		for j := range bt.Events {
			bt.Events[j] = NewEvent{Key: fmt.Sprintf("ev-%d", i+j), RawOff: j * 500, RawLen: 500}
		}
		if _, err := q.Append(t.Context(), bt); err != nil {
			t.Fatal(err)
		}
	}
}

// TestQuickCheckFindsAGarbledPage garbles a page of a queue that Open's
// own queries do not read: Open succeeds, QuickCheck returns a
// *DamagedError naming the file, and the Inspector's integrity check
// lists the damage too.
func TestQuickCheckFindsAGarbledPage(t *testing.T) {
	p := filepath.Join(t.TempDir(), "queue.db")
	q, err := Open(Options{Path: p})
	if err != nil {
		t.Fatal(err)
	}
	fillForCheck(t, q, 5000)
	if err := q.QuickCheck(t.Context()); err != nil {
		t.Fatalf("a sound queue: %v", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	sound, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// Garble pages from the last one back until one is not among those
	// Open's queries read (the right edges of a few tables); a ledger leaf
	// soon is.
	for page := len(sound)/4096 - 1; ; page-- {
		if page < len(sound)/4096/2 {
			t.Fatal("Open read every page of the last half of the file after one was garbled")
		}
		b := slices.Clone(sound)
		for i := page * 4096; i < (page+1)*4096; i++ {
			b[i] = byte(i * 7)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if q, err = Open(Options{Path: p}); err == nil {
			break
		}
	}
	err = q.QuickCheck(t.Context())
	var d *DamagedError
	if !errors.As(err, &d) || d.Path != p || len(d.Problems) == 0 {
		t.Errorf("quick_check of a garbled page: %v, want a *DamagedError of %s", err, p)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	in, err := OpenInspector(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := in.Close(); err != nil {
			t.Error(err)
		}
	}()
	if problems, err := in.IntegrityCheck(t.Context()); err != nil || len(problems) == 0 {
		t.Errorf("integrity_check of a garbled page: %q, %v; want the problems", problems, err)
	}
}

// BenchmarkQuickCheck measures the quick_check the daemon runs at every
// start, on a queue of 200,000 pending events (README: ~0.1 s here).
func BenchmarkQuickCheck(b *testing.B) {
	q, err := Open(Options{Path: filepath.Join(b.TempDir(), "q.db"), Synchronous: "normal"})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := q.Close(); err != nil {
			b.Error(err)
		}
	}()
	fillForCheck(b, q, 200_000)
	b.ResetTimer()
	for range b.N {
		if err := q.QuickCheck(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}
