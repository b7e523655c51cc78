package ingest_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/sources"
)

// bigPage is a page of n records of size bytes each, past the size the
// file store writes zeros ahead for.
func bigPage(n, size int) ([]byte, []sources.Record) {
	var body []byte
	var records []sources.Record
	for i := range n {
		line := fmt.Appendf(nil, `{"id":"k%d","pad":"%s"}`, i, bytes.Repeat([]byte("x"), size))
		records = append(records, sources.Record{Key: fmt.Sprintf("k%d", i), Off: len(body), Len: len(line)})
		body = append(append(body, line...), '\n')
	}
	return body, records
}

// writeCommit is WriteCommit of body as a page of "feed".
func writeCommit(t *testing.T, r *rig, body []byte, records []sources.Record) (rawErr, err error) {
	t.Helper()
	now := time.Now()
	p := r.in.Page("feed", now, body)
	_, _, rawErr, err = r.in.WriteCommit(t.Context(), &p, func() queue.Batch {
		return ingest.PageBatch("feed", now, p.Ref(), body, records)
	})
	return rawErr, err
}

// TestWriteCommitCommitsOnlyADurablePage writes pages with WriteCommit on
// a file raw store, whose queue statements run while the page is written:
// a page written commits its events, pointing at their bytes; a page
// whose write fails (the raw store's disk full) commits none, and is
// committed whole once written again; a page written whose commit fails
// commits none either.
func TestWriteCommitCommitsOnlyADurablePage(t *testing.T) {
	fs := testsync.MountTmpfs(t, 4<<20)
	raw, err := rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + fs.Dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := raw.(rawstore.Appender).Close(); err != nil {
			t.Error(err)
		}
	})
	if _, ok := raw.(rawstore.PageReserver); !ok {
		t.Fatal("the file store cannot reserve a page: WriteCommit would not overlap")
	}
	r := newRig(t, raw, nil)
	body, records := page()
	if rawErr, err := writeCommit(t, r, body, records); rawErr != nil || err != nil {
		t.Fatalf("raw %v, commit %v", rawErr, err)
	}
	r.checkEvents(t, records)

	// Fill the tmpfs: a page past the zeros written ahead cannot be written.
	filler := filepath.Join(fs.Dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 64<<10)); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	big, bigRecords := bigPage(130, 9000) // past the MiB of zeros written ahead
	rawErr, err := writeCommit(t, r, big, bigRecords)
	if rawErr == nil || err != nil {
		t.Fatalf("a page on a full disk: raw %v, commit %v; want the raw write's error alone", rawErr, err)
	}
	if n := len(r.frames.events()); n != 0 {
		t.Errorf("%d events handed to delivery after a failed write", n)
	}
	for _, rec := range bigRecords[:3] {
		if _, ok, err := r.q.EventByKey(t.Context(), "feed", rec.Key); err != nil || ok {
			t.Errorf("event %s in the ledger after its page's write failed (%v)", rec.Key, err)
		}
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if rawErr, err := writeCommit(t, r, big, bigRecords); rawErr != nil || err != nil {
		t.Fatalf("the page written again: raw %v, commit %v", rawErr, err)
	}
	r.checkEvents(t, bigRecords)

	next, nextRecords := bigPage(1, 10)
	for i := range nextRecords {
		nextRecords[i].Key = "n" + nextRecords[i].Key
	}
	drop := r.refuse(t, "raw_objects")
	if rawErr, err := writeCommit(t, r, next, nextRecords); rawErr != nil || err == nil {
		t.Fatalf("a page whose commit is refused: raw %v, commit %v; want the commit's error alone", rawErr, err)
	}
	drop()
	if _, ok, err := r.q.EventByKey(t.Context(), "feed", nextRecords[0].Key); err != nil || ok {
		t.Errorf("the event of a refused commit is in the ledger (%v)", err)
	}
}
