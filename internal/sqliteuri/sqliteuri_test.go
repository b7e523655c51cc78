package sqliteuri

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	_ "github.com/mattn/go-sqlite3"
)

// TestFileOpensThePathGiven opens databases by a relative path (as the
// default data_dir "./data" gives) and by a path with the characters a
// URI gives a meaning to, and checks each file is created where named.
func TestFileOpensThePathGiven(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.Mkdir("data?x=1#frag%41 dir", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"data.db", "./rel.db", "data?x=1#frag%41 dir/q.db", filepath.Join(dir, "abs.db")} {
		uri, err := File(path, "_journal_mode=WAL")
		if err != nil {
			t.Fatal(err)
		}
		db, err := sql.Open("sqlite3", uri)
		if err != nil {
			t.Fatalf("%s: open %s: %v", path, uri, err)
		}
		var mode string
		if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
			t.Fatalf("%s: journal mode %q (%v) through %s, want wal", path, mode, err, uri)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("%s: not created at the path given (uri %s): %v", path, uri, err)
		}
	}
}
