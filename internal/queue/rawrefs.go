package queue

import (
	"context"
	"errors"
	"fmt"
)

// RawKeysInUse returns the raw store keys whose bytes the queue may still
// need: those of every event in a pending frame (it may be sent again) and
// those of every dead letter (dlq show and replay read them; a dropped
// entry no longer counts). Raw retention never deletes one of them. The
// query reads the pending frames' frame_log rows by their seq ranges, so its cost
// follows the pending events (bounded by max_pending_events), not the
// events remembered for dedupe.
func (q *Queue) RawKeysInUse(ctx context.Context) (map[string]bool, error) {
	rows, err := q.rdb.QueryContext(ctx, `
SELECT DISTINCT r.key FROM frames f CROSS
	JOIN frame_log l ON l.first_seq BETWEEN f.first_seq AND f.last_seq
	JOIN raw_objects r ON r.id = l.raw_id
UNION
SELECT raw_key FROM dead_letters`)
	if err != nil {
		return nil, fmt.Errorf("raw keys in use: %w", err)
	}
	keys := map[string]bool{}
	for rows.Next() {
		var key string
		if err := rows.Scan(&key); err != nil {
			return nil, errors.Join(fmt.Errorf("raw keys in use: %w", err), rows.Close())
		}
		keys[key] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("raw keys in use: %w", err)
	}
	return keys, nil
}
