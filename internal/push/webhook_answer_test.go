package push

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAnswerJSONMatchesEncodingJSON checks the hand-written answer encoder
// against encoding/json: the same bytes, whatever the strings hold.
func TestAnswerJSONMatchesEncodingJSON(t *testing.T) {
	at := time.Date(2026, 11, 24, 21, 5, 6, 789000000, time.UTC)
	for _, s := range []string{"", "plain", `quote " and \ backslash`, "tab\tnewline\ncr\r", "\x00\x01\x1f\x7f",
		"<html>&amp;", "é ü 中文 🎉", "\u2028\u2029", "bad \xff utf-8 \xc3", strings.Repeat("k", 300)} {
		for _, a := range []eventAnswer{
			{ID: 42, IdempotencyKey: s, Status: "queued", Received: 1, CreatedAt: at, UpdatedAt: at},
			{ID: 1 << 40, IdempotencyKey: "k", Status: "dead_lettered", Duplicate: true, Deliveries: 7, Received: 3,
				CreatedAt: at, UpdatedAt: at.Add(time.Hour), LastError: s, RequestID: s},
		} {
			checkAnswerJSON(t, a)
		}
	}
}

// FuzzAnswerJSON feeds arbitrary strings to the answer encoder.
func FuzzAnswerJSON(f *testing.F) {
	f.Add("key", "error", "req", int64(1))
	f.Add("\xff\x00\"\\", "\u2028", "", int64(-5))
	f.Fuzz(func(t *testing.T, key, lastErr, reqID string, id int64) {
		at := time.Unix(0, id).UTC()
		checkAnswerJSON(t, eventAnswer{ID: id, IdempotencyKey: key, Status: "acked", LastError: lastErr, RequestID: reqID,
			CreatedAt: at, UpdatedAt: at})
	})
}

func checkAnswerJSON(t *testing.T, a eventAnswer) {
	t.Helper()
	got := a.appendJSON(nil)
	if !json.Valid(got) {
		t.Fatalf("appendJSON(%+v) = %q: not valid JSON", a, got)
	}
	want, err := json.Marshal(a)
	if err != nil {
		t.Fatalf("json.Marshal(%+v): %v", a, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("appendJSON = %s\njson.Marshal = %s", got, want)
	}
}

// TestNewRequestIDsAreDistinct: the ids made for requests without one are
// 26 characters of crypto/rand.Text's alphabet sharing the run's random
// prefix, and never repeat, also from many goroutines at once.
func TestNewRequestIDsAreDistinct(t *testing.T) {
	const workers, each = 8, 5000
	ids := make([][]string, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range each {
				ids[w] = append(ids[w], newRequestID())
			}
		})
	}
	wg.Wait()
	seen := make(map[string]bool, workers*each)
	for _, list := range ids {
		for _, id := range list {
			if len(id) != 26 || strings.Trim(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") != "" || id[:16] != requestIDPrefix {
				t.Fatalf("request id %q: want 26 base32 characters starting with the run's prefix %q", id, requestIDPrefix)
			}
			if seen[id] {
				t.Fatalf("request id %q made twice", id)
			}
			seen[id] = true
		}
	}
}
