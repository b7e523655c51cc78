package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/ingest/ingesttest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
)

// ledger is a data dir filled by hand: a raw object and three pages of a
// page segment, each holding two pending events, the third page's
// dead-lettered.
type ledger struct {
	cfgPath, data, rawDir string
	object, segment       string
	pageOffs              []int
}

// newLedger writes a daemon config under dir and fills its data dir and
// raw store as a stopped daemon would leave them.
func newLedger(t *testing.T, dir string) *ledger {
	t.Helper()
	cfgPath, cfg := writeDaemonConfig(t, dir, "", "", "")
	l := &ledger{cfgPath: cfgPath, data: cfg.Daemon.DataDir, rawDir: strings.TrimPrefix(cfg.RawStore.URL, "file://")}
	previousRun(t, l.data)
	ctx := t.Context()
	q, err := queue.Open(queue.Options{Path: filepath.Join(l.data, "queue.db"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := rawstore.Open(ctx, rawstore.Options{URL: cfg.RawStore.URL})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	queueTwo := func(key string, off int, prefix string) []queue.Frame {
		frames, err := q.Append(ctx, queue.Batch{Source: "feed", RawKey: key, FetchedAt: at, Events: []queue.NewEvent{
			{Key: prefix + "-0", RawOff: off + 1, RawLen: 13}, {Key: prefix + "-1", RawOff: off + 15, RawLen: 13}}})
		if err != nil {
			t.Fatal(err)
		}
		return frames
	}
	body := []byte(`[{"id":"ob-0"},{"id":"ob-1"}]`)
	l.object = ingesttest.WriteObject(t, raw, "feed", at, body)
	queueTwo(l.object, 0, "ob")
	var frames []queue.Frame
	for p := range 3 {
		ref := ingesttest.WritePage(t, raw, "feed", at, fmt.Appendf(nil, `[{"id":"p%d-0"},{"id":"p%d-1"}]`, p, p))
		l.segment, l.pageOffs = ref.Key, append(l.pageOffs, ref.Off)
		frames = queueTwo(ref.Key, ref.Off, fmt.Sprintf("p%d", p))
	}
	var seqs []int64
	for _, e := range frames[0].Events {
		seqs = append(seqs, e.Seq)
	}
	if _, err := q.DeadLetterEvents(ctx, frames[0].ID, seqs, "poison"); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(raw.(rawstore.Appender).Close(), q.Close()); err != nil {
		t.Fatal(err)
	}
	return l
}

// damage rewrites the raw file key under the ledger's raw store with f.
func (l *ledger) damage(t *testing.T, key string, f func([]byte) []byte) {
	t.Helper()
	p := filepath.Join(l.rawDir, filepath.FromSlash(key))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, f(b), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runBinary runs the built ingestor with args and returns its exit code
// and combined output. A command that should end by itself and runs for a
// minute fails the test (a daemon that started when it should not have).
func runBinary(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("ingestor %v still ran after a minute\n%s", args, tail(string(out)))
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("run %s %v: %v", bin, args, err)
	return 0, ""
}

// TestDoctorFindsDamagedRawBytes runs the built `ingestor doctor` on a
// sound data dir (exit 0), then after a bit flip in the raw object, a bit
// flip in the second page and the segment cut inside the third (whose
// events are dead letters): exit 1, one line per damaged object or page
// naming it and the events it affects.
func TestDoctorFindsDamagedRawBytes(t *testing.T) {
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	l := newLedger(t, dir)
	code, out := runBinary(t, bin, "doctor", "-c", l.cfgPath)
	if code != 0 || !strings.Contains(out, "integrity_check\n  ok") || !strings.Contains(out, "ok: 1 objects, 3 pages, 8 references") ||
		!strings.Contains(out, "no problem found") {
		t.Fatalf("doctor on a sound data dir: exit %d\n%s", code, out)
	}
	l.damage(t, l.object, func(b []byte) []byte { b[10] ^= 0x01; return b })
	l.damage(t, l.segment, func(b []byte) []byte { b[l.pageOffs[1]+9] ^= 0x01; return b[:l.pageOffs[2]+5] })
	code, out = runBinary(t, bin, "doctor", "-c", l.cfgPath)
	for _, want := range []string{
		"PROBLEM: raw object corrupt: sha256 mismatch: " + l.object + ": ",
		"(events: 2 pending, 0 dead-lettered)",
		fmt.Sprintf("PROBLEM: raw object corrupt: page crc mismatch: %s@%d: ", l.segment, l.pageOffs[1]),
		fmt.Sprintf("PROBLEM: raw object corrupt: page truncated: %s@%d: ", l.segment, l.pageOffs[2]),
		"(events: 0 pending, 2 dead-lettered)",
		"3 problem(s) found",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor's report lacks %q", want)
		}
	}
	if code != 1 {
		t.Errorf("doctor on a damaged raw store: exit %d, want 1", code)
	}
	if t.Failed() {
		t.Logf("doctor's output:\n%s", out)
	}
	if err := os.Remove(filepath.Join(l.rawDir, filepath.FromSlash(l.object))); err != nil {
		t.Fatal(err)
	}
	if code, out = runBinary(t, bin, "doctor", "-c", l.cfgPath); code != 1 || !strings.Contains(out, "PROBLEM: raw object missing: "+l.object+" (events: 2 pending") {
		t.Errorf("doctor with a raw object gone: exit %d\n%s", code, out)
	}
}

// TestDoctorRefusesWhileTheDataDirIsLocked runs `ingestor doctor` while
// another ingestor holds the data dir's lock: it exits 1 saying so, and
// checks nothing.
func TestDoctorRefusesWhileTheDataDirIsLocked(t *testing.T) {
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	l := newLedger(t, dir)
	unlock, err := datadir.Lock(l.data)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unlock(); err != nil {
			t.Error(err)
		}
	}()
	code, out := runBinary(t, bin, "doctor", "-c", l.cfgPath)
	want := fmt.Sprintf("ingestor doctor: data dir %s is in use by another ingestor (pid %d): stop it first", l.data, os.Getpid())
	if code != 1 || !strings.Contains(out, want) || strings.Contains(out, "integrity_check") {
		t.Errorf("doctor on a locked data dir: exit %d, want 1 and %q\n%s", code, want, out)
	}
}

// TestDamagedQueueRefusesToStart damages queue.db three ways (cut in
// half, a garbled page, a garbled header): the built daemon exits 1 at
// start naming the file, SQLite's finding and what to do, and changes
// nothing; `ingestor doctor` then reports the damage and exits 1.
func TestDamagedQueueRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	for _, c := range []struct {
		name, sqlite string
		damage       func([]byte) []byte
	}{
		{"truncated", "database disk image is malformed", func(b []byte) []byte { return b[:len(b)/2] }},
		{"garbled page", "", func(b []byte) []byte {
			for i := 4096; i < 8192; i++ {
				b[i] = byte(i * 7)
			}
			return b
		}},
		{"garbled header", "file is not a database", func(b []byte) []byte { copy(b, "not SQLite at all"); return b }},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLedger(t, t.TempDir())
			qpath := filepath.Join(l.data, "queue.db")
			b, err := os.ReadFile(qpath)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(qpath, c.damage(b), 0o644); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, l.data)
			code, out := runBinary(t, bin, "run", "-c", l.cfgPath)
			for _, want := range []string{"queue database " + qpath + " is damaged: ", c.sqlite, "refusing to start",
				"ingestor doctor -c " + l.cfgPath, "restore queue.db from a backup", "ingestor replay -c " + l.cfgPath} {
				if !strings.Contains(out, want) {
					t.Errorf("the daemon's output lacks %q", want)
				}
			}
			if code != 1 {
				t.Errorf("the daemon on a damaged queue: exit %d, want 1", code)
			}
			if after := snapshot(t, l.data); !sameFiles(l.data, before, after) {
				t.Errorf("the refused start changed the data dir:\nbefore:\n%safter:\n%s", before, after)
			}
			if t.Failed() {
				t.Logf("the daemon's output:\n%s", tail(out))
			}
			if code, out := runBinary(t, bin, "doctor", "-c", l.cfgPath); code != 1 || !strings.Contains(out, "PROBLEM: ") {
				t.Errorf("doctor on a damaged queue: exit %d, want 1 and its problems\n%s", code, out)
			}
		})
	}
}

// sameFiles compares two snapshots of dir, leaving out dir itself (SQLite
// creates and removes its -wal and -shm files) and the LOCK file, which a
// start that took the lock rewrites with its pid.
func sameFiles(dir, before, after string) bool {
	keep := func(s string) string {
		var b bytes.Buffer
		for _, line := range strings.SplitAfter(s, "\n") {
			if !strings.HasPrefix(line, dir+" ") && !strings.HasPrefix(line, filepath.Join(dir, "LOCK")+" ") {
				b.WriteString(line)
			}
		}
		return b.String()
	}
	return keep(before) == keep(after)
}
