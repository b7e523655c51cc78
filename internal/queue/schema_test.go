package queue

import (
	"database/sql"
	"path/filepath"
	"testing"
)

// TestMigrateFromV1 builds a version-1 database by hand, fills it, opens
// it with Open and checks that its data survived and the v2 columns work.
func TestMigrateFromV1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		migrations[0],
		`PRAGMA user_version = 1`,
		`INSERT INTO raw_objects(id, key, fetched_at, seq_floor) VALUES (1, 'a/raw-0', 1000, 1)`,
		`INSERT INTO events(source, key, frame_id, event_time, raw_id, raw_off, raw_len) VALUES ('a','k0',1,0,1,0,10), ('a','k1',1,0,1,10,10)`,
		`INSERT INTO frames(id, source, n, first_seq, last_seq, deliveries, created_at) VALUES (1,'a',2,1,2,3,1000)`,
		`INSERT INTO offsets(source, cursor, updated_at) VALUES ('a','c1',1000)`,
		`INSERT INTO dead_letters(source, reason, raw_key, created_at) VALUES ('a','bad json','deadletter/a/1',1000)`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	q := openTest(t, path, 10)
	ctx := t.Context()
	var v int
	var mode string
	if err := q.rdb.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != len(migrations) {
		t.Fatalf("user_version = %d (err %v), want %d", v, err, len(migrations))
	}
	if err := q.rdb.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode = %q (err %v), want wal", mode, err)
	}
	if q.PendingEvents() != 2 || q.PendingFrames() != 1 {
		t.Fatalf("pending = %d events %d frames, want 2 and 1", q.PendingEvents(), q.PendingFrames())
	}
	if c, ok, err := q.Cursor(ctx, "a"); err != nil || !ok || c != "c1" {
		t.Fatalf("cursor = %q %v %v", c, ok, err)
	}
	f, ok, err := q.LoadFrame(ctx, 1)
	if err != nil || !ok || len(f.Events) != 2 || f.Deliveries != 3 || f.Events[1].RawKey != "a/raw-0" {
		t.Fatalf("frame 1 = %+v %v %v", f, ok, err)
	}
	dl, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dl) != 1 || dl[0].Reason != "bad json" || !dl[0].IsPayload() {
		t.Fatalf("dead letters = %+v %v", dl, err)
	}
	// The v2 columns: the ledger counts a duplicate, a retryable nack stores
	// its error, and the frame dead-letters per event with that error.
	if fr, err := q.Append(ctx, Batch{Source: "a", RawKey: "a/raw-1", Events: []NewEvent{{Key: "k0"}}}); err != nil || len(fr) != 0 {
		t.Fatalf("append duplicate: %v %v", fr, err)
	}
	if a := attempts(t, q, "a", "k0"); a != 2 {
		t.Fatalf("attempts of k0 = %d, want 2", a)
	}
	if _, err := q.Nack(ctx, []NackInput{{Frame: 1, Source: "a", Key: "k1", Reason: "timeout talking to db"}}); err != nil {
		t.Fatal(err)
	}
	if n, err := q.DeadLetterFrame(ctx, 1, "not acked after 3 deliveries"); err != nil || n != 2 {
		t.Fatalf("dead-lettered %d (err %v), want 2", n, err)
	}
	dl, err = q.ListDeadLetters(ctx, DLQFilter{Reason: "timeout talking to db"})
	if err != nil || len(dl) != 1 || dl[0].Key != "k1" || dl[0].Deliveries != 3 {
		t.Fatalf("dead letters with the last error = %+v %v", dl, err)
	}
}

func attempts(t *testing.T, q *Queue, source, key string) int {
	t.Helper()
	k, ok, err := lookupKey(t.Context(), q.rdb, source, key)
	if err != nil || !ok {
		t.Fatalf("ledger row of %s/%s: %v %v", source, key, ok, err)
	}
	return int(k.attempts)
}

// TestMigrateFromV2 opens a version-2 database with a payload dead letter:
// it stays active, and no fetch resolves it, since its request is unknown.
func TestMigrateFromV2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		migrations[0],
		migrations[1],
		`PRAGMA user_version = 2`,
		`INSERT INTO dead_letters(source, reason, raw_key, created_at) VALUES ('a','bad json','deadletter/a/1',1000)`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	q := openTest(t, path, 10)
	ctx := t.Context()
	var v int
	if err := q.rdb.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != len(migrations) {
		t.Fatalf("user_version = %d (err %v), want %d", v, err, len(migrations))
	}
	if n, err := q.ResolveDeadLetters(ctx, "a", ""); err != nil || n != 0 {
		t.Fatalf("resolve a: %d, %v; want the old entry left alone", n, err)
	}
	if dl, err := q.DeadLetters(ctx, 10); err != nil || len(dl) != 1 || !dl[0].ResolvedAt.IsZero() {
		t.Fatalf("dead letters = %+v, %v; want the old entry, active", dl, err)
	}
	if err := q.DeadLetter(ctx, "a", "truncated", "deadletter/a/2", ""); err != nil {
		t.Fatal(err)
	}
	if n, err := q.ResolveDeadLetters(ctx, "a", ""); err != nil || n != 1 {
		t.Fatalf("resolve a: %d, %v; want the new entry", n, err)
	}
}
