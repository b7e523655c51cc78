package queue

import (
	"context"
	"database/sql"
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
		for _, k := range keys {
			row, ok, err := lookupKey(context.Background(), tx, source, k)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			// Pending: in a pending frame's seq range and not acked (a
			// dead event is acked).
			var pending bool
			if err := tx.QueryRow(`SELECT EXISTS (SELECT 1 FROM frames WHERE source = ?1 AND ?2 BETWEEN first_seq AND last_seq)
				AND NOT EXISTS (SELECT 1 FROM event_marks WHERE seq = ?2 AND acked = 1)`, source, row.seq).Scan(&pending); err != nil {
				return err
			}
			if pending {
				continue
			}
			// Its mark, if any, stays: an acked mark keeps the event out of a
			// frame still pending; the generation switch deletes it.
			if _, err := tx.Exec(`DELETE FROM `+ledgerTables[row.gen]+` WHERE source = ? AND key = ?`, source, k); err != nil {
				return err
			}
			forgotten++
		}
		return nil
	}}
	if err := q.submit(ctx, r, nil); err != nil {
		return 0, fmt.Errorf("forget events of %q: %w", source, err)
	}
	return forgotten, nil
}
