package processor_test

import (
	"database/sql"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/wire"
	"github.com/ingestorhq/ingestor/processor"
)

func count(t *testing.T, db *sql.DB, query string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRowContext(t.Context(), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRunTxForgetsKeysPastRetention: a processed key is deleted once it
// is older than DedupeRetention, in the background, while the effects
// stay; the table does not grow without bound.
func TestRunTxForgetsKeysPastRetention(t *testing.T) {
	d := newFakeDaemon(t)
	db := openTestDB(t, filepath.Join(t.TempDir(), "effects.db"))
	var calls atomic.Int64
	c, _ := startTx(t, d, processor.Options{DedupeRetention: time.Second}, db, insertEffect(&calls))
	d.sendFrame(t, 1, 1, event("a", "k1", 1), event("a", "k2", 2))
	d.acksUntil(t, "the frame acked", func(acks []wire.Ack) bool { return framesAcked(acks)[1] == 1 })
	testsync.WaitFor(t, "the keys forgotten after a second of running", waitTimeout, func() bool {
		return c.Stats().Forgotten == 2
	})
	if n := count(t, db, `SELECT count(*) FROM processed`); n != 0 {
		t.Errorf("%d processed keys left past the retention", n)
	}
	if got := rows(t, db, `SELECT source, key FROM effects`); !reflect.DeepEqual(got, []string{"a/k1", "a/k2"}) {
		t.Errorf("effects = %q, want both kept", got)
	}
}

// TestRetentionCountsRunningTimeNotDowntime: a key applied just before a
// stop, whose ack was lost, comes again once a processor is back, however
// long that took: the retention must not count the downtime. The stop is
// made to look an hour long (the stored clock and the key moved an hour
// back, as the wall clock would have moved past them); a processor with a
// 30-minute retention starts, keeps the key, and recognises the
// redelivered event as a duplicate instead of applying it again. On the
// wall clock the key would have been forgotten at once.
func TestRetentionCountsRunningTimeNotDowntime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "effects.db")
	evs := []wire.Event{event("a", "k1", 1)}
	d1 := newFakeDaemon(t)
	db1 := openTestDB(t, path)
	var calls1 atomic.Int64
	c1, stop1 := startTx(t, d1, processor.Options{DropAcks: 1}, db1, insertEffect(&calls1))
	d1.sendFrame(t, 1, 1, evs...)
	testsync.WaitFor(t, "the ack to be dropped", waitTimeout, func() bool { return c1.Stats().AcksDropped == 1 })
	if err := stop1(); err != nil {
		t.Fatal(err)
	}
	hour := int64(time.Hour)
	if _, err := db1.ExecContext(t.Context(), `UPDATE processed SET processed_at = processed_at - ?`, hour); err != nil {
		t.Fatal(err)
	}
	if _, err := db1.ExecContext(t.Context(), `UPDATE processed_clock SET now = now - ?`, hour); err != nil {
		t.Fatal(err)
	}
	stored := count(t, db1, `SELECT now FROM processed_clock`)

	d2 := newFakeDaemon(t)
	db2 := openTestDB(t, path)
	var calls2 atomic.Int64
	c2, _ := startTx(t, d2, processor.Options{DedupeRetention: 30 * time.Minute}, db2, insertEffect(&calls2))
	testsync.WaitFor(t, "the second processor's first retention pass", waitTimeout, func() bool {
		return count(t, db2, `SELECT now FROM processed_clock`) > stored
	})
	if now := count(t, db2, `SELECT now FROM processed_clock`); now-stored > int64(time.Minute) {
		t.Fatalf("the clock jumped %v over the stop: it counts downtime", time.Duration(now-stored))
	}
	if n := count(t, db2, `SELECT count(*) FROM processed`); n != 1 || c2.Stats().Forgotten != 0 {
		t.Fatalf("%d processed keys, %d forgotten, after an hour-long stop with a 30-minute retention: want the key kept", n, c2.Stats().Forgotten)
	}
	d2.sendFrame(t, 1, 2, evs...)
	d2.acksUntil(t, "the redelivered frame acked", func(acks []wire.Ack) bool { return framesAcked(acks)[1] == 1 })
	if n := calls2.Load(); n != 0 {
		t.Errorf("the redelivered event was applied again (%d calls)", n)
	}
}
