package processor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/wire"
	"github.com/ingestorhq/ingestor/processor"
)

func nacksOf(acks []wire.Ack) []wire.Nack {
	var n []wire.Nack
	for _, a := range acks {
		n = append(n, a.Nacks...)
	}
	return n
}

func TestPermanentWrapsAndUnwraps(t *testing.T) {
	base := errors.New("bad payload")
	err := fmt.Errorf("event x: %w", processor.Permanent(base))
	if !processor.IsPermanent(err) || !errors.Is(err, base) || err.Error() != "event x: bad payload" {
		t.Errorf("Permanent lost its meaning: IsPermanent=%v Is=%v %q", processor.IsPermanent(err), errors.Is(err, base), err)
	}
	if processor.IsPermanent(base) || processor.Permanent(nil) != nil {
		t.Error("a plain error is permanent, or Permanent(nil) is not nil")
	}
}

func TestFailuresAreNackedAlongsideKeyAcks(t *testing.T) {
	d := newFakeDaemon(t)
	c, _ := startProcessor(t, d, processor.Options{}, func(ctx context.Context, ev *processor.Event) error {
		switch ev.Key {
		case "k2":
			return fmt.Errorf("validate: %w", processor.Permanent(errors.New("no id field")))
		case "k3":
			return errors.New("database unavailable")
		}
		return nil
	})
	d.sendFrame(t, 1, 1, event("a", "k1", 1), event("a", "k2", 2), event("a", "k3", 3), event("a", "k4", 4))
	acks := d.acksUntil(t, "acks and nacks of frame 1", func(acks []wire.Ack) bool {
		return len(keysAcked(acks)) == 2 && len(nacksOf(acks)) == 2
	})
	if len(acks) != 1 {
		t.Errorf("got %d ack messages, want the acks and nacks of the frame in one: %+v", len(acks), acks)
	}
	if n := framesAcked(acks)[1]; n != 0 {
		t.Error("frame 1 acked whole although two events failed")
	}
	wantKeys := []wire.KeyAck{{Frame: 1, Source: "a", Key: "k1"}, {Frame: 1, Source: "a", Key: "k4"}}
	if got := keysAcked(acks); !reflect.DeepEqual(got, wantKeys) {
		t.Errorf("keys = %+v, want %+v", got, wantKeys)
	}
	wantNacks := []wire.Nack{
		{Frame: 1, Source: "a", Key: "k2", Reason: "validate: no id field", Permanent: true},
		{Frame: 1, Source: "a", Key: "k3", Reason: "database unavailable"},
	}
	if got := nacksOf(acks); !reflect.DeepEqual(got, wantNacks) {
		t.Errorf("nacks = %+v, want %+v", got, wantNacks)
	}
	waitStats(t, c, processor.Stats{Frames: 1, Events: 4, Acked: 2, Failed: 2, Permanent: 1})
}

func TestDedupeDBSkipsARedeliveredFrameAndAcksItAgain(t *testing.T) {
	d := newFakeDaemon(t)
	var calls atomic.Int64
	c, _ := startProcessor(t, d, processor.Options{DedupeDB: filepath.Join(t.TempDir(), "dedupe.db")},
		func(ctx context.Context, ev *processor.Event) error {
			calls.Add(1)
			if ev.Key == "k3" {
				return errors.New("try later")
			}
			return nil
		})
	d.sendFrame(t, 1, 1, event("a", "k1", 1), event("a", "k2", 2), event("a", "k3", 3))
	d.acksUntil(t, "frame 1's keys", func(acks []wire.Ack) bool { return len(keysAcked(acks)) == 2 })

	// The resend holds the three again (say the key acks were lost): the
	// two processed ones are skipped, k3 is handled again.
	d.sendFrame(t, 1, 2, event("a", "k1", 1), event("a", "k2", 2), event("a", "k3", 3))
	acks := d.acksUntil(t, "the resend's keys", func(acks []wire.Ack) bool { return len(keysAcked(acks)) == 2 })
	want := []wire.KeyAck{{Frame: 1, Source: "a", Key: "k1"}, {Frame: 1, Source: "a", Key: "k2"}}
	if got := keysAcked(acks); !reflect.DeepEqual(got, want) {
		t.Errorf("keys = %+v, want %+v", got, want)
	}
	if n := calls.Load(); n != 4 {
		t.Errorf("handler called %d times, want 4 (k1, k2, k3 twice)", n)
	}
	waitStats(t, c, processor.Stats{Frames: 2, Events: 6, Acked: 4, Failed: 2, Duplicates: 2, Redeliveries: 1})
}

// TestDedupeDBInDirWithURICharacters keeps the dedupe database in a
// directory whose name holds the characters a SQLite URI gives a meaning
// to: it must be created at the path given, and a redelivered event must
// be skipped.
func TestDedupeDBInDirWithURICharacters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data?x=1#frag%41 dir")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "dedupe.db")
	d := newFakeDaemon(t)
	var calls atomic.Int64
	c, _ := startProcessor(t, d, processor.Options{DedupeDB: path}, func(context.Context, *processor.Event) error {
		calls.Add(1)
		return nil
	})
	d.sendFrame(t, 1, 1, event("a", "k1", 1))
	d.acksUntil(t, "frame 1's ack", func(acks []wire.Ack) bool { return len(acks) > 0 })
	d.sendFrame(t, 1, 2, event("a", "k1", 1))
	waitStats(t, c, processor.Stats{Frames: 2, Events: 2, Acked: 2, Duplicates: 1, Redeliveries: 1})
	if n := calls.Load(); n != 1 {
		t.Errorf("handler called %d times, want 1", n)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the dedupe database is not at the path given: %v", err)
	}
	if stray, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), "data*")); len(stray) != 1 {
		t.Errorf("files next to the data dir: %q, want only the data dir", stray)
	}
}

// openTestDB opens a SQLite file in dir with the DSN RunTx documents and
// creates an effects table with a plain primary key, so that applying an
// event twice fails.
func openTestDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL&_synchronous=FULL&_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE IF NOT EXISTS effects (source TEXT, key TEXT, PRIMARY KEY (source, key))`); err != nil {
		t.Fatal(err)
	}
	return db
}

// insertEffect is a TxHandler that writes one row per event and fails for
// the key "bad" after writing, so its row must be rolled back.
func insertEffect(calls *atomic.Int64) processor.TxHandler {
	return func(ctx context.Context, tx *sql.Tx, ev *processor.Event) error {
		calls.Add(1)
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects (source, key) VALUES (?, ?)`, ev.Source, ev.Key); err != nil {
			return err
		}
		if ev.Key == "bad" {
			return processor.Permanent(errors.New("bad event"))
		}
		return nil
	}
}

// startTx runs c.RunTx against d until the returned stop is called or the
// test ends.
func startTx(t *testing.T, d *fakeDaemon, o processor.Options, db *sql.DB, h processor.TxHandler) (*processor.Client, func() error) {
	t.Helper()
	o.Endpoint, o.AckEndpoint = d.endpoint, d.ackEndpoint
	o.Logger = testLogger(t)
	c, err := processor.New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.RunTx(ctx, db, h) }()
	stop := sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(waitTimeout):
			return errors.New("RunTx did not return after cancellation")
		}
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("RunTx: %v", err)
		}
	})
	return c, stop
}

func rows(t *testing.T, db *sql.DB, query string) []string {
	t.Helper()
	r, err := db.QueryContext(t.Context(), query)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	var out []string
	for r.Next() {
		var s, k string
		if err := r.Scan(&s, &k); err != nil {
			t.Fatal(err)
		}
		out = append(out, s+"/"+k)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func TestRunTxCommitsEffectsWithKeysAndNacksOnlyTheFailure(t *testing.T) {
	d := newFakeDaemon(t)
	db := openTestDB(t, filepath.Join(t.TempDir(), "effects.db"))
	var calls atomic.Int64
	c, _ := startTx(t, d, processor.Options{}, db, insertEffect(&calls))
	d.sendFrame(t, 1, 1, event("a", "k1", 1), event("a", "bad", 2), event("a", "k3", 3))
	acks := d.acksUntil(t, "frame 1's acks and nack", func(acks []wire.Ack) bool {
		return len(keysAcked(acks)) == 2 && len(nacksOf(acks)) == 1
	})
	if want := []wire.KeyAck{{Frame: 1, Source: "a", Key: "k1"}, {Frame: 1, Source: "a", Key: "k3"}}; !reflect.DeepEqual(keysAcked(acks), want) {
		t.Errorf("keys = %+v, want %+v", keysAcked(acks), want)
	}
	if want := []wire.Nack{{Frame: 1, Source: "a", Key: "bad", Reason: "bad event", Permanent: true}}; !reflect.DeepEqual(nacksOf(acks), want) {
		t.Errorf("nacks = %+v, want %+v", nacksOf(acks), want)
	}
	// The acks left after the commit, so both tables already hold it.
	want := []string{"a/k1", "a/k3"}
	if got := rows(t, db, `SELECT source, key FROM effects`); !reflect.DeepEqual(got, want) {
		t.Errorf("effects = %q, want %q (the failed event's write rolled back)", got, want)
	}
	if got := rows(t, db, `SELECT source, key FROM processed`); !reflect.DeepEqual(got, want) {
		t.Errorf("processed = %q, want %q", got, want)
	}
	waitStats(t, c, processor.Stats{Frames: 1, Events: 3, Acked: 2, Failed: 1, Permanent: 1})
}

func TestRunTxRedeliveryAfterCrashBeforeAckIsSkipped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "effects.db")
	evs := []wire.Event{event("a", "k1", 1), event("b", "k2", 2)}

	// The first processor commits and "crashes" before its ack leaves.
	d1 := newFakeDaemon(t)
	db1 := openTestDB(t, path)
	var calls1 atomic.Int64
	c1, stop1 := startTx(t, d1, processor.Options{DropAcks: 1}, db1, insertEffect(&calls1))
	d1.sendFrame(t, 1, 1, evs...)
	testsync.WaitFor(t, "the first processor's ack to be dropped", waitTimeout, func() bool { return c1.Stats().AcksDropped == 1 })
	if err := stop1(); err != nil {
		t.Fatalf("RunTx: %v", err)
	}
	if st := c1.Stats(); st.Acked != 0 || st.Events != 2 {
		t.Fatalf("first processor stats %+v, want 2 events and nothing acked", st)
	}

	// The daemon redelivers the frame to a new processor on the same
	// database: it is recognised, not applied again, and acked.
	d2 := newFakeDaemon(t)
	db2 := openTestDB(t, path)
	var calls2 atomic.Int64
	c2, _ := startTx(t, d2, processor.Options{}, db2, insertEffect(&calls2))
	d2.sendFrame(t, 1, 2, evs...)
	d2.acksUntil(t, "the redelivered frame to be acked", func(acks []wire.Ack) bool { return framesAcked(acks)[1] == 1 })
	if n := calls2.Load(); n != 0 {
		t.Errorf("the second processor applied %d events again", n)
	}
	if got, want := rows(t, db2, `SELECT source, key FROM effects`), []string{"a/k1", "b/k2"}; !reflect.DeepEqual(got, want) {
		t.Errorf("effects = %q, want each event exactly once: %q", got, want)
	}
	waitStats(t, c2, processor.Stats{Frames: 1, Events: 2, Acked: 2, Duplicates: 2, Redeliveries: 1})

	// A third delivery is answered from the in-memory cache.
	d2.sendFrame(t, 1, 3, evs...)
	d2.acksUntil(t, "the third delivery to be acked", func(acks []wire.Ack) bool { return framesAcked(acks)[1] == 1 })
	waitStats(t, c2, processor.Stats{Frames: 2, Events: 4, Acked: 4, Duplicates: 4, Redeliveries: 2})
}

func TestWorkersProcessEveryFrame(t *testing.T) {
	const frames, perFrame = 60, 5
	for _, tx := range []bool{false, true} {
		t.Run(fmt.Sprintf("tx=%v", tx), func(t *testing.T) {
			d := newFakeDaemon(t)
			o := processor.Options{Workers: 4}
			var c *processor.Client
			var db *sql.DB
			var seen sync.Map
			if tx {
				db = openTestDB(t, filepath.Join(t.TempDir(), "effects.db"))
				var calls atomic.Int64
				c, _ = startTx(t, d, o, db, insertEffect(&calls))
			} else {
				c, _ = startProcessor(t, d, o, func(ctx context.Context, ev *processor.Event) error {
					if _, dup := seen.LoadOrStore(ev.Key, true); dup {
						return processor.Permanent(fmt.Errorf("%s handled twice", ev.Key))
					}
					return nil
				})
			}
			seq := int64(0)
			for f := int64(1); f <= frames; f++ {
				var evs []wire.Event
				for range perFrame {
					seq++
					evs = append(evs, event("s", fmt.Sprintf("k%d", seq), seq))
				}
				d.sendFrame(t, f, 1, evs...)
			}
			acks := d.acksUntil(t, "every frame to be acked", func(acks []wire.Ack) bool { return len(framesAcked(acks)) == frames })
			if n := nacksOf(acks); len(n) != 0 {
				t.Errorf("nacks %+v", n)
			}
			waitStats(t, c, processor.Stats{Frames: frames, Events: frames * perFrame, Acked: frames * perFrame})
			if tx {
				if got := len(rows(t, db, `SELECT source, key FROM effects`)); got != frames*perFrame {
					t.Errorf("%d effect rows, want %d", got, frames*perFrame)
				}
			}
		})
	}
}

func TestStopFinishesInFlightFramesAndFlushes(t *testing.T) {
	d := newFakeDaemon(t)
	var handled atomic.Int64
	// An hour-long flush interval leaves every ack to the stop.
	_, stop := startProcessor(t, d, processor.Options{Workers: 2, AckFlushInterval: time.Hour}, func(ctx context.Context, ev *processor.Event) error {
		if ev.Key == "slow" {
			// Still at work when the stop comes, and finishes its write.
			<-ctx.Done()
		}
		handled.Add(1)
		return nil
	})
	d.sendFrame(t, 1, 1, event("s", "slow", 1))
	d.sendFrame(t, 2, 1, event("s", "fast", 2))
	testsync.WaitFor(t, "frame 2 to be handled", waitTimeout, func() bool { return handled.Load() == 1 })

	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	acks := d.acksUntil(t, "both frames to be acked at stop", func(acks []wire.Ack) bool { return len(framesAcked(acks)) == 2 })
	if len(acks) != 1 {
		t.Errorf("got %d ack messages, want one sent at stop: %+v", len(acks), acks)
	}
}

// TestRunTxStoppedBeforeItStartsIsGraceful cancels the context before
// RunTx starts: that is a graceful stop, not a setup failure (the example
// processor's exit status depends on it).
func TestRunTxStoppedBeforeItStartsIsGraceful(t *testing.T) {
	d := newFakeDaemon(t)
	db := openTestDB(t, filepath.Join(t.TempDir(), "effects.db"))
	c, err := processor.New(processor.Options{Endpoint: d.endpoint, AckEndpoint: d.ackEndpoint, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var calls atomic.Int64
	if err := c.RunTx(ctx, db, insertEffect(&calls)); err != nil {
		t.Fatalf("RunTx with a context cancelled before it started: %v, want nil", err)
	}
}
