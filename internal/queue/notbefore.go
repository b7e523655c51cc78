package queue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// SetNotBefore records that source must send no request to its upstream
// before until (a Retry-After promise), replacing what was recorded. It
// returns once the record is committed, so a crash after it returns cannot
// forget the promise.
func (q *Queue) SetNotBefore(ctx context.Context, source string, until time.Time) error {
	r := &request{apply: func(tx *sql.Tx) error {
		_, err := tx.Exec(`INSERT INTO not_before(source, until, updated_at) VALUES (?,?,?)
			ON CONFLICT(source) DO UPDATE SET until = excluded.until, updated_at = excluded.updated_at`,
			source, until.UnixNano(), time.Now().UnixNano())
		return err
	}}
	if err := q.submit(ctx, r, nil); err != nil {
		return fmt.Errorf("store not-before time of %q: %w", source, err)
	}
	return nil
}

// NotBefore returns the time recorded by SetNotBefore for source, or the
// zero time when none is. A time in the past is returned as recorded.
func (q *Queue) NotBefore(ctx context.Context, source string) (time.Time, error) {
	var ns int64
	err := q.rdb.QueryRowContext(ctx, `SELECT until FROM not_before WHERE source = ?`, source).Scan(&ns)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("read not-before time of %q: %w", source, err)
	}
	return time.Unix(0, ns), nil
}
