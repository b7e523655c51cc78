package ingest_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3" // the second connection that makes commits fail

	"github.com/ingestorhq/ingestor/internal/diskspace"
	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/s3test"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/sources"
)

// delivered is the Sender of these tests: it passes on the frames handed
// to delivery, one Submit a message.
type delivered chan []queue.Frame

func (d delivered) Submit(frames []queue.Frame) { d <- frames }

// events returns the events handed to delivery since the last call.
func (d delivered) events() []queue.Event {
	var out []queue.Event
	for {
		select {
		case frames := <-d:
			for _, f := range frames {
				out = append(out, f.Events...)
			}
		default:
			return out
		}
	}
}

// rig is an Ingest over a real queue in a temporary directory and a raw
// store, with the frames it hands to delivery.
type rig struct {
	in     *ingest.Ingest
	q      *queue.Queue
	qpath  string
	raw    rawstore.Store
	frames delivered
}

// newRig opens a queue in a temporary directory; raw nil means a file raw
// store there too. disk may be nil.
func newRig(t *testing.T, raw rawstore.Store, disk ingest.DiskGuard) *rig {
	t.Helper()
	dir := t.TempDir()
	r := &rig{qpath: filepath.Join(dir, "queue.db"), raw: raw, frames: make(delivered, 16)}
	var err error
	if r.raw == nil {
		if r.raw, err = rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + filepath.Join(dir, "raw")}); err != nil {
			t.Fatal(err)
		}
	}
	if r.q, err = queue.Open(queue.Options{Path: r.qpath, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.q.Close(); err != nil {
			t.Error(err)
		}
	})
	r.in = ingest.New(ingest.Options{Queue: r.q, Raw: r.raw, Sender: r.frames, Disk: disk})
	return r
}

// page is a polled page of three records and the records in it.
func page() ([]byte, []sources.Record) {
	body := []byte(`[{"id":"a"},{"id":"b"},{"id":"c"}]`)
	return body, []sources.Record{{Key: "a", Off: 1, Len: 10}, {Key: "b", Off: 12, Len: 10}, {Key: "c", Off: 23, Len: 10}}
}

// checkEvents checks that the frames handed to delivery hold exactly
// records, each pointing at its own bytes in the raw store.
func (r *rig) checkEvents(t *testing.T, records []sources.Record) {
	t.Helper()
	events := r.frames.events()
	if len(events) != len(records) {
		t.Fatalf("%d events handed to delivery, want %d", len(events), len(records))
	}
	for i, e := range events {
		obj, err := r.raw.Get(t.Context(), e.RawKey)
		if err != nil {
			t.Fatal(err)
		}
		if e.Key != records[i].Key || !bytes.Equal(obj[e.RawOff:e.RawOff+e.RawLen], e.Payload) {
			t.Errorf("event %d = %s at %s@%d: raw bytes %q, payload %q", i, e.Key, e.RawKey, e.RawOff,
				obj[e.RawOff:e.RawOff+e.RawLen], e.Payload)
		}
	}
}

// TestPageGoesWhereTheStoreKeepsPages writes a page on a file raw store,
// which appends pages to their source's page segment, and on S3, which
// keeps each as an object of its own under its content key: the Ref is
// the key each store chose, and the events committed from it point at
// their bytes there.
func TestPageGoesWhereTheStoreKeepsPages(t *testing.T) {
	at := time.Date(2024, 3, 5, 22, 0, 0, 0, time.UTC)
	body, records := page()
	t.Run("file store: page segment", func(t *testing.T) {
		r := newRig(t, nil, nil)
		p := r.in.Page("feed", at, body)
		if p.Ref() != (ingest.Ref{}) {
			t.Fatalf("a page to append has Ref %+v before it is written, want none", p.Ref())
		}
		if err := r.in.Write(t.Context(), &p); err != nil {
			t.Fatal(err)
		}
		ref := p.Ref()
		if !rawstore.IsPageSegment(ref.Key) || ref.Off == 0 {
			t.Fatalf("page written at %+v, want past its record header in a page segment", ref)
		}
		if k := p.ObjectKey(); k != rawstore.Key("feed", at, body) {
			t.Errorf("ObjectKey = %q, want the page's content key", k)
		}
		r.commitAndCheck(t, ref, body, records)
	})
	t.Run("s3: object", func(t *testing.T) {
		srv := s3test.Start(t)
		srv.SetEnv(t)
		s3, err := rawstore.Open(t.Context(), rawstore.Options{URL: "s3://" + srv.Bucket + "/raw", Endpoint: srv.Endpoint, PathStyle: true})
		if err != nil {
			t.Fatal(err)
		}
		r := newRig(t, s3, nil)
		p := r.in.Page("feed", at, body)
		if err := r.in.Write(t.Context(), &p); err != nil {
			t.Fatal(err)
		}
		ref := p.Ref()
		if want := (ingest.Ref{Key: rawstore.Key("feed", at, body)}); ref != want || p.ObjectKey() != want.Key {
			t.Fatalf("page written at %+v (object key %q), want %+v", ref, p.ObjectKey(), want)
		}
		if obj, err := s3.Get(t.Context(), ref.Key); err != nil || !bytes.Equal(obj, body) {
			t.Fatalf("object %s = %q (%v), want the page", ref.Key, obj, err)
		}
		r.commitAndCheck(t, ref, body, records)
	})
}

// commitAndCheck commits records of body, written at ref, with a cursor,
// and checks the events handed to delivery and the cursor.
func (r *rig) commitAndCheck(t *testing.T, ref ingest.Ref, body []byte, records []sources.Record) {
	t.Helper()
	b := ingest.PageBatch("feed", time.Now(), ref, body, records)
	b.Cursor, b.SetCursor = "c1", true
	frames, err := r.in.Commit(t.Context(), b)
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) != 1 || len(frames[0].Events) != len(records) {
		t.Fatalf("Commit returned %+v, want one frame of %d events", frames, len(records))
	}
	r.checkEvents(t, records)
	if c, _, err := r.q.Cursor(t.Context(), "feed"); err != nil || c != "c1" {
		t.Errorf("cursor = %q (%v), want c1", c, err)
	}
}

// refuse makes the queue's commits fail for real while it is in place: a
// trigger, added from a second connection, that aborts every insert into
// table (and every update, for a table updated in place). drop removes it.
func (r *rig) refuse(t *testing.T, table string) (drop func()) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+r.qpath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	for _, op := range []string{"INSERT", "UPDATE"} {
		if _, err := db.ExecContext(t.Context(), `CREATE TRIGGER refuse_`+op+` BEFORE `+op+` ON `+table+
			` BEGIN SELECT RAISE(ABORT, 'refused by the test'); END`); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		t.Helper()
		for _, op := range []string{"INSERT", "UPDATE"} {
			if _, err := db.ExecContext(context.Background(), `DROP TRIGGER refuse_`+op); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkNothingQueued checks that none of records is in the ledger or was
// handed to delivery, and that the cursor is still want.
func (r *rig) checkNothingQueued(t *testing.T, records []sources.Record, want string) {
	t.Helper()
	if n := len(r.frames.events()); n != 0 {
		t.Errorf("%d events handed to delivery after a failed commit", n)
	}
	if n := r.q.PendingEvents(); n != 0 {
		t.Errorf("%d events pending after a failed commit", n)
	}
	for _, rec := range records {
		if _, ok, err := r.q.EventByKey(t.Context(), "feed", rec.Key); err != nil || ok {
			t.Errorf("event %s in the ledger after a failed commit (%v)", rec.Key, err)
		}
	}
	if c, _, err := r.q.Cursor(t.Context(), "feed"); err != nil || c != want {
		t.Errorf("cursor = %q (%v) after a failed commit, want %q", c, err, want)
	}
}

// TestCommitFailureAfterRawWriteAcknowledgesNothing writes a page, then
// has its commit fail on the cursor, which the queue stores after the
// events in the same transaction: no event is left in the ledger, none is
// handed to delivery, the cursor does not move, and on a chain no later
// batch commits past the failed one, so the page is fetched again.
func TestCommitFailureAfterRawWriteAcknowledgesNothing(t *testing.T) {
	r := newRig(t, nil, nil)
	body, records := page()
	p := r.in.Page("feed", time.Now(), body)
	if err := r.in.Write(t.Context(), &p); err != nil {
		t.Fatal(err)
	}
	b := ingest.PageBatch("feed", time.Now(), p.Ref(), body, records)
	b.Cursor, b.SetCursor = "c1", true
	drop := r.refuse(t, "offsets")

	if _, err := r.in.Commit(t.Context(), b); err == nil || ingest.IsDiskFull(err) {
		t.Fatalf("Commit with the cursor refused: err = %v, want the refusal", err)
	}
	r.checkNothingQueued(t, records, "")

	// The same on a chain, without waiting: the failed batch fails the
	// chain, so the next one (here with no cursor at all) is not applied
	// either, even once the queue would take it.
	chain := &queue.Chain{}
	results := make(chan error, 2)
	done := func(frames []queue.Frame, err error) {
		if err == nil && len(frames) == 0 {
			err = errors.New("committed, with no new frame")
		}
		results <- err
	}
	if err := r.in.TryCommit(b, chain, done, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-results; err == nil {
		t.Fatal("TryCommit with the cursor refused succeeded")
	}
	drop()
	next := ingest.PageBatch("feed", time.Now(), p.Ref(), body, records[:1])
	if err := r.in.TryCommit(next, chain, done, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-results; err == nil {
		t.Fatal("a batch committed on a chain after one that failed")
	}
	r.checkNothingQueued(t, records, "")

	// Fetched again on a new chain, the page commits.
	if err := r.in.TryCommit(b, &queue.Chain{}, done, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-results; err != nil {
		t.Fatal(err)
	}
	r.checkEvents(t, records)
}

// TestPushReceiptsCommitWithTheEvents commits pushed events with their
// receipts, the device seqs and the signature verdict that the queue
// keeps with them: the verdict is stored with its event; a commit whose
// seq receipt is refused stores no event either; and the next commit of
// the device finds the seq that failed missing, which it would not be had
// its receipt been kept without its event.
func TestPushReceiptsCommitWithTheEvents(t *testing.T) {
	r := newRig(t, nil, nil)
	verdict := &queue.Verdict{Scheme: "github", ReceivedAt: time.Now().Truncate(time.Millisecond)}
	push := func(seq int64, v *queue.Verdict) ([]queue.SeqFinding, error) {
		body := fmt.Appendf(nil, `{"n":%d}`, seq)
		p := r.in.Page("devices", time.Now(), body)
		if err := r.in.Write(t.Context(), &p); err != nil {
			t.Fatal(err)
		}
		var findings []queue.SeqFinding
		b := queue.Batch{Source: "devices", FetchedAt: time.Now(), RawKey: p.Ref().Key, SeqFindings: &findings,
			Events: []queue.NewEvent{{Key: fmt.Sprintf("e%d", seq), RawOff: p.Ref().Off, RawLen: len(body),
				Payload: body, Device: "dev-a", DevSeq: seq, Verdict: v}}}
		_, err := r.in.Commit(t.Context(), b)
		return findings, err
	}
	for seq := int64(1); seq <= 2; seq++ {
		if f, err := push(seq, verdict); err != nil || len(f) != 0 {
			t.Fatalf("push seq %d: findings %+v, err %v", seq, f, err)
		}
	}
	st, ok, err := r.q.EventByKey(t.Context(), "devices", "e1")
	if err != nil || !ok || st.Verdict == nil || st.Verdict.Scheme != "github" {
		t.Fatalf("e1 = %+v (found %v, %v), want it with its verdict", st, ok, err)
	}

	drop := r.refuse(t, "device_seqs")
	if _, err := push(3, nil); err == nil {
		t.Fatal("a commit whose seq receipt was refused succeeded")
	}
	drop()
	if _, ok, err := r.q.EventByKey(t.Context(), "devices", "e3"); err != nil || ok {
		t.Fatalf("e3 is in the ledger (%v) though its receipt was refused", err)
	}
	f, err := push(4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []queue.SeqFinding{{Device: "dev-a", From: 3, To: 3}}; len(f) != 1 || f[0] != want[0] {
		t.Errorf("findings of seq 4 = %+v, want %+v: seq 3 was never stored", f, want)
	}
	if n := len(r.frames.events()); n != 3 {
		t.Errorf("%d events handed to delivery, want 3 (seqs 1, 2 and 4)", n)
	}
}

// TestDeadLetterKeepsThePayloadWithItsKey keeps a malformed payload as an
// object under deadletter/ and lists it with that key.
func TestDeadLetterKeepsThePayloadWithItsKey(t *testing.T) {
	r := newRig(t, nil, nil)
	at := time.Now()
	body := []byte(`{"error":"not an array"}`)
	p := ingest.DeadLetter("feed", at, body)
	if err := r.in.Write(t.Context(), &p); err != nil {
		t.Fatal(err)
	}
	key := p.Ref().Key
	if key != "deadletter/"+rawstore.Key("feed", at, body) || p.ObjectKey() != key {
		t.Fatalf("dead letter written under %q (object key %q), want deadletter/ and its content key", key, p.ObjectKey())
	}
	if err := r.in.RecordDeadLetter(t.Context(), &p, "not an array", "c7"); err != nil {
		t.Fatal(err)
	}
	dls, err := r.q.DeadLetters(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].RawKey != key || dls[0].Source != "feed" || dls[0].Reason != "not an array" {
		t.Fatalf("dead letters = %+v, want the payload under %s", dls, key)
	}
	if obj, err := r.raw.Get(t.Context(), key); err != nil || !bytes.Equal(obj, body) {
		t.Errorf("dead letter's object = %q (%v), want the payload", obj, err)
	}
}

// TestWriteOnAFullDiskPausesNewWork fills a small tmpfs holding the file
// raw store: the write fails with ENOSPC, IsDiskFull says so, and the disk
// guard holds new work back (DiskLow) until space returns.
func TestWriteOnAFullDiskPausesNewWork(t *testing.T) {
	tmpfs := testsync.MountTmpfs(t, 1<<20)
	raw, err := rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + filepath.Join(tmpfs.Dir, "raw")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := raw.(rawstore.Appender).Close(); err != nil {
			t.Error(err)
		}
	})
	guard, err := diskspace.New(diskspace.Options{Paths: []string{tmpfs.Dir}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, raw, guard)
	if why, low := r.in.DiskLow(); low {
		t.Fatalf("disk low before anything was written: %s", why)
	}
	p := r.in.Page("feed", time.Now(), bytes.Repeat([]byte("x"), 2<<20))
	err = r.in.Write(t.Context(), &p)
	if err == nil || !ingest.IsDiskFull(err) {
		t.Fatalf("write of 2 MiB on a 1 MiB tmpfs: err = %v, want one IsDiskFull reports", err)
	}
	if p.Ref() != (ingest.Ref{}) {
		t.Errorf("a failed page write has Ref %+v, want none", p.Ref())
	}
	if _, low := r.in.DiskLow(); !low {
		t.Error("DiskLow is false after a write failed for lack of space")
	}
	tmpfs.Resize(128 << 20)
	guard.Check()
	if why, low := r.in.DiskLow(); low {
		t.Errorf("DiskLow still true once space returned: %s", why)
	}
}
