package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// TestKeySetCountsDistinctKeys checks keySet against a plain map, on keys
// with and without numbers, leading zeros, huge numbers and repeats.
func TestKeySetCountsDistinctKeys(t *testing.T) {
	fixed := []string{"", "0", "00", "7", "07", "ev-0", "ev-00", "ev-1", "ev-01", "ev-", "x", "ev-67108863",
		"ev-67108864", "ev-18446744073709551615", "ev-99999999999999999999", "a1b2", "a1b02"}
	r := rand.New(rand.NewPCG(1, 2))
	keys := append([]string(nil), fixed...)
	for range 20000 {
		keys = append(keys, fmt.Sprintf("%s-%d", []string{"ev", "id", ""}[r.IntN(3)], r.IntN(30000)))
	}
	keys = append(keys, fixed...)
	set, want := newKeySet(), map[string]bool{}
	for _, k := range keys {
		if got := set.add(k); got != !want[k] {
			t.Fatalf("add(%q) = %v, want %v", k, got, !want[k])
		}
		want[k] = true
	}
	if set.n != int64(len(want)) {
		t.Errorf("distinct = %d, want %d", set.n, len(want))
	}
}

// TestCountOutWritesDistinctKeys runs the command with -count-out against
// a daemon played by the test: a frame sent twice counts its events twice
// and their keys once.
func TestCountOutWritesDistinctKeys(t *testing.T) {
	push, pull, endpoint, ackEndpoint := fakeDaemon(t)
	out := filepath.Join(t.TempDir(), "counts.json")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs testsync.LockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-connect", endpoint, "-ack", ackEndpoint, "-count-out", out}, &logs)
	}()
	for delivery := 1; delivery <= 2; delivery++ {
		var enc wire.Encoder
		enc.Begin(1, delivery, "file://./data/raw")
		for i, key := range []string{"ev-1", "ev-2", "other"} {
			ev := wire.Event{Key: key, Source: []string{"a", "b", "a"}[i], Seq: int64(i + 1), FetchedAt: time.Now()}
			enc.Add(&ev, []byte(`{}`), true)
		}
		if _, err := push.SendBytes(enc.End(), 0); err != nil {
			t.Fatalf("send: %v", err)
		}
		if _, err := pull.RecvBytes(0); err != nil { // bounded by the receive timeout
			t.Fatalf("receive ack: %v", err)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v\n%s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var got counts
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if want := (counts{Events: 6, DistinctKeys: 3, Redeliveries: 1}); got != want {
		t.Errorf("counts = %+v, want %+v", got, want)
	}
}
