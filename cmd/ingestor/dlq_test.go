package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/daemon"
	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

func runDLQ(t *testing.T, stdin string, args ...string) (string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cmdDLQ(args, strings.NewReader(stdin), &out, &errb)
	return out.String() + errb.String(), code
}

// writeDaemonConfig writes dir/ingestor.toml for a daemon on free loopback
// ports, its data and raw store under dir, with daemonExtra and
// publishExtra as more keys of its daemon and publish tables and rest
// (sources, other tables) after them, and loads it.
func writeDaemonConfig(t *testing.T, dir, daemonExtra, publishExtra, rest string) (string, *config.Config) {
	t.Helper()
	pub, ack := testconfig.FreeEndpoints(t)
	path := testconfig.Daemon{
		Dir: dir, HTTPAddr: testsync.FreePort(t), DaemonKeys: daemonExtra,
		Publish: pub, Ack: ack, PublishKeys: publishExtra, Rest: rest,
	}.Write(t, filepath.Join(dir, "ingestor.toml"))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, cfg
}

// dlqDaemon writes a config with daemonExtra as more daemon keys, starts a
// daemon on it with no source (tests fill the queue by hand) and returns
// the config's path, the daemon and a stop function that is also run at
// cleanup.
func dlqDaemon(t *testing.T, dir, daemonExtra string) (string, *daemon.Daemon, func()) {
	t.Helper()
	cfgPath, cfg := writeDaemonConfig(t, dir, daemonExtra, "", replayFeedTOML)
	cfg.Sources = nil // nothing to poll: the queue is filled by hand
	raw, err := rawstore.Open(t.Context(), rawstore.Options{URL: cfg.RawStore.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Put(t.Context(), "feed/ok", []byte(`1,2,`)); err != nil {
		t.Fatal(err)
	}
	d, stop := startInProcess(t, cfg)
	return cfgPath, d, stop
}

// TestDLQCommand drives `ingestor dlq` against a running daemon (through
// its admin endpoints) and then against the stopped daemon's queue.
func TestDLQCommand(t *testing.T) {
	dir := t.TempDir()
	cfgPath, d, stop := dlqDaemon(t, dir, "")
	ctx := t.Context()
	q := d.Queue()
	if err := q.DeadLetter(ctx, "feed", "not json", "feed/bad", ""); err != nil {
		t.Fatal(err)
	}
	frames, err := q.Append(ctx, queue.Batch{Source: "feed", RawKey: "feed/ok", FetchedAt: time.Now(),
		Events: []queue.NewEvent{{Key: "a", RawLen: 2}, {Key: "b", RawOff: 2, RawLen: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.DeadLetterFrame(ctx, frames[0].ID, "not acked after 5 deliveries"); err != nil {
		t.Fatal(err)
	}

	out, code := runDLQ(t, "", "list", "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "not json") || !strings.Contains(out, "/a") || !strings.Contains(out, "3 dead letter(s)") {
		t.Fatalf("dlq list = %d:\n%s", code, out)
	}
	dls, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dls) != 3 {
		t.Fatalf("dead letters = %v %v", dls, err)
	}
	payloadID, aID, bID := dls[0].ID, dls[1].ID, dls[2].ID
	out, code = runDLQ(t, "", "show", strconv.FormatInt(aID, 10), "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "key:         a") || !strings.Contains(out, "dead-lettered") || !strings.Contains(out, "payload:\n1,\n") {
		t.Fatalf("dlq show = %d:\n%s", code, out)
	}
	out, code = runDLQ(t, "", "replay", strconv.FormatInt(payloadID, 10), "-c", cfgPath)
	if code != 1 || !strings.Contains(out, "-include-deadletters") {
		t.Fatalf("dlq replay of a payload = %d:\n%s", code, out)
	}
	out, code = runDLQ(t, "", "replay", "-c", cfgPath)
	if code != 2 {
		t.Fatalf("dlq replay without a selection = %d:\n%s", code, out)
	}
	out, code = runDLQ(t, "", "replay", strconv.FormatInt(aID, 10), "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "1 event(s) queued again") {
		t.Fatalf("dlq replay = %d:\n%s", code, out)
	}
	if q.PendingEvents() != 1 {
		t.Fatalf("pending after replay = %d, want 1 (no processor runs)", q.PendingEvents())
	}
	out, code = runDLQ(t, "n\n", "drop", strconv.FormatInt(bID, 10), "-c", cfgPath)
	if code != 1 || !strings.Contains(out, "drop 1 dead letter(s)?") || !strings.Contains(out, "nothing dropped") {
		t.Fatalf("dlq drop answered no = %d:\n%s", code, out)
	}
	out, code = runDLQ(t, "y\n", "drop", strconv.FormatInt(bID, 10), "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "1 dead letter(s) dropped") {
		t.Fatalf("dlq drop = %d:\n%s", code, out)
	}

	// With the daemon stopped, dlq opens the queue itself.
	stop()
	out, code = runDLQ(t, "", "list", "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "1 dead letter(s)") || !strings.Contains(out, "not json") {
		t.Fatalf("dlq list offline = %d:\n%s", code, out)
	}
	out, code = runDLQ(t, "", "drop", "-all", "--yes", "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "1 dead letter(s) dropped") {
		t.Fatalf("dlq drop offline = %d:\n%s", code, out)
	}
	if _, err := datadir.Lock(filepath.Join(dir, "data")); err != nil {
		t.Fatalf("dlq left the data dir locked: %v", err)
	}
}

// TestDLQCommandToken runs the daemon with its admin endpoints on a Unix
// socket behind a token: dlq sends the token of the config it loads, and
// says clearly when it has none or the wrong one. A list longer than
// -limit says how many there are in all, through the daemon and offline.
func TestDLQCommandToken(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin.token")
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := "unix:" + filepath.Join(dir, "admin.sock")
	cfgPath, d, stop := dlqDaemon(t, dir, fmt.Sprintf("admin_addr = %q\nadmin_token_file = %q", sock, tokenFile))
	ctx := t.Context()
	for _, reason := range []string{"not json", "bad utf-8", "truncated"} {
		if err := d.Queue().DeadLetter(ctx, "feed", reason, "feed/bad", ""); err != nil {
			t.Fatal(err)
		}
	}

	out, code := runDLQ(t, "", "list", "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "truncated") || !strings.Contains(out, "3 dead letter(s)") {
		t.Fatalf("dlq list with the token = %d:\n%s", code, out)
	}
	out, code = runDLQ(t, "", "list", "-limit", "2", "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "showing 2 of 3 dead letter(s)") || strings.Contains(out, "truncated") {
		t.Fatalf("dlq list -limit 2 = %d:\n%s", code, out)
	}
	out, code = runDLQ(t, "", "drop", "-reason", "utf-8", "-yes", "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "1 dead letter(s) dropped") {
		t.Fatalf("dlq drop with the token = %d:\n%s", code, out)
	}

	// The same daemon, reached with a config holding the wrong token or none.
	cfgText, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(dir, "wrong.token")
	if err := os.WriteFile(wrong, []byte("fedcba9876543210fedcba9876543210"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, replace, want string }{
		{"wrong token", fmt.Sprintf("admin_token_file = %q", wrong), "refused the admin token of"},
		{"no token", "", "the daemon requires an admin token"},
	} {
		other := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_")+".toml")
		text := strings.Replace(string(cfgText), fmt.Sprintf("admin_token_file = %q", tokenFile), c.replace, 1)
		if err := os.WriteFile(other, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"list"}, {"show", "1"}, {"drop", "-all", "-yes"}} {
			out, code := runDLQ(t, "", append(args, "-c", other)...)
			if code != 1 || !strings.Contains(out, c.want) || !strings.Contains(out, "admin_token") || strings.Contains(out, "0123456789abcdef") {
				t.Errorf("%s: dlq %s = %d:\n%s", c.name, args[0], code, out)
			}
		}
	}
	if n, err := d.Queue().CountDeadLetters(ctx, queue.DLQFilter{}); err != nil || n != 2 {
		t.Errorf("dead letters after the refused drops = %d, %v; want 2", n, err)
	}

	stop()
	out, code = runDLQ(t, "", "list", "-limit", "1", "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "showing 1 of 2 dead letter(s)") {
		t.Fatalf("dlq list -limit 1 offline = %d:\n%s", code, out)
	}
}

// startInProcess starts a daemon on cfg in this process, its logs
// discarded, and returns it with a stop that shuts it down once; stop also
// runs when the test ends.
func startInProcess(t *testing.T, cfg *config.Config) (*daemon.Daemon, func()) {
	t.Helper()
	d, err := daemon.Start(t.Context(), cfg, daemon.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(stop)
	return d, stop
}
