package delivery

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/ingest/ingesttest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// deadLetterReasons returns the reason of each active dead letter, by
// event key.
func deadLetterReasons(t *testing.T, q *queue.Queue) map[string]string {
	t.Helper()
	dl, err := q.DeadLetters(t.Context(), 100)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(dl))
	for _, d := range dl {
		out[d.Key] = d.Reason
	}
	return out
}

// TestCorruptRawObjectIsDeadLettered queues a frame whose raw object no
// longer matches the SHA-256 in its key (a flipped bit) before a good
// frame: the backlog scan dead-letters the first frame's events with that
// reason, never sends their bytes, and goes on to deliver the second.
func TestCorruptRawObjectIsDeadLettered(t *testing.T) {
	ctx := t.Context()
	q, raw := openStores(t)
	dir := strings.TrimPrefix(raw.String(), "file://")
	body := []byte(`[{"id":"r0"},{"id":"r1"}]`)
	at := time.Now()
	rotten, good := ingesttest.WriteObject(t, raw, "src", at, body), ingesttest.WriteObject(t, raw, "src", at.Add(1), body)
	p := filepath.Join(dir, filepath.FromSlash(rotten))
	flipped := slices.Clone(body)
	flipped[9] ^= 0x01 // "r0" becomes "r1": still JSON, wrong bytes
	if err := os.WriteFile(p, flipped, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, b := range []queue.Batch{
		{Source: "src", RawKey: rotten, FetchedAt: at, Events: []queue.NewEvent{{Key: "m0", RawOff: 1, RawLen: 11}, {Key: "m1", RawOff: 13, RawLen: 11}}},
		{Source: "src", RawKey: good, FetchedAt: at, Events: []queue.NewEvent{{Key: "g0", RawOff: 1, RawLen: 11}, {Key: "g1", RawOff: 13, RawLen: 11}}},
	} {
		if _, err := q.Append(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	_, pull := startSender(t, q, raw)
	msg, err := pull.RecvBytes(0)
	if err != nil {
		t.Fatalf("no frame delivered: %v", err)
	}
	if !strings.Contains(string(msg), `"key":"g0"`) || strings.Contains(string(msg), `"key":"m0"`) {
		t.Fatalf("first frame delivered = %s, want the good frame only", msg)
	}
	want := "raw object corrupt: sha256 mismatch: " + rotten
	if got := deadLetterReasons(t, q); len(got) != 2 || got["m0"] != want || got["m1"] != want {
		t.Errorf("dead letters %v, want m0 and m1 with reason %q", got, want)
	}
	if q.PendingEvents() != 2 || q.PendingFrames() != 1 {
		t.Errorf("pending = %d events %d frames, want the good frame's 2 and 1", q.PendingEvents(), q.PendingFrames())
	}
}

// TestCorruptPageIsDeadLettered queues four pages of a page segment, one
// frame each, then flips a byte in the second page and cuts the segment
// short inside the fourth: the backlog scan sends the first and third
// pages' events with their bytes and dead-letters the second's (page crc
// mismatch) and the fourth's (page truncated), naming the page.
func TestCorruptPageIsDeadLettered(t *testing.T) {
	ctx := t.Context()
	q, raw := openStores(t)
	var key string
	var offs []int
	for p := range 4 {
		page := fmt.Sprintf(`[{"id":"p%d-0"},{"id":"p%d-1"}]`, p, p)
		ref := ingesttest.WritePage(t, raw, "src", time.Now(), []byte(page))
		off := ref.Off
		key, offs = ref.Key, append(offs, off)
		if _, err := q.Append(ctx, queue.Batch{Source: "src", RawKey: key, FetchedAt: time.Now(), Events: []queue.NewEvent{
			{Key: fmt.Sprintf("p%d-0", p), RawOff: off + 1, RawLen: 13}, {Key: fmt.Sprintf("p%d-1", p), RawOff: off + 15, RawLen: 13}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := raw.(rawstore.Appender).Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(strings.TrimPrefix(raw.String(), "file://"), filepath.FromSlash(key))
	seg, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	seg[offs[1]+9] ^= 0x01 // p1-0 becomes p0-0: still JSON, wrong bytes
	if err := os.WriteFile(p, seg[:offs[3]+20], 0o644); err != nil {
		t.Fatal(err)
	}

	_, pull := startSender(t, q, raw)
	sent := map[string]string{}
	for range 2 {
		msg, err := pull.RecvBytes(0)
		if err != nil {
			t.Fatalf("frames sent %v; then: %v", sent, err)
		}
		f, err := wire.DecodeFrame(msg)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range f.Events {
			sent[e.Key] = string(e.Payload)
		}
	}
	for _, id := range []string{"p0-0", "p0-1", "p2-0", "p2-1"} {
		if want := `{"id":"` + id + `"}`; sent[id] != want {
			t.Errorf("event %s sent as %q, want %q", id, sent[id], want)
		}
	}
	if len(sent) != 4 {
		t.Errorf("events sent %v, want those of the two good pages only", sent)
	}
	crc := fmt.Sprintf("raw object corrupt: page crc mismatch: %s@%d", key, offs[1])
	cut := fmt.Sprintf("raw object corrupt: page truncated: %s@%d", key, offs[3])
	want := map[string]string{"p1-0": crc, "p1-1": crc, "p3-0": cut, "p3-1": cut}
	var got map[string]string
	// The pending count drops once the writer has run the dead letter's
	// callbacks, just after its commit, which a reader may see first.
	testsync.WaitFor(t, "the damaged pages' events dead-lettered, the 4 sent left pending", 10*time.Second, func() bool {
		got = deadLetterReasons(t, q)
		return len(got) == len(want) && q.PendingEvents() == 4
	})
	if !maps.Equal(got, want) {
		t.Errorf("dead letters %v, want %v", got, want)
	}
}
