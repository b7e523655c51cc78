package queue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// OldestPending returns the creation time of the oldest pending frame, or
// zero when nothing is pending. Frames are numbered in creation order, so
// it is one primary-key lookup, cheap enough for every metrics scrape.
func (q *Queue) OldestPending(ctx context.Context) (time.Time, error) {
	var oldest sql.NullInt64
	if err := q.rdb.QueryRowContext(ctx, `SELECT created_at FROM frames ORDER BY id LIMIT 1`).Scan(&oldest); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, fmt.Errorf("oldest pending frame: %w", err)
	}
	if !oldest.Valid {
		return time.Time{}, nil
	}
	return time.Unix(0, oldest.Int64), nil
}

// SourceCounts are one source's pending events and active dead letters.
type SourceCounts struct {
	PendingEvents int64
	DeadLetters   int64
}

// CountsBySource returns the pending events (summed over the pending
// frames, one row per frame) and the active dead letters (not replayed nor
// resolved) of every source that has any.
func (q *Queue) CountsBySource(ctx context.Context) (map[string]SourceCounts, error) {
	out := make(map[string]SourceCounts)
	add := func(query string, set func(c *SourceCounts, n int64)) error {
		rows, err := q.rdb.QueryContext(ctx, query)
		if err != nil {
			return fmt.Errorf("count by source: %w", err)
		}
		for rows.Next() {
			var source string
			var n int64
			if err := rows.Scan(&source, &n); err != nil {
				return fmt.Errorf("count by source: %w", errors.Join(err, rows.Close()))
			}
			c := out[source]
			set(&c, n)
			out[source] = c
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("count by source: %w", err)
		}
		return nil
	}
	if err := add(`SELECT source, sum(n) FROM frames GROUP BY source`, func(c *SourceCounts, n int64) { c.PendingEvents = n }); err != nil {
		return nil, err
	}
	if err := add(`SELECT source, count(*) FROM dead_letters WHERE replayed_at = 0 AND resolved_at = 0 GROUP BY source`,
		func(c *SourceCounts, n int64) { c.DeadLetters = n }); err != nil {
		return nil, err
	}
	return out, nil
}
