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

func openAppender(t *testing.T, dir string) rawstore.Appender {
	t.Helper()
	app, ok := openFile(t, dir).(rawstore.Appender)
	if !ok {
		t.Fatal("the file store is not an Appender")
	}
	t.Cleanup(func() {
		if err := app.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return app
}

// TestAppendReadsBackEveryPayload appends payloads of two sources and reads
// each back through Get at the offset Append returned, also from a Get
// done before later appends (the bytes a reader holds stay valid).
func TestAppendReadsBackEveryPayload(t *testing.T) {
	dir := t.TempDir()
	app := openAppender(t, dir)
	at := time.Date(2026, 11, 24, 20, 0, 0, 0, time.UTC)
	type put struct {
		key  string
		off  int
		body []byte
	}
	var puts []put
	var early []byte
	for i := range 20 {
		source := []string{"hooks", "devices"}[i%2]
		body := []byte(fmt.Sprintf(`{"id":"e%d"}`+"\n", i))
		key, off, err := app.Append(t.Context(), source, at.Add(time.Duration(i)*time.Millisecond), body)
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if !strings.HasPrefix(key, source+"/2026/11/24/") || !strings.HasSuffix(key, "-segment.jsonl") {
			t.Fatalf("append %d: key %q, want %s/2026/11/24/<nanos>-segment.jsonl", i, key, source)
		}
		puts = append(puts, put{key, off, body})
		if i == 2 {
			if early, err = app.Get(t.Context(), key); err != nil {
				t.Fatalf("get: %v", err)
			}
		}
	}
	if puts[0].key != puts[2].key || puts[1].key != puts[3].key || puts[0].key == puts[1].key {
		t.Fatalf("keys %q %q %q %q: want one segment per source", puts[0].key, puts[1].key, puts[2].key, puts[3].key)
	}
	for i, p := range puts {
		got, err := app.Get(t.Context(), p.key)
		if err != nil {
			t.Fatalf("get %s: %v", p.key, err)
		}
		if p.off+len(p.body) > len(got) || !bytes.Equal(got[p.off:p.off+len(p.body)], p.body) {
			t.Errorf("payload %d: not at offset %d of %s", i, p.off, p.key)
		}
	}
	if want := string(puts[0].body) + string(puts[2].body); string(early) != want {
		t.Errorf("early read %q, want %q", early, want)
	}
	if got := files(t, dir); len(got) != 2 {
		t.Errorf("files %v, want one segment per source", got)
	}
}

// TestAppendRollsSegments checks that a segment past SegmentMaxBytes, or
// of an earlier UTC day, is closed and the next payload starts a new one,
// every one of them readable.
func TestAppendRollsSegments(t *testing.T) {
	dir := t.TempDir()
	app := openAppender(t, dir)
	at := time.Date(2026, 11, 24, 23, 59, 0, 0, time.UTC)
	body := bytes.Repeat([]byte("x"), rawstore.SegmentMaxBytes/3+1)
	keys := map[string]int{}
	for i := range 4 {
		key, off, err := app.Append(t.Context(), "hooks", at, body)
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		keys[key]++
		if want := (i % 3) * len(body); off != want {
			t.Errorf("append %d: offset %d, want %d", i, off, want)
		}
	}
	if len(keys) != 2 {
		t.Fatalf("segments %v, want 2: three payloads fill one past %d bytes", keys, rawstore.SegmentMaxBytes)
	}
	key, off, err := app.Append(t.Context(), "hooks", at.Add(2*time.Minute), []byte("next day\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, "hooks/2026/11/25/") || off != 0 {
		t.Errorf("a payload of the next day went to %s at %d, want a new segment under hooks/2026/11/25/", key, off)
	}
	if got := files(t, dir); len(got) != 3 {
		t.Errorf("files %v, want 3 segments", got)
	}
}

// TestAppendAfterAFailedWriteStartsANewSegment makes the disk under an
// open segment full (its descriptor now writes to /dev/full, which answers
// ENOSPC): Append fails, and the next one goes to a new segment instead of
// after bytes that may be partial.
func TestAppendAfterAFailedWriteStartsANewSegment(t *testing.T) {
	dir := t.TempDir()
	app := openAppender(t, dir)
	at := time.Date(2026, 11, 24, 20, 0, 0, 0, time.UTC)
	first, _, err := app.Append(t.Context(), "hooks", at, []byte("one\n"))
	if err != nil {
		t.Fatal(err)
	}
	fillDisk(t, filepath.Join(dir, filepath.FromSlash(first)))
	if _, _, err := app.Append(t.Context(), "hooks", at, []byte("two\n")); err == nil {
		t.Fatal("append to a segment on a full disk succeeded")
	}
	key, off, err := app.Append(t.Context(), "hooks", at, []byte("three\n"))
	if err != nil {
		t.Fatalf("append after the failure: %v", err)
	}
	if key == first || off != 0 {
		t.Errorf("after a failed write the payload went to %s at %d, want a new segment", key, off)
	}
	if got, err := app.Get(t.Context(), key); err != nil || string(got) != "three\n" {
		t.Errorf("new segment holds %q (%v), want %q", got, err, "three\n")
	}
	if got, err := app.Get(t.Context(), first); err != nil || string(got) != "one\n" {
		t.Errorf("first segment holds %q (%v), want %q", got, err, "one\n")
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
	app, ok := openFile(t, t.TempDir()).(rawstore.Appender)
	if !ok {
		t.Fatal("the file store is not an Appender")
	}
	if _, _, err := app.Append(t.Context(), "hooks", time.Now(), []byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if err := app.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := app.Append(t.Context(), "hooks", time.Now(), []byte("y\n")); err == nil {
		t.Fatal("append after Close succeeded")
	}
}
