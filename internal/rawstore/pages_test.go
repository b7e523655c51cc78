package rawstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/rawstore"
)

func openPageAppender(t *testing.T, dir string) rawstore.PageAppender {
	t.Helper()
	s := openFile(t, dir)
	app, ok := s.(rawstore.PageAppender)
	if !ok {
		t.Fatal("the file store is not a PageAppender")
	}
	t.Cleanup(func() {
		if err := s.(rawstore.Appender).Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return app
}

type appendedPage struct {
	key  string
	off  int
	at   time.Time
	body []byte
}

// TestAppendPageReadsBackEveryPage appends pages of two sources, whose
// bodies hold newlines and text that looks like a record header, then
// reads each back by range at the offset AppendPage returned, and page by
// page from the whole segment with ReadPages.
func TestAppendPageReadsBackEveryPage(t *testing.T) {
	dir := t.TempDir()
	app := openPageAppender(t, dir)
	at := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	var pages []appendedPage
	for i := range 10 {
		source := []string{"orders", "users"}[i%2]
		body := []byte(fmt.Sprintf("[\n {\"id\":%d},\n \"#ingestor-page len=3 crc32c=00000000 fetched_at=1\\n\"\n]", i))
		when := at.Add(time.Duration(i) * time.Second)
		key, off, err := app.AppendPage(t.Context(), source, when, body)
		if err != nil {
			t.Fatalf("append page %d: %v", i, err)
		}
		if !strings.HasPrefix(key, source+"/2026/11/25/") || !rawstore.IsPageSegment(key) {
			t.Fatalf("page %d: key %q, want %s/2026/11/25/<nanos>-pages.seg", i, key, source)
		}
		pages = append(pages, appendedPage{key, off, when, body})
	}
	if got := files(t, dir); len(got) != 2 {
		t.Fatalf("files %v, want one page segment per source", got)
	}
	pr := app.(rawstore.PageReader)
	var ix rawstore.PageIndex
	for i, p := range pages {
		for _, off := range []int{p.off + len(p.body) - 1, p.off, p.off + len(p.body)/2} {
			ref, err := pr.FindPage(t.Context(), p.key, off, &ix)
			if err != nil {
				t.Fatalf("page %d: find offset %d: %v", i, off, err)
			}
			if ref.Off != p.off || ref.Len != len(p.body) || !ref.FetchedAt.Equal(p.at) {
				t.Fatalf("page %d: offset %d found %+v, want the page at %d, %d bytes, fetched %v", i, off, ref, p.off, len(p.body), p.at)
			}
			got, err := pr.ReadPage(t.Context(), p.key, ref)
			if err != nil {
				t.Fatalf("page %d: %v", i, err)
			}
			if !bytes.Equal(got, p.body) {
				t.Errorf("page %d: read %q, want %q", i, got, p.body)
			}
		}
	}
	for _, key := range []string{pages[0].key, pages[1].key} {
		seg, err := app.Get(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		var want []appendedPage
		for _, p := range pages {
			if p.key == key {
				want = append(want, p)
			}
		}
		var got []rawstore.Page
		if err := rawstore.ReadPages(key, seg, func(p rawstore.Page) error { got = append(got, p); return nil }); err != nil {
			t.Fatalf("read pages of %s: %v", key, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d pages read, want %d", key, len(got), len(want))
		}
		for i := range got {
			if got[i].Err != nil || got[i].Off != want[i].off || !got[i].FetchedAt.Equal(want[i].at) || !bytes.Equal(got[i].Body, want[i].body) {
				t.Errorf("%s page %d: read {off %d, at %v, err %v, %q}, want {off %d, at %v, %q}", key, i,
					got[i].Off, got[i].FetchedAt, got[i].Err, got[i].Body, want[i].off, want[i].at, want[i].body)
			}
		}
	}
}

// TestPageSegmentsRoll checks that a page segment past
// PageSegmentMaxBytes, or of an earlier UTC day, is closed and the next
// page starts a new one.
func TestPageSegmentsRoll(t *testing.T) {
	dir := t.TempDir()
	app := openPageAppender(t, dir)
	at := time.Date(2026, 11, 25, 23, 59, 0, 0, time.UTC)
	body := bytes.Repeat([]byte("x"), rawstore.PageSegmentMaxBytes/2)
	keys := map[string]int{}
	for i := range 3 {
		key, _, err := app.AppendPage(t.Context(), "orders", at, body)
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		keys[key]++
	}
	if len(keys) != 2 {
		t.Fatalf("segments %v, want 2: two pages fill one past %d bytes", keys, rawstore.PageSegmentMaxBytes)
	}
	key, _, err := app.AppendPage(t.Context(), "orders", at.Add(2*time.Minute), []byte("[]"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, "orders/2026/11/26/") {
		t.Errorf("a page of the next day went to %s, want a new segment under orders/2026/11/26/", key)
	}
	if got := files(t, dir); len(got) != 3 {
		t.Errorf("files %v, want 3 page segments", got)
	}
}

// TestPageSegmentsRollByAge checks Options.SegmentMaxAge: a segment opened
// longer ago than it is closed and the next page starts a new one (a
// nanosecond: every page gets its own), and without it pages share one.
func TestPageSegmentsRollByAge(t *testing.T) {
	for _, age := range []time.Duration{0, time.Nanosecond} {
		dir := t.TempDir()
		s, err := rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + dir, SegmentMaxAge: age})
		if err != nil {
			t.Fatal(err)
		}
		app := s.(rawstore.PageAppender)
		keys := map[string]bool{}
		for range 3 {
			key, _, err := app.AppendPage(t.Context(), "orders", time.Now(), []byte("[]"))
			if err != nil {
				t.Fatal(err)
			}
			keys[key] = true
		}
		if want := map[time.Duration]int{0: 1, time.Nanosecond: 3}[age]; len(keys) != want {
			t.Errorf("SegmentMaxAge %v: pages went to %d segments, want %d", age, len(keys), want)
		}
		if err := s.(rawstore.Appender).Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadPagesFindsDamage cuts a segment's last record short (what a
// crash during an append leaves), which ends the segment quietly, also
// when zeros written ahead follow the cut, and flips a byte in a body,
// which that page reports, and garbles a header, which is an error.
func TestReadPagesFindsDamage(t *testing.T) {
	dir := t.TempDir()
	app := openPageAppender(t, dir)
	at := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	var key string
	var offs []int
	end := 0
	for i := range 3 {
		body := []byte(fmt.Sprintf(`[{"id":%d}]`, i))
		k, off, err := app.AppendPage(t.Context(), "orders", at, body)
		if err != nil {
			t.Fatal(err)
		}
		key = k
		offs = append(offs, off)
		end = off + len(body) + 1
	}
	// The segment is open: the zeros written ahead of the appends follow
	// its records, as they do after a crash.
	open, err := app.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(open) <= end || len(bytes.Trim(open[end:], "\x00")) != 0 {
		t.Fatalf("the open segment is %d bytes, its records %d: want zeros written ahead after them", len(open), end)
	}
	seg := open[:end]
	count := func(b []byte) (n int, bad []int, err error) {
		err = rawstore.ReadPages(key, b, func(p rawstore.Page) error {
			n++
			if p.Err != nil {
				bad = append(bad, p.Off)
			}
			return nil
		})
		return n, bad, err
	}
	if n, bad, err := count(open); err != nil || n != 3 || bad != nil {
		t.Fatalf("the open segment: %d pages, bad %v, err %v; want 3 whole pages", n, bad, err)
	}
	for cut := offs[2] - 30; cut < len(seg); cut++ {
		if n, bad, err := count(seg[:cut]); err != nil || n != 2 || bad != nil {
			t.Fatalf("cut at %d of %d: %d pages, bad %v, err %v; want the 2 whole pages", cut, len(seg), n, bad, err)
		}
		zeros := append(bytes.Clone(seg[:cut]), make([]byte, 4096)...)
		if n, bad, err := count(zeros); err != nil || n != 2 || bad != nil {
			t.Fatalf("cut at %d of %d, zeros after: %d pages, bad %v, err %v; want the 2 whole pages", cut, len(seg), n, bad, err)
		}
	}
	rot := bytes.Clone(seg)
	rot[offs[1]+3] ^= 0x20
	if n, bad, err := count(rot); err != nil || n != 3 || len(bad) != 1 || bad[0] != offs[1] {
		t.Errorf("a flipped byte: %d pages, bad %v, err %v; want 3 pages, page at %d bad", n, bad, err, offs[1])
	}
	garbled := bytes.Clone(seg)
	copy(garbled[offs[1]-20:], "XXXX")
	if _, _, err := count(garbled); err == nil {
		t.Error("a garbled header read without error")
	}
}

// TestPageReaderFindsDamage flips a byte in the middle page of a page
// segment and cuts its last page short: FindPage and ReadPage report the
// damaged pages as *CorruptError (a crc mismatch, a truncation) and still
// read the page before them; a missing segment is fs.ErrNotExist.
func TestPageReaderFindsDamage(t *testing.T) {
	dir := t.TempDir()
	app := openPageAppender(t, dir)
	pr := app.(rawstore.PageReader)
	at := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	var key string
	var offs []int
	for i := range 3 {
		k, off, err := app.AppendPage(t.Context(), "orders", at, []byte(fmt.Sprintf(`[{"id":%d}]`, i)))
		if err != nil {
			t.Fatal(err)
		}
		key, offs = k, append(offs, off)
	}
	p := filepath.Join(dir, filepath.FromSlash(key))
	seg, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	seg[offs[1]+3] ^= 0x20
	if err := os.WriteFile(p, seg[:offs[2]+4], 0o644); err != nil {
		t.Fatal(err)
	}
	var ix rawstore.PageIndex
	read := func(off int) ([]byte, error) {
		ref, err := pr.FindPage(t.Context(), key, off, &ix)
		if err != nil {
			return nil, err
		}
		return pr.ReadPage(t.Context(), key, ref)
	}
	if got, err := read(offs[0] + 2); err != nil || string(got) != `[{"id":0}]` {
		t.Errorf("the good page: %q, %v", got, err)
	}
	for i, what := range map[int]string{1: "page crc mismatch", 2: "page truncated"} {
		_, err := read(offs[i] + 1)
		var ce *rawstore.CorruptError
		if !errors.As(err, &ce) || !errors.Is(err, rawstore.ErrCorrupt) || ce.What != what || ce.Key != key || ce.Off != offs[i] {
			t.Errorf("page %d: %v, want a *CorruptError %q at %s@%d", i, err, what, key, offs[i])
		} else if want := fmt.Sprintf("raw object corrupt: %s: %s@%d", what, key, offs[i]); ce.Reason() != want {
			t.Errorf("page %d: reason %q, want %q", i, ce.Reason(), want)
		}
	}
	if _, err := pr.FindPage(t.Context(), "orders/2026/11/25/1-pages.seg", 0, &ix); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing segment: %v, want fs.ErrNotExist", err)
	}
}

// TestGetFindsCorruptObject stores objects under Key's keys, then flips a
// bit in one and truncates another: Get reports both as a *CorruptError
// naming the sha256 mismatch, and still reads a key without a hash.
func TestGetFindsCorruptObject(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir)
	at := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	body := []byte(`[{"id":1},{"id":2}]`)
	flipped, cut := rawstore.Key("src", at, body), rawstore.Key("src", at.Add(1), body)
	for _, key := range []string{flipped, cut, "src/plain.json"} {
		if err := s.Put(t.Context(), key, body); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(t.Context(), key); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("get %s: %q, %v", key, got, err)
		}
	}
	damage := func(key string, f func([]byte) []byte) {
		p := filepath.Join(dir, filepath.FromSlash(key))
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	damage(flipped, func(b []byte) []byte { b[8] ^= 0x01; return b })
	damage(cut, func(b []byte) []byte { return b[:len(b)-3] })
	damage("src/plain.json", func(b []byte) []byte { return b[:3] })
	for _, key := range []string{flipped, cut} {
		_, err := s.Get(t.Context(), key)
		var ce *rawstore.CorruptError
		if !errors.As(err, &ce) || ce.What != "sha256 mismatch" || ce.Reason() != "raw object corrupt: sha256 mismatch: "+key {
			t.Errorf("get the damaged %s: %v, want a sha256 mismatch", key, err)
		}
	}
	if got, err := s.Get(t.Context(), "src/plain.json"); err != nil || string(got) != `[{"` {
		t.Errorf("a key without a hash: %q, %v; want its bytes as they are", got, err)
	}
}
