// Package sqliteuri builds the SQLite URI of a database file for
// github.com/mattn/go-sqlite3, so that any path works: a '?', '#' or '%' in
// it is escaped as part of the name, and a relative path is made absolute
// (a "file://" URI takes the first segment of a relative path for its
// authority, which SQLite refuses).
package sqliteuri

import (
	"fmt"
	"net/url"
	"path/filepath"
)

// File returns the URI of the database file at path with the URI
// parameters in query (e.g. "_journal_mode=WAL&_txlock=immediate").
func File(path, query string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("database path %s: %w", path, err)
	}
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: query}).String(), nil
}
