package rawretention

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ingestorhq/ingestor/internal/ingest/ingesttest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
)

// rig is a real queue and a real file raw store.
type rig struct {
	t     *testing.T
	q     *queue.Queue
	store rawstore.Store
	dir   string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	dir := t.TempDir()
	q, err := queue.Open(queue.Options{Path: filepath.Join(dir, "queue.db"), EventsPerFrame: 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	})
	store, err := rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + filepath.Join(dir, "raw")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, ok := store.(interface{ Close() error }); ok {
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	return &rig{t: t, q: q, store: store, dir: filepath.Join(dir, "raw")}
}

// put stores body under a fresh key of source, written at written.
func (r *rig) put(source, body string, written time.Time) string {
	r.t.Helper()
	key := ingesttest.WriteObject(r.t, r.store, source, written, []byte(body))
	if err := os.Chtimes(filepath.Join(r.dir, filepath.FromSlash(key)), written, written); err != nil {
		r.t.Fatal(err)
	}
	return key
}

// commit queues one event of key's object and returns its frame.
func (r *rig) commit(source, key, event string) queue.Frame {
	r.t.Helper()
	frames, err := r.q.Append(r.t.Context(), queue.Batch{Source: source, FetchedAt: time.Now(), RawKey: key,
		Events: []queue.NewEvent{{Key: event, RawLen: 1}}})
	if err != nil || len(frames) != 1 {
		r.t.Fatalf("append %s: %v, %d frames", event, err, len(frames))
	}
	return frames[0]
}

func (r *rig) exists(key string) bool {
	_, err := os.Stat(filepath.Join(r.dir, filepath.FromSlash(key)))
	return err == nil
}

// TestPrunesOnlyWhatNothingNeeds: past retention, the objects of acked
// events and objects never committed are deleted; the object of a pending
// event, of an event dead-lettered by a processor's nack, and of a
// malformed payload's dead letter are kept, as is an object younger than
// the retention, and an open page segment. Acking the pending event lets
// the next pass delete its object; dropping the dead letter, the
// payload's. TestNeverDeletesWhatIsInUse breaks the rule on purpose.
func TestPrunesOnlyWhatNothingNeeds(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	now := time.Now()
	old, young := now.Add(-3*time.Hour), now.Add(-10*time.Minute)

	acked := r.put("s", "acked", old)
	ackedFrame := r.commit("s", acked, "e-acked")
	pending := r.put("s", "pending", old)
	pendingFrame := r.commit("s", pending, "e-pending")
	nacked := r.put("s", "nacked", old)
	nackedFrame := r.commit("s", nacked, "e-nacked")
	orphan := r.put("s", "never committed", old)
	recent := r.put("s", "recent, never committed", young)
	payload := "deadletter/" + r.put("s", "not json", old)
	if err := os.MkdirAll(filepath.Dir(filepath.Join(r.dir, payload)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(r.dir, payload[len("deadletter/"):]), filepath.Join(r.dir, payload)); err != nil {
		t.Fatal(err)
	}
	if err := r.q.DeadLetter(ctx, "s", "not JSON", payload, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := r.q.Ack(ctx, []int64{ackedFrame.ID}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.q.Nack(ctx, []queue.NackInput{{Source: "s", Key: "e-nacked", Frame: nackedFrame.ID, Permanent: true, Reason: "poison"}}); err != nil {
		t.Fatal(err)
	}
	segment := ingesttest.WritePage(t, r.store, "open", now, []byte(`[{"id":1}]`)).Key
	segPath := filepath.Join(r.dir, filepath.FromSlash(segment))
	if err := os.Chtimes(segPath, old, old); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	p := New(Options{Store: r.store.(Store), Queue: r.q, Retention: time.Hour, Registerer: reg})
	res, err := p.Once(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{acked: false, orphan: false, pending: true, nacked: true, payload: true, recent: true, segment: true} {
		if got := r.exists(key); got != want {
			t.Errorf("after the pass, %s exists = %v, want %v", key, got, want)
		}
	}
	if res.Pruned != 2 || res.Kept != 3 || res.Objects != 5 {
		t.Errorf("pass: %+v, want 2 pruned, 3 kept for the queue, 5 remaining", res)
	}
	if got := testutil.ToFloat64(p.m.pruned); got != 2 {
		t.Errorf("ingestor_raw_pruned_objects_total = %v, want 2", got)
	}
	if got := testutil.ToFloat64(p.m.oldestAge); got < (3 * time.Hour).Seconds() {
		t.Errorf("oldest object age %v s, want the 3 h old ones kept", got)
	}

	// Settled now: the pending event acked, the dead letter dropped.
	if _, err := r.q.Ack(ctx, []int64{pendingFrame.ID}, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := r.q.DropDeadLetters(ctx, queue.DLQFilter{Source: "s", Reason: "not JSON"}); err != nil || n != 1 {
		t.Fatalf("drop the payload's dead letter: %d, %v", n, err)
	}
	if _, err := p.Once(ctx, now); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{pending: false, payload: false, nacked: true, recent: true, segment: true} {
		if got := r.exists(key); got != want {
			t.Errorf("after the second pass, %s exists = %v, want %v", key, got, want)
		}
	}
	// The pruned day directories are gone, not left empty.
	if _, err := os.Stat(filepath.Join(r.dir, "deadletter")); !os.IsNotExist(err) {
		t.Errorf("deadletter/ left behind: %v", err)
	}
}

// inUseMissing is a queue that forgets one key it needs: the shape of a
// bug in RawKeysInUse.
type inUseMissing struct {
	*queue.Queue
	drop string
}

func (q inUseMissing) RawKeysInUse(ctx context.Context) (map[string]bool, error) {
	keys, err := q.Queue.RawKeysInUse(ctx)
	delete(keys, q.drop)
	return keys, err
}

// TestNeverDeletesWhatIsInUse breaks the pass on purpose: with the queue's
// answer missing the pending event's key, the pass deletes its bytes and
// the event can no longer be sent. So the keys the queue reports are what
// keeps bytes: the check in TestPrunesOnlyWhatNothingNeeds can fail.
func TestNeverDeletesWhatIsInUse(t *testing.T) {
	r := newRig(t)
	now := time.Now()
	pending := r.put("s", "pending", now.Add(-3*time.Hour))
	r.commit("s", pending, "e-pending")
	p := New(Options{Store: r.store.(Store), Queue: inUseMissing{r.q, pending}, Retention: time.Hour})
	if _, err := p.Once(t.Context(), now); err != nil {
		t.Fatal(err)
	}
	if r.exists(pending) {
		t.Fatal("with its key missing from the queue's answer, the pending event's object survived: the check cannot see the rule broken")
	}
}
