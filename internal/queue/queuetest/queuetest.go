// Package queuetest helps tests block the queue for real.
package queuetest

import (
	"context"
	"database/sql"
	"testing"

	_ "github.com/mattn/go-sqlite3" // registers the sqlite3 driver
)

// HoldWriteLock takes the write lock of the SQLite database at path from a
// second connection and holds it until release is called (or the test
// ends). The queue's writer begins its transactions with BEGIN IMMEDIATE
// and a busy timeout of 10 s, so meanwhile it blocks for real, as behind a
// slow disk; release well within those 10 s, or its commits fail.
func HoldWriteLock(t testing.TB, path string) (release func()) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_txlock=immediate")
	if err != nil {
		t.Fatalf("hold the write lock of %s: %v", path, err)
	}
	// Not t.Context(): its end would roll the transaction back before the
	// cleanups run.
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatalf("hold the write lock of %s: %v", path, err)
	}
	released := false
	release = func() {
		if released {
			return
		}
		released = true
		if err := tx.Rollback(); err != nil {
			t.Errorf("release the write lock of %s: %v", path, err)
		}
		if err := db.Close(); err != nil {
			t.Errorf("release the write lock of %s: %v", path, err)
		}
	}
	t.Cleanup(release)
	return release
}
