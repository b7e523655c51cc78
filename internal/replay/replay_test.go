package replay_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/replay"
	"github.com/ingestorhq/ingestor/internal/s3test"
	"github.com/ingestorhq/ingestor/internal/testconfig"
)

// t0 is the fetch time of the first seeded payload.
var t0 = time.Date(2024, 3, 5, 22, 0, 0, 0, time.UTC)

// fixture is a config whose source "feed" (http_poll, never polled here)
// has payloads in a raw store, and a data dir with no queue yet.
type fixture struct {
	cfg     *config.Config
	dataDir string
	raw     rawstore.Store
	// good holds the keys of the payloads that parse, in fetch order.
	good []string
	// bad is the key of a payload under feed/ that does not parse.
	bad string
	// dead is the key of a payload under deadletter/feed/ that parses
	// now (as after a parser fix).
	dead string
}

// newFixture seeds four payloads of three records each, fetched an hour
// apart from t0 (ids ev-1..ev-12; the last two are on the next UTC day), a
// malformed one at t0+30m and a dead-lettered one at t0+90m. rawTOML is
// the raw store's keys; empty means a raw dir.
func newFixture(t *testing.T, rawTOML string) *fixture {
	t.Helper()
	dir := t.TempDir()
	cfg := testconfig.Daemon{Dir: dir, RawStore: rawTOML, Rest: `[source.feed]
kind = "http_poll"
poll_url = "http://127.0.0.1:9/not-polled-by-replay"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
time_field = "ts"

[source.synthetic]
kind = "demo"
`}.Parse(t, "test.toml")
	raw, err := rawstore.Open(t.Context(), rawstore.Options{URL: cfg.RawStore.URL, Endpoint: cfg.RawStore.Endpoint,
		Region: cfg.RawStore.Region, PathStyle: cfg.RawStore.PathStyle})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{cfg: cfg, dataDir: filepath.Join(dir, "data"), raw: raw}
	for i := range 4 {
		var recs []string
		for n := 3*i + 1; n <= 3*i+3; n++ {
			recs = append(recs, fmt.Sprintf(`{"id":"ev-%d","seq":%d,"ts":"%s"}`, n, n, t0.Add(time.Duration(n)*time.Minute).Format(time.RFC3339)))
		}
		f.good = append(f.good, f.put(t, false, t0.Add(time.Duration(i)*time.Hour), "[\n"+strings.Join(recs, ",\n")+"\n]"))
	}
	f.bad = f.put(t, false, t0.Add(30*time.Minute), `{"error":"an object, not an array"}`)
	f.dead = f.put(t, true, t0.Add(90*time.Minute), `[{"id":"dl-1","seq":100},{"id":"dl-2","seq":101}]`)
	return f
}

// objectStore is a raw store that keeps each page as an object of its
// own, as S3 does (and the file store did before page segments).
type objectStore struct{ rawstore.Store }

// put writes body, a payload of feed fetched at at, as the daemon does: an
// object of its own, or with dead set a malformed payload under
// deadletter/; it returns the object's key.
func (f *fixture) put(t *testing.T, dead bool, at time.Time, body string) string {
	t.Helper()
	in := ingest.New(ingest.Options{Raw: objectStore{f.raw}})
	var p ingest.Payload
	if dead {
		p = ingest.DeadLetter("feed", at, []byte(body))
	} else {
		p = in.Page("feed", at, []byte(body))
	}
	if err := in.Write(t.Context(), &p); err != nil {
		t.Fatal(err)
	}
	return p.Ref().Key
}

// appendPage appends body, a page of feed fetched at at, to feed's page
// segment, as the daemon does on a file raw store, and returns where it is.
func (f *fixture) appendPage(t *testing.T, at time.Time, body string) ingest.Ref {
	t.Helper()
	in := ingest.New(ingest.Options{Raw: f.raw})
	p := in.Page("feed", at, []byte(body))
	if err := in.Write(t.Context(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Ref().Off == 0 {
		t.Fatalf("page written at %+v, want appended to a page segment", p.Ref())
	}
	return p.Ref()
}

// run replays with o (Source defaults to "feed") and returns the summary
// and the per-object reports.
func (f *fixture) run(t *testing.T, o replay.Options) (replay.Summary, []replay.Object) {
	t.Helper()
	if o.Source == "" {
		o.Source = "feed"
	}
	var objs []replay.Object
	o.Report = func(obj replay.Object) { objs = append(objs, obj) }
	sum, err := replay.Run(t.Context(), f.cfg, o)
	if err != nil {
		t.Fatalf("replay %+v: %v", o, err)
	}
	return sum, objs
}

// openQueue opens the data dir's queue, as the daemon would at its next
// start; the test closes it.
func (f *fixture) openQueue(t *testing.T) *queue.Queue {
	t.Helper()
	q, err := queue.Open(queue.Options{Path: filepath.Join(f.dataDir, "queue.db")})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// pending returns every pending event, in queue order.
func pending(t *testing.T, q *queue.Queue) (events []queue.Event, frames []int64) {
	t.Helper()
	for after := int64(0); ; {
		ids, err := q.FramesAfter(t.Context(), after, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) == 0 {
			return events, frames
		}
		for _, id := range ids {
			fr, ok, err := q.LoadFrame(t.Context(), id)
			if err != nil || !ok {
				t.Fatalf("load frame %d: %v %v", id, ok, err)
			}
			events = append(events, fr.Events...)
		}
		frames = append(frames, ids...)
		after = ids[len(ids)-1]
	}
}

func closeQueue(t *testing.T, q *queue.Queue) {
	t.Helper()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestReplayQueuesOnceThenDuplicates(t *testing.T) {
	f := newFixture(t, "")
	sum, objs := f.run(t, replay.Options{})
	want := replay.Summary{Objects: 5, Records: 12, Queued: 12, Malformed: 1}
	if sum != want {
		t.Fatalf("first replay: %+v, want %+v", sum, want)
	}
	// Objects come in fetch order; the malformed one is reported with
	// its key and reason, and skipped.
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key)
		if o.Key == f.bad {
			if !strings.Contains(o.Malformed, "array") || o.Records != 0 {
				t.Errorf("malformed object reported as %+v", o)
			}
		} else if o.Malformed != "" || o.Records != 3 || o.Queued != 3 || o.Duplicates != 0 {
			t.Errorf("object %s reported as %+v, want 3 records, all queued", o.Key, o)
		}
	}
	if wantKeys := []string{f.good[0], f.bad, f.good[1], f.good[2], f.good[3]}; !slices.Equal(keys, wantKeys) {
		t.Errorf("objects replayed in order %q\nwant %q", keys, wantKeys)
	}

	// What the daemon will send at its next start: every record, each
	// pointing at its bytes in the original raw object, fetched when it
	// was first fetched; no cursor was stored.
	q := f.openQueue(t)
	events, _ := pending(t, q)
	if len(events) != 12 {
		t.Fatalf("%d events pending, want 12", len(events))
	}
	for i, e := range events {
		wantKey := fmt.Sprintf("ev-%d", i+1)
		wantRaw := f.good[i/3]
		if e.Key != wantKey || e.Source != "feed" || e.RawKey != wantRaw {
			t.Errorf("event %d = %s/%s in %s, want feed/%s in %s", i, e.Source, e.Key, e.RawKey, wantKey, wantRaw)
			continue
		}
		if at := t0.Add(time.Duration(i/3) * time.Hour); !e.FetchedAt.Equal(at) {
			t.Errorf("event %s fetched at %v, want the original %v", e.Key, e.FetchedAt, at)
		}
		if et := t0.Add(time.Duration(i+1) * time.Minute); !e.EventTime.Equal(et) {
			t.Errorf("event %s time %v, want %v", e.Key, e.EventTime, et)
		}
		body, err := f.raw.Get(t.Context(), e.RawKey)
		if err != nil {
			t.Fatal(err)
		}
		if rec := body[e.RawOff : e.RawOff+e.RawLen]; !bytes.HasPrefix(rec, []byte(`{"id":"`+wantKey+`"`)) {
			t.Errorf("event %s points at %q", e.Key, rec)
		}
	}
	if c, ok, err := q.Cursor(t.Context(), "feed"); err != nil || ok {
		t.Errorf("replay stored a cursor %q (%v, %v)", c, ok, err)
	}
	closeQueue(t, q)

	// Again: every event is already queued.
	sum, _ = f.run(t, replay.Options{})
	want = replay.Summary{Objects: 5, Records: 12, Duplicates: 12, Malformed: 1}
	if sum != want {
		t.Fatalf("second replay: %+v, want %+v", sum, want)
	}
	q = f.openQueue(t)
	if events, _ := pending(t, q); len(events) != 12 {
		t.Errorf("%d events pending after the second replay, want still 12", len(events))
	}
	closeQueue(t, q)
}

func TestReplayForceRequeuesAckedEvents(t *testing.T) {
	f := newFixture(t, "")
	f.run(t, replay.Options{})

	// Forcing while the events are still pending queues nothing twice.
	if sum, _ := f.run(t, replay.Options{Force: true}); sum.Queued != 0 || sum.Forgotten != 0 || sum.Duplicates != 12 {
		t.Fatalf("forced replay of pending events: %+v, want 12 duplicates, none forgotten", sum)
	}

	// A processor acks everything; the queue remembers the keys.
	q := f.openQueue(t)
	_, frames := pending(t, q)
	if _, err := q.Ack(t.Context(), frames, nil); err != nil {
		t.Fatal(err)
	}
	closeQueue(t, q)
	if sum, _ := f.run(t, replay.Options{}); sum.Queued != 0 || sum.Duplicates != 12 {
		t.Fatalf("replay of acked events: %+v, want 12 duplicates", sum)
	}

	sum, objs := f.run(t, replay.Options{Force: true})
	want := replay.Summary{Objects: 5, Records: 12, Queued: 12, Forgotten: 12, Malformed: 1}
	if sum != want {
		t.Fatalf("forced replay: %+v, want %+v", sum, want)
	}
	for _, o := range objs {
		if o.Malformed == "" && (o.Forgotten != 3 || o.Queued != 3) {
			t.Errorf("object %s: %+v, want 3 forgotten and queued again", o.Key, o)
		}
	}
	q = f.openQueue(t)
	events, _ := pending(t, q)
	closeQueue(t, q)
	if len(events) != 12 {
		t.Fatalf("%d events pending after the forced replay, want 12", len(events))
	}
}

func TestReplayTimeRange(t *testing.T) {
	f := newFixture(t, "")
	// From is inclusive and To exclusive; the range crosses midnight UTC,
	// so two day directories are listed.
	sum, objs := f.run(t, replay.Options{From: t0.Add(time.Hour), To: t0.Add(3 * time.Hour)})
	if want := (replay.Summary{Objects: 2, Records: 6, Queued: 6}); sum != want {
		t.Fatalf("replay [t0+1h, t0+3h): %+v, want %+v", sum, want)
	}
	if len(objs) != 2 || objs[0].Key != f.good[1] || objs[1].Key != f.good[2] {
		t.Fatalf("replayed %+v, want %s and %s", objs, f.good[1], f.good[2])
	}
	// Open-ended ranges.
	if sum, _ := f.run(t, replay.Options{From: t0.Add(3 * time.Hour)}); sum.Objects != 1 || sum.Queued != 3 {
		t.Errorf("replay from t0+3h: %+v, want the last object", sum)
	}
	if sum, _ := f.run(t, replay.Options{To: t0.Add(time.Hour)}); sum.Objects != 2 || sum.Queued != 3 || sum.Malformed != 1 {
		t.Errorf("replay to t0+1h: %+v, want the first object and the malformed one", sum)
	}
	if _, err := replay.Run(t.Context(), f.cfg, replay.Options{Source: "feed", From: t0, To: t0}); err == nil ||
		!strings.Contains(err.Error(), "is not before") {
		t.Errorf("empty range: %v", err)
	}
}

func TestReplayDeadLetters(t *testing.T) {
	f := newFixture(t, "")
	sum, objs := f.run(t, replay.Options{DeadLetters: true, From: t0.Add(time.Hour), To: t0.Add(2 * time.Hour)})
	if want := (replay.Summary{Objects: 2, Records: 5, Queued: 5}); sum != want {
		t.Fatalf("replay with dead letters: %+v, want %+v", sum, want)
	}
	if len(objs) != 2 || objs[1].Key != f.dead || objs[1].Queued != 2 {
		t.Fatalf("replayed %+v, want the dead letter %s last", objs, f.dead)
	}
	q := f.openQueue(t)
	events, _ := pending(t, q)
	closeQueue(t, q)
	var fromDead []string
	for _, e := range events {
		if e.RawKey == f.dead {
			fromDead = append(fromDead, e.Key)
		}
	}
	if !slices.Equal(fromDead, []string{"dl-1", "dl-2"}) {
		t.Fatalf("events from the dead letter: %q", fromDead)
	}
}

func TestReplayDryRunWritesNothing(t *testing.T) {
	f := newFixture(t, "")
	sum, _ := f.run(t, replay.Options{DryRun: true, DeadLetters: true})
	if want := (replay.Summary{Objects: 6, Records: 14, Malformed: 1}); sum != want {
		t.Fatalf("dry run: %+v, want %+v", sum, want)
	}
	if _, err := os.Stat(f.dataDir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dry run created the data dir: %v", err)
	}
}

func TestReplayRefusesWhileDaemonRuns(t *testing.T) {
	f := newFixture(t, "")
	if err := os.MkdirAll(f.dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	unlock, err := datadir.Lock(f.dataDir) // what a running daemon holds
	if err != nil {
		t.Fatal(err)
	}
	_, err = replay.Run(t.Context(), f.cfg, replay.Options{Source: "feed"})
	if err == nil || !strings.Contains(err.Error(), "data dir "+f.dataDir+" is in use by another ingestor (pid ") ||
		!strings.Contains(err.Error(), "stop the daemon") {
		t.Fatalf("replay while locked: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.dataDir, "queue.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("refused replay opened the queue: %v", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	if sum, _ := f.run(t, replay.Options{}); sum.Queued != 12 {
		t.Fatalf("replay after the daemon stopped: %+v", sum)
	}
}

func TestReplayRefusals(t *testing.T) {
	f := newFixture(t, "")
	for _, tc := range []struct{ source, want string }{
		{"nosuch", `no source "nosuch" (the config has feed, synthetic)`},
		{"synthetic", `source "synthetic": kind demo cannot be replayed`},
	} {
		_, err := replay.Run(t.Context(), f.cfg, replay.Options{Source: tc.source})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("replay %s: %v, want %q", tc.source, err, tc.want)
		}
	}
}

func TestReplayFromS3(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	f := newFixture(t, fmt.Sprintf("url = %q\nendpoint = %q\npath_style = true", "s3://"+srv.Bucket+"/raw", srv.Endpoint))
	sum, _ := f.run(t, replay.Options{DeadLetters: true})
	if want := (replay.Summary{Objects: 6, Records: 14, Queued: 14, Malformed: 1}); sum != want {
		t.Fatalf("replay from S3: %+v, want %+v", sum, want)
	}
	q := f.openQueue(t)
	events, _ := pending(t, q)
	closeQueue(t, q)
	if len(events) != 14 || events[0].RawKey != f.good[0] {
		t.Fatalf("%d events pending, first in %q; want 14, first in %s", len(events), events[0].RawKey, f.good[0])
	}
}

// TestReplayPageSegments replays pages that a polled source appended to
// page segments (what the daemon writes on a file raw store) next to the
// fixture's objects of their own: each page is replayed with its own fetch
// time, its events point at their bytes in the segment, a time range
// selects pages (not segments), and a page whose bytes changed on disk is
// reported malformed and skipped while the pages around it are queued.
func TestReplayPageSegments(t *testing.T) {
	f := newFixture(t, "")
	var pages []ingest.Ref
	for i := range 3 {
		var recs []string
		for n := 100 + 3*i; n < 103+3*i; n++ {
			recs = append(recs, fmt.Sprintf(`{"id":"pg-%d","seq":%d,"ts":"%s"}`, n, n, t0.Format(time.RFC3339)))
		}
		pages = append(pages, f.appendPage(t, t0.Add(time.Duration(i)*10*time.Minute+time.Second), "[\n"+strings.Join(recs, ",\n")+"\n]"))
	}
	if pages[0].Key != pages[2].Key {
		t.Fatalf("pages in segments %q and %q, want one", pages[0].Key, pages[2].Key)
	}
	if err := f.raw.(rawstore.Appender).Close(); err != nil {
		t.Fatal(err)
	}

	// Only the second page is fetched in [t0+5m, t0+15m).
	sum, objs := f.run(t, replay.Options{From: t0.Add(5 * time.Minute), To: t0.Add(15 * time.Minute), DryRun: true})
	if sum.Objects != 1 || sum.Records != 3 || len(objs) != 1 || !objs[0].Page || objs[0].Off != pages[1].Off {
		t.Fatalf("dry run of [t0+5m, t0+15m): %+v %+v, want the second page only", sum, objs)
	}

	sum, _ = f.run(t, replay.Options{})
	if want := (replay.Summary{Objects: 8, Records: 21, Queued: 21, Malformed: 1}); sum != want {
		t.Fatalf("replay: %+v, want %+v", sum, want)
	}
	q := f.openQueue(t)
	events, _ := pending(t, q)
	closeQueue(t, q)
	seg, err := f.raw.Get(t.Context(), pages[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, e := range events {
		if !strings.HasPrefix(e.Key, "pg-") {
			continue
		}
		found++
		n, _ := strconv.Atoi(strings.TrimPrefix(e.Key, "pg-"))
		p := pages[(n-100)/3]
		if e.RawKey != p.Key || e.RawOff < p.Off || !bytes.HasPrefix(seg[e.RawOff:e.RawOff+e.RawLen], []byte(`{"id":"`+e.Key+`"`)) {
			t.Errorf("event %s at %s@%d+%d, want its bytes in the page at offset %d of %s", e.Key, e.RawKey, e.RawOff, e.RawLen, p.Off, p.Key)
		}
		if at := t0.Add(time.Duration((n-100)/3)*10*time.Minute + time.Second); !e.FetchedAt.Equal(at) {
			t.Errorf("event %s fetched at %v, want its page's %v", e.Key, e.FetchedAt, at)
		}
	}
	if found != 9 {
		t.Errorf("%d page events pending, want 9", found)
	}

	// Bit rot in the third page: it is skipped with the reason; the
	// first two are duplicates now.
	p := filepath.Join(strings.TrimPrefix(f.cfg.RawStore.URL, "file://"), filepath.FromSlash(pages[2].Key))
	seg[pages[2].Off+10] ^= 0x01
	if err := os.WriteFile(p, seg, 0o644); err != nil {
		t.Fatal(err)
	}
	sum, objs = f.run(t, replay.Options{From: t0, To: t0.Add(time.Hour)})
	if sum.Malformed != 2 || sum.Duplicates != 9 || sum.Queued != 0 {
		t.Errorf("replay after bit rot: %+v, want the rotten page and the fixture's malformed one skipped, 9 duplicates", sum)
	}
	var rotten bool
	for _, o := range objs {
		if o.Page && o.Off == pages[2].Off {
			rotten = strings.Contains(o.Malformed, "checksum")
		}
	}
	if !rotten {
		t.Errorf("the rotten page was not reported with a checksum error: %+v", objs)
	}
}

// TestReplayReportsAndSkipsCorruptObject flips a bit in the second good
// payload (its bytes no longer match the SHA-256 in its key) and garbles
// the first record header of a page segment: replay reports both as
// corrupt and skips them, and queues everything else, never the rotten
// bytes.
func TestReplayReportsAndSkipsCorruptObject(t *testing.T) {
	f := newFixture(t, "")
	dir := strings.TrimPrefix(f.cfg.RawStore.URL, "file://")
	p := filepath.Join(dir, filepath.FromSlash(f.good[1]))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("ev-4"))
	b[i+3] ^= 0x0c // ev-4 becomes ev-8: still parses, wrong bytes
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	page := f.appendPage(t, t0.Add(5*time.Minute), `[{"id":"pg-1","seq":50}]`)
	key, off := page.Key, page.Off
	if err := f.raw.(rawstore.Appender).Close(); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(dir, filepath.FromSlash(key))
	if b, err = os.ReadFile(seg); err != nil {
		t.Fatal(err)
	}
	copy(b[off-12:], "XXXX") // inside the header's fetched_at
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}

	sum, objs := f.run(t, replay.Options{})
	if want := (replay.Summary{Objects: 6, Records: 9, Queued: 9, Malformed: 3}); sum != want {
		t.Errorf("replay: %+v, want %+v (the rotten object, the garbled segment and the fixture's malformed one skipped)", sum, want)
	}
	reported := map[string]string{}
	for _, o := range objs {
		reported[o.Key] = o.Malformed
	}
	if m := reported[f.good[1]]; !strings.HasPrefix(m, "raw object corrupt: sha256 mismatch: "+f.good[1]) {
		t.Errorf("the rotten object reported as %q, want a sha256 mismatch", m)
	}
	if m := reported[key]; !strings.HasPrefix(m, "raw object corrupt: page header unreadable: "+key) {
		t.Errorf("the garbled segment reported as %q, want an unreadable page header", m)
	}
	q := f.openQueue(t)
	events, _ := pending(t, q)
	closeQueue(t, q)
	for _, e := range events {
		if e.RawKey == f.good[1] || e.RawKey == key {
			t.Errorf("event %s queued from the damaged %s", e.Key, e.RawKey)
		}
	}
}
