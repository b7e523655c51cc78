package rawstore_test

import (
	"os"
	"path/filepath"
	"strconv"
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
