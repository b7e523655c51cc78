package queue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Forget deletes the remembered events of source with the given keys that
// are not pending: acked ones, and those of dead-lettered frames. It
// leaves pending events alone, since they are delivered anyway. After it,
// an Append of the same keys queues them again: this is forced redelivery
// (`ingestor replay -force`). It returns how many events it forgot.
//
// Forget and the Append that follows commit separately: if the process
// dies between them, the events are forgotten but not queued, and running
// the same forced replay again queues them.
func (q *Queue) Forget(ctx context.Context, source string, keys []string) (int64, error) {
	var forgotten int64
	r := &request{apply: func(tx *sql.Tx) error {
		forgotten = 0
		// Frame ids must never be reused (a late ack would clear a newer
		// frame), and load() derives the next one from the newest event
		// among others: record the highest id allocated before deleting
		// events, as Prune does.
		if _, err := tx.Exec(`UPDATE meta SET value = max(value, ?) WHERE key = 'frame_high'`, q.nextFrame-1); err != nil {
			return err
		}
		st, err := tx.Prepare(`DELETE FROM events WHERE source = ? AND key = ?
			AND (acked = 1 OR NOT EXISTS (SELECT 1 FROM frames WHERE frames.id = events.frame_id))`)
		if err != nil {
			return err
		}
		for _, k := range keys {
			res, err := st.Exec(source, k)
			if err != nil {
				return errors.Join(err, st.Close())
			}
			n, err := res.RowsAffected()
			if err != nil {
				return errors.Join(err, st.Close())
			}
			forgotten += n
		}
		return st.Close()
	}}
	if err := q.submit(ctx, r, nil); err != nil {
		return 0, fmt.Errorf("forget events of %q: %w", source, err)
	}
	return forgotten, nil
}
