package rawstore_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/rawstore"
)

// TestAppendAfterAFailedWriteStartsANewSegment makes the disk under an
// open segment full (its descriptor now writes to /dev/full, which answers
// ENOSPC): AppendPage fails, and the next one goes to a new segment instead
// of after bytes that may be partial.
func TestAppendAfterAFailedWriteStartsANewSegment(t *testing.T) {
	dir := t.TempDir()
	app := openPageAppender(t, dir)
	at := time.Date(2026, 11, 24, 20, 0, 0, 0, time.UTC)
	first, firstOff, err := app.AppendPage(t.Context(), "hooks", at, []byte("one\n"))
	if err != nil {
		t.Fatal(err)
	}
	fillDisk(t, filepath.Join(dir, filepath.FromSlash(first)))
	if _, _, err := app.AppendPage(t.Context(), "hooks", at, []byte("two\n")); err == nil {
		t.Fatal("append to a segment on a full disk succeeded")
	}
	key, off, err := app.AppendPage(t.Context(), "hooks", at, []byte("three\n"))
	if err != nil {
		t.Fatalf("append after the failure: %v", err)
	}
	if key == first || off != firstOff {
		t.Errorf("after a failed write the page went to %s at %d, want the first record of a new segment", key, off)
	}
	for k, want := range map[string]string{key: "three\n", first: "one\n"} {
		seg, err := app.Get(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		if err := rawstore.ReadPages(k, seg, func(p rawstore.Page) error { got = append(got, string(p.Body)); return p.Err }); err != nil || len(got) != 1 || got[0] != want {
			t.Errorf("segment %s holds pages %q (%v), want only %q", k, got, err, want)
		}
	}
}

// fillDisk points every descriptor of this process open on path at
// /dev/full, so that writing to it fails with ENOSPC.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("open /dev/full: %v", err)
	}
	defer full.Close()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("list open files: %v", err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err != nil || target != path {
			continue
		}
		num, err := strconv.Atoi(fd.Name())
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Dup3(int(full.Fd()), num, 0); err != nil {
			t.Fatalf("dup3: %v", err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("no open descriptor of %s", path)
	}
}

// TestAppendAfterClose fails.
func TestAppendAfterClose(t *testing.T) {
	s := openFile(t, t.TempDir())
	app := s.(rawstore.PageAppender)
	if _, _, err := app.AppendPage(t.Context(), "hooks", time.Now(), []byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.(rawstore.Appender).Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := app.AppendPage(t.Context(), "hooks", time.Now(), []byte("y\n")); err == nil {
		t.Fatal("append after Close succeeded")
	}
}

// TestSmallAppendsGoIntoZerosWrittenAhead appends small pages past the
// first megabyte of zeros written ahead of them: while the segment is
// open its file is whole megabytes long, and every page reads back by
// FindPage and ReadPage and page by page; Close cuts the zeros off. A
// large page on its own is appended without zeros after it.
func TestSmallAppendsGoIntoZerosWrittenAhead(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir)
	app := s.(rawstore.PageAppender)
	at := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	type page struct {
		off  int
		body []byte
	}
	var pages []page
	var key string
	end := 0
	for i := range 300 { // 300 records of ~5 KB: past the first MiB
		body := []byte(fmt.Sprintf("%d:%s", i, strings.Repeat("x", 5000)))
		k, off, err := app.AppendPage(t.Context(), "hooks", at, body)
		if err != nil {
			t.Fatal(err)
		}
		key = k
		pages = append(pages, page{off, body})
		end = off + len(body) + 1
	}
	path := filepath.Join(dir, filepath.FromSlash(key))
	size := func() int {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return int(fi.Size())
	}
	if got := size(); got != 2<<20 || end <= 1<<20 {
		t.Fatalf("open segment: file of %d bytes holding %d bytes of records, want 2 MiB holding more than 1 MiB", got, end)
	}
	pr := app.(rawstore.PageReader)
	var ix rawstore.PageIndex
	for i, p := range pages {
		ref, err := pr.FindPage(t.Context(), key, p.off, &ix)
		if err != nil {
			t.Fatalf("page %d: %v", i, err)
		}
		body, err := pr.ReadPage(t.Context(), key, ref)
		if err != nil || !bytes.Equal(body, p.body) {
			t.Fatalf("page %d read back as %.20q (%v)", i, body, err)
		}
	}
	readAll := func(what string) {
		seg, err := app.Get(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		err = rawstore.ReadPages(key, seg, func(p rawstore.Page) error {
			if p.Err != nil || p.Off != pages[n].off || !bytes.Equal(p.Body, pages[n].body) {
				return fmt.Errorf("page %d: at %d, %.20q, %v", n, p.Off, p.Body, p.Err)
			}
			n++
			return nil
		})
		if err != nil || n != len(pages) {
			t.Fatalf("%s: read %d pages of %d: %v", what, n, len(pages), err)
		}
	}
	readAll("open segment")
	big := bytes.Repeat([]byte("y"), 100<<10)
	bigKey, _, err := app.AppendPage(t.Context(), "polled", at, big)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.(rawstore.Appender).Close(); err != nil {
		t.Fatal(err)
	}
	if got := size(); got != end {
		t.Errorf("closed segment: file of %d bytes, want its %d bytes of records", got, end)
	}
	readAll("closed segment")
	fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(bigKey)))
	if err != nil {
		t.Fatal(err)
	}
	if want := len(big) + 100; fi.Size() > int64(want) {
		t.Errorf("a segment holding one 100 KiB page is %d bytes: zeros were written ahead of a large page", fi.Size())
	}
}

// A page reserved is written where ReservePage said, and the source's
// next page goes after it, whichever started first.
func TestReservedPageIsWrittenWhereItWasReserved(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir)
	res := s.(rawstore.PageReserver)
	at := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	body := []byte("reserved\n")
	key, off, write, err := res.ReservePage(t.Context(), "hooks", at, body)
	if err != nil {
		t.Fatal(err)
	}
	type appended struct {
		key string
		off int
		err error
	}
	next := make(chan appended, 1)
	go func() {
		k, o, err := res.AppendPage(t.Context(), "hooks", at, []byte("next\n"))
		next <- appended{k, o, err}
	}()
	if err := write(); err != nil {
		t.Fatal(err)
	}
	after := <-next
	if after.err != nil {
		t.Fatal(after.err)
	}
	if after.key != key || after.off <= off+len(body) {
		t.Errorf("the next page is at %s:%d, want after the reserved one at %s:%d", after.key, after.off, key, off)
	}
	got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(key)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[off:off+len(body)], body) {
		t.Errorf("at the reserved offset %d: %q, want %q", off, got[off:off+len(body)], body)
	}
}
