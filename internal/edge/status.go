package edge

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Stats is the backlog of an outbox, as `ingestor edge status` prints it.
type Stats struct {
	// Events and Bytes are the envelopes waiting for their ACK.
	Events, Bytes int64
	// Oldest is when the oldest of them was accepted (zero when none).
	Oldest time.Time
	// Retried counts those the daemon answered "retry" at least once
	// since the forwarder started.
	Retried int64
	// DeadLetters counts the envelopes the daemon rejected.
	DeadLetters int64
	// LastDeadLetter is the newest dead letter's reason and time.
	LastDeadLetter     string
	LastDeadLetterTime time.Time
}

// readStats reads the backlog from db.
func readStats(ctx context.Context, db *sql.DB) (Stats, error) {
	var s Stats
	var oldest sql.NullInt64
	err := db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(size), 0), MIN(created_at),
		COALESCE(SUM(next_attempt > 0), 0) FROM outbox`).Scan(&s.Events, &s.Bytes, &oldest, &s.Retried)
	if err != nil {
		return s, fmt.Errorf("read the backlog: %w", err)
	}
	if oldest.Valid {
		s.Oldest = time.UnixMilli(oldest.Int64)
	}
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM dead_letters`).Scan(&s.DeadLetters); err != nil {
		return s, fmt.Errorf("count the dead letters: %w", err)
	}
	if s.DeadLetters > 0 {
		var at int64
		if err := db.QueryRowContext(ctx, `SELECT reason, failed_at FROM dead_letters ORDER BY id DESC LIMIT 1`).Scan(&s.LastDeadLetter, &at); err != nil {
			return s, fmt.Errorf("read the last dead letter: %w", err)
		}
		s.LastDeadLetterTime = time.UnixMilli(at)
	}
	return s, nil
}

// ReadStatus reads the backlog of the outbox file at path, whether a
// forwarder is running on it or not. It never creates the file.
func ReadStatus(ctx context.Context, path string) (Stats, error) {
	if _, err := os.Stat(path); err != nil {
		return Stats{}, fmt.Errorf("outbox %s: %w", path, err)
	}
	db, err := openDB(path)
	if err != nil {
		return Stats{}, err
	}
	s, err := readStats(ctx, db)
	if err != nil {
		err = fmt.Errorf("outbox %s: %w", path, err)
	}
	return s, errors.Join(err, db.Close())
}

// Print writes s for an operator, with ages relative to now.
func (s Stats) Print(w io.Writer, path string, now time.Time) error {
	age := "-"
	if !s.Oldest.IsZero() {
		age = now.Sub(s.Oldest).Round(time.Second).String()
	}
	_, err := fmt.Fprintf(w, "outbox:        %s\npending:       %d events, %d bytes\noldest:        %s\nretried:       %d\ndead letters:  %d\n",
		path, s.Events, s.Bytes, age, s.Retried, s.DeadLetters)
	if err == nil && s.DeadLetters > 0 {
		_, err = fmt.Fprintf(w, "last rejected: %s ago: %s\n", now.Sub(s.LastDeadLetterTime).Round(time.Second), s.LastDeadLetter)
	}
	return err
}
