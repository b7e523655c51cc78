package main

import (
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// TestChaosExactlyOnce runs the built daemon and the built example
// processor in its exactly-once SQLite mode, and SIGKILLs either or both at
// random moments, 20 times, while the processor also drops a fifth of its
// ack messages and fails a few poison events permanently. At the end the
// processor's table holds every other upstream event exactly once, and
// every poison event is in the dead-letter list with its reason.
func TestChaosExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills both binaries repeatedly")
	}
	t.Parallel() // long and mostly waiting: overlaps the other long tests (make test's wall time)
	const (
		total  = 3000
		cycles = 20
	)
	poison := regexp.MustCompile(`^ev-(7|777|2222)$`)
	dir := t.TempDir()
	ingestor := buildBinary(t, dir)
	proc := buildProcessor(t, dir)
	feed := testupstream.New(t, total, 20)
	httpAddr, pub, ack := testsync.FreePort(t), "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t)
	cfgPath := testconfig.Daemon{
		Dir: dir, HTTPAddr: httpAddr, ShutdownGrace: "5s", Publish: pub, Ack: ack,
		PublishKeys: "ack_timeout = \"1s\"\nevents_per_frame = 10",
		Rest: fmt.Sprintf(`
[source.seq]
kind = "http_poll"
poll_url = %q
interval = "30ms"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
`, feed.URL+"/feed"),
	}.Write(t, filepath.Join(dir, "ingestor.toml"))
	sink := filepath.Join(dir, "sink.db")
	var daemonLogs, procLogs testsync.LockedBuffer
	startDaemon := func() *exec.Cmd {
		cmd := exec.Command(ingestor, "run", "-c", cfgPath)
		cmd.Stderr = &daemonLogs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitReady(t, httpAddr, cmd)
		return cmd
	}
	startProcessor := func(dropAcks string) *exec.Cmd {
		cmd := exec.Command(proc, "-connect", pub, "-ack", ack, "-sqlite", sink, "-workers", "2",
			"-drop-acks", dropAcks, "-fail-keys", poison.String(), "-log-every", "100ms")
		cmd.Stderr = &procLogs
		cmd.Stdout = &procLogs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	kill := func(cmd *exec.Cmd) {
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait() // killed: its status is the signal
	}
	d, p := startDaemon(), startProcessor("0.2")
	// First make sure the chaos is real: acks are dropped, and the frames
	// whose acks were lost come back to a new processor, which recognises
	// the events it already applied and skips them.
	waitForLog(t, &procLogs, `acks_dropped=[1-9]`)
	kill(p)
	p = startProcessor("0.2")
	waitForLog(t, &procLogs, `duplicates=[1-9]`)
	for i := 0; i < cycles; i++ {
		time.Sleep(time.Duration(rand.Int64N(int64(400*time.Millisecond))) + 50*time.Millisecond) // a random kill moment
		switch rand.IntN(3) {
		case 0:
			kill(d)
			d = startDaemon()
		case 1:
			kill(p)
			p = startProcessor("0.2")
		default:
			kill(d)
			kill(p)
			d, p = startDaemon(), startProcessor("0.2")
		}
	}
	// Let everything settle with acks no longer dropped.
	kill(p)
	started := strings.Count(procLogs.String(), `msg="processor started"`)
	p = startProcessor("0")
	// It must be up (its signal handler installed) before the SIGTERM below.
	waitForLog(t, &procLogs, fmt.Sprintf(`(?s)(msg="processor started".*){%d}`, started+1))
	want := total - 3
	deadline := time.Now().Add(3 * time.Minute)
	for len(sinkEvents(t, sink)) < want || pendingEvents(t, httpAddr) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sink holds %d of %d events, queue pending %v\nprocessor:\n%s\ndaemon:\n%s",
				len(sinkEvents(t, sink)), want, pendingEvents(t, httpAddr), tail(procLogs.String()), tail(daemonLogs.String()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, c := range []struct {
		name string
		cmd  *exec.Cmd
		logs *testsync.LockedBuffer
	}{{"processor", p, &procLogs}, {"daemon", d, &daemonLogs}} {
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("graceful stop of the %s: %v\n%s", c.name, err, tail(c.logs.String()))
		}
	}

	db, err := sql.Open("sqlite3", "file:"+sink+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	got := map[string]bool{}
	rows, err := db.Query(`SELECT key FROM events WHERE source = 'seq'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		if got[k] {
			t.Fatalf("event %s applied twice", k)
		}
		got[k] = true
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= total; n++ {
		id := testupstream.ID(n)
		if poison.MatchString(id) {
			if got[id] {
				t.Errorf("poison event %s was applied", id)
			}
			continue
		}
		if !got[id] {
			t.Errorf("event %s is missing from the processor's table", id)
		}
	}
	if len(got) != want {
		t.Errorf("processor table holds %d events, want %d", len(got), want)
	}
	if strings.Contains(procLogs.String(), "BUG") {
		t.Errorf("the processor reported a double application:\n%s", tail(procLogs.String()))
	}

	q, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "data", "queue.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = q.Close() }()
	dead := map[string]string{}
	drows, err := q.Query(`SELECT event_key, reason FROM dead_letters WHERE source = 'seq' AND replayed_at = 0`)
	if err != nil {
		t.Fatal(err)
	}
	for drows.Next() {
		var k, reason string
		if err := drows.Scan(&k, &reason); err != nil {
			t.Fatal(err)
		}
		dead[k] = reason
	}
	if err := drows.Close(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"ev-7", "ev-777", "ev-2222"} {
		if dead[id] == "" {
			t.Errorf("poison event %s is not in the dead-letter list with a reason (dead letters: %v)", id, dead)
		}
	}
}

// waitForLog waits until the logs match pattern.
func waitForLog(t *testing.T, logs *testsync.LockedBuffer, pattern string) {
	t.Helper()
	re := regexp.MustCompile(pattern)
	deadline := time.Now().Add(60 * time.Second)
	for !re.MatchString(logs.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("the processor never logged %s:\n%s", pattern, tail(logs.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
