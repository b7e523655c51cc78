package queue

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ledgerChildEnv names the queue file TestLedgerSwitchChild works on; the
// test runs only as the child of TestLedgerSwitchSurvivesKill.
const ledgerChildEnv = "INGESTOR_LEDGER_CHILD_DB"

// TestLedgerSwitchChild, run as a child process, opens the queue in
// $INGESTOR_LEDGER_CHILD_DB with a dedupe window of a nanosecond, so that
// every Prune switches generations, and loops until killed: append a
// round of new keys and a re-fetch of the last round's, ack most frames,
// dead-letter one event, replay an older dead letter now and then, prune;
// it prints "round N" after each.
func TestLedgerSwitchChild(t *testing.T) {
	path := os.Getenv(ledgerChildEnv)
	if path == "" {
		return // not the child: nothing to do
	}
	q, err := Open(Options{Path: path, EventsPerFrame: 8, DedupeWindow: time.Nanosecond})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	ctx := context.Background()
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	start := time.Now().UnixNano() // keys unique across the child's runs
	for round := 0; ; round++ {
		keys := seqKeys(fmt.Sprintf("k%d-%04d-", start, round), 24)
		if round > 0 {
			keys = append(keys, seqKeys(fmt.Sprintf("k%d-%04d-", start, round-1), 24)[:8]...)
		}
		frames, err := q.Append(ctx, keysBatch("s", fmt.Sprintf("s/raw-%d-%d", start, round), keys...))
		if err != nil {
			fail(err)
		}
		var ids []int64
		for i, f := range frames {
			if i == 0 && round%3 == 0 {
				if _, err := q.DeadLetterEvents(ctx, f.ID, []int64{f.Events[0].Seq}, "poison"); err != nil {
					fail(err)
				}
			}
			ids = append(ids, f.ID)
		}
		if _, err := q.Ack(ctx, ids, nil); err != nil {
			fail(err)
		}
		if round%7 == 6 {
			_, replayed, err := q.ReplayDeadLetters(ctx, DLQFilter{Source: "s"})
			if err != nil {
				fail(err)
			}
			for _, f := range replayed {
				if _, err := q.Ack(ctx, []int64{f.ID}, nil); err != nil {
					fail(err)
				}
			}
		}
		if _, err := q.Prune(ctx); err != nil {
			fail(err)
		}
		fmt.Println("round", round)
	}
}

// TestLedgerSwitchSurvivesKill SIGKILLs a child switching generations at
// every round (TestLedgerSwitchChild) at random moments, six times on the
// same file, and checks after each kill that the ledger is whole: no key
// in both generations, every event of a pending frame and of an active
// dead letter still has its key with its seq, the generation state
// readable, and seqs given after the reopen above every seq stored.
func TestLedgerSwitchSurvivesKill(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	for kill := range 6 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLedgerSwitchChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), ledgerChildEnv+"="+path)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		target := 3 + rand.IntN(25)
		lines := bufio.NewScanner(out)
		reached := false
		for lines.Scan() {
			line := lines.Text()
			if strings.HasPrefix(line, "error:") {
				t.Fatalf("child: %s", line)
			}
			if n, ok := strings.CutPrefix(line, "round "); ok {
				if r, _ := strconv.Atoi(n); r >= target {
					reached = true
					break
				}
			}
		}
		// Kill it mid-round: somewhere in its next append, ack or switch.
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		if !reached {
			t.Fatalf("kill %d: the child stopped before round %d", kill, target)
		}
		checkLedgerWhole(t, path)
	}
}

// checkLedgerWhole opens the queue at path and checks the ledger's
// invariants (see TestLedgerSwitchSurvivesKill).
func checkLedgerWhole(t *testing.T, path string) {
	t.Helper()
	q, err := Open(Options{Path: path, EventsPerFrame: 8, DedupeWindow: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	}()
	ctx := t.Context()
	var both int
	if err := q.rdb.QueryRowContext(ctx, `SELECT count(*) FROM ledger_0 a JOIN ledger_1 b ON a.source = b.source AND a.key = b.key`).Scan(&both); err != nil || both != 0 {
		t.Fatalf("%d keys in both generations (err %v)", both, err)
	}
	var maxSeq int64
	if err := q.rdb.QueryRowContext(ctx, `SELECT max(coalesce((SELECT max(seq) FROM ledger_0), 0), coalesce((SELECT max(seq) FROM ledger_1), 0),
		coalesce((SELECT max(last_seq) FROM frame_log), 0), coalesce((SELECT max(seq) FROM event_marks), 0))`).Scan(&maxSeq); err != nil {
		t.Fatal(err)
	}
	// Every pending event has its key, with its seq.
	frames, err := q.FramesAfter(ctx, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var pending int64
	for _, id := range frames {
		f, ok, err := q.LoadFrame(ctx, id)
		if err != nil || !ok || len(f.Events) == 0 {
			t.Fatalf("pending frame %d: %+v %v %v", id, f, ok, err)
		}
		for _, e := range f.Events {
			k, ok, err := lookupKey(ctx, q.rdb, e.Source, e.Key)
			if err != nil || !ok || k.seq != e.Seq {
				t.Fatalf("pending event %s seq %d: ledger row %+v %v %v", e.Key, e.Seq, k, ok, err)
			}
		}
		pending += int64(len(f.Events))
	}
	if pending != q.PendingEvents() {
		t.Fatalf("pending frames hold %d events, the counter says %d", pending, q.PendingEvents())
	}
	// Every active event dead letter still has its key and raw reference.
	dls, err := q.ListDeadLetters(ctx, DLQFilter{Limit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dls {
		k, ok, err := lookupKey(ctx, q.rdb, d.Source, d.Key)
		if err != nil || !ok || k.seq != d.Seq || d.RawLen != 1 {
			t.Fatalf("dead letter %d (%s seq %d, raw len %d): ledger row %+v %v %v", d.ID, d.Key, d.Seq, d.RawLen, k, ok, err)
		}
	}
	// Seqs given after the reopen are above every seq stored.
	fr, err := q.Append(ctx, keysBatch("s", "s/raw-check", fmt.Sprintf("check-%d", time.Now().UnixNano())))
	if err != nil || len(fr) != 1 || fr[0].Events[0].Seq <= maxSeq {
		t.Fatalf("a new event after the reopen: %+v %v, want a seq above %d", fr, err, maxSeq)
	}
	if _, err := q.Ack(ctx, []int64{fr[0].ID}, nil); err != nil {
		t.Fatal(err)
	}
}
