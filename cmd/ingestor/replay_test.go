package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/ingest/ingesttest"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/testconfig"
)

// writeConfig writes dir/ingestor.toml, an ingestor config with a data
// dir and a raw dir under dir and the given source blocks, and returns its
// path.
func writeConfig(t *testing.T, dir, sourcesTOML string) string {
	t.Helper()
	return testconfig.Daemon{Dir: dir, Rest: sourcesTOML}.Write(t, filepath.Join(dir, "ingestor.toml"))
}

const replayFeedTOML = `
[source.feed]
kind = "http_poll"
poll_url = "http://127.0.0.1:9/replay-never-polls"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
`

func TestReplayCommand(t *testing.T) {
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, replayFeedTOML)
	raw, err := rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + filepath.Join(dir, "raw")})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2024, 3, 5, 10, 0, 0, 0, time.UTC)
	var keys []string
	for i, body := range []string{
		`[{"id":"a","seq":1},{"id":"b","seq":2}]`,
		`not json at all`,
		`[{"id":"c","seq":3},{"id":"d","seq":4},{"id":"e","seq":5}]`,
	} {
		keys = append(keys, ingesttest.WriteObject(t, raw, "feed", at.Add(time.Duration(i)*time.Hour), []byte(body)))
	}
	replayCmd := func(args ...string) (code int, stdout, stderr string) {
		var out, errb bytes.Buffer
		code = run(append([]string{"replay", "-c", cfgPath, "-source", "feed"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}

	code, out, errOut := replayCmd("-dry-run")
	if code != 0 || !strings.Contains(out, "summary: 3 objects, 5 records, 0 queued, 0 duplicates, 1 malformed") ||
		!strings.Contains(out, "dry run: nothing was written") {
		t.Fatalf("dry run: exit %d\n%s%s", code, out, errOut)
	}

	code, out, errOut = replayCmd()
	if code != 0 {
		t.Fatalf("replay: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		`replaying source "feed" from file://`,
		keys[0] + " (fetched 2024-03-05T10:00:00Z): 2 records, 2 new, 0 duplicates\n",
		keys[1] + " (fetched 2024-03-05T11:00:00Z): malformed, skipped: ",
		keys[2] + " (fetched 2024-03-05T12:00:00Z): 3 records, 3 new, 0 duplicates\n",
		"summary: 3 objects, 5 records, 5 queued, 0 duplicates, 1 malformed\n",
		"5 events are queued: start the daemon to deliver them",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("replay output lacks %q:\n%s", want, out)
		}
	}

	code, out, _ = replayCmd()
	if code != 0 || !strings.Contains(out, "summary: 3 objects, 5 records, 0 queued, 5 duplicates, 1 malformed\n") {
		t.Errorf("second replay: exit %d\n%s", code, out)
	}
	code, out, _ = replayCmd("-from", "2024-03-05T12:00:00Z", "-force")
	if code != 0 || !strings.Contains(out, "summary: 1 objects, 3 records, 0 queued, 3 duplicates, 0 malformed, 0 forgotten and queued again\n") {
		t.Errorf("forced replay of pending events: exit %d\n%s", code, out)
	}

	// While a daemon holds the data dir, replay refuses and says why.
	unlock, err := datadir.Lock(filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = replayCmd()
	if code != 1 || !strings.Contains(errOut, "is in use by another ingestor (pid ") || !strings.Contains(errOut, "stop the daemon first") {
		t.Errorf("replay while locked: exit %d\n%s%s", code, out, errOut)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{
		{"replay", "-c", cfgPath},
		{"replay", "-source", "feed"},
		{"replay", "-c", cfgPath, "-source", "feed", "-from", "yesterday"},
		{"replay", "-c", cfgPath, "-source", "feed", "extra"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, want 2\n%s", args, code, errb.String())
		}
	}
	var out2, errb bytes.Buffer
	if code := run([]string{"replay", "-c", cfgPath, "-source", "nosuch"}, &out2, &errb); code != 1 ||
		!strings.Contains(errb.String(), `no source "nosuch"`) {
		t.Errorf("unknown source: exit %d\n%s", code, errb.String())
	}
}

// TestReplayableRange: replay says how far back the raw store reaches
// under raw_store.retention, and warns when -from asks for more.
func TestReplayableRange(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	if got := replayableRange(0, time.Time{}, now); !strings.Contains(got, "every payload ever fetched is kept") {
		t.Errorf("retention 0: %q", got)
	}
	got := replayableRange(24*time.Hour, now.Add(-time.Hour), now)
	if !strings.Contains(got, "before 2026-11-26T12:00:00Z were deleted") || strings.Contains(got, "warning") {
		t.Errorf("24h, -from an hour ago: %q", got)
	}
	if got := replayableRange(24*time.Hour, now.Add(-48*time.Hour), now); !strings.Contains(got, "warning: -from 2026-11-25T12:00:00Z is older") {
		t.Errorf("24h, -from two days ago: %q", got)
	}
}
