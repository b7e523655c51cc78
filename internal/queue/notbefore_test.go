package queue

import (
	"database/sql"
	"path/filepath"
	"testing"
	"time"
)

// TestNotBeforeSurvivesReopen migrates a version-2 database, records a
// not-before time for one source, and reads it back after closing and
// reopening the queue; the cursor stored before the migration is intact
// and a source with nothing recorded reads the zero time.
func TestNotBeforeSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		migrations[0],
		migrations[1],
		`PRAGMA user_version = 2`,
		`INSERT INTO offsets(source, cursor, updated_at) VALUES ('a','c1',1000)`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	ctx := t.Context()
	q, err := Open(Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if nb, err := q.NotBefore(ctx, "a"); err != nil || !nb.IsZero() {
		t.Fatalf("not-before of a source with none recorded = %v %v, want the zero time", nb, err)
	}
	until := time.Now().Add(3 * time.Second)
	if err := q.SetNotBefore(ctx, "a", until.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := q.SetNotBefore(ctx, "a", until); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	q = openTest(t, path, 10)
	if nb, err := q.NotBefore(ctx, "a"); err != nil || !nb.Equal(until) {
		t.Fatalf("not-before after reopening = %v %v, want the last one recorded, %v", nb, err, until)
	}
	if nb, err := q.NotBefore(ctx, "b"); err != nil || !nb.IsZero() {
		t.Fatalf("not-before of another source = %v %v, want the zero time", nb, err)
	}
	if c, ok, err := q.Cursor(ctx, "a"); err != nil || !ok || c != "c1" {
		t.Fatalf("cursor after the migration = %q %v %v, want c1", c, ok, err)
	}
}
