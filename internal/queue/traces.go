package queue

import (
	"database/sql"
	"fmt"
)

// traceCols is the number of columns of an event_traces row.
const traceCols = 3

// prepareTraces prepares the inserts of event_traces rows: the trace
// context of push events (each request or envelope its own), stored only
// for traced events, so an untraced one costs no statement.
func (q *Queue) prepareTraces() (err error) {
	q.traces, err = prepareMultiInsert(q.wdb, "trace contexts",
		`INSERT INTO event_traces(seq, traceparent, tracestate) VALUES `, traceCols)
	return err
}

// pruneTraces deletes the trace contexts of events Prune deleted: every
// seq below the oldest event left.
func pruneTraces(tx *sql.Tx) error {
	if _, err := tx.Exec(`DELETE FROM event_traces WHERE seq < coalesce((SELECT id FROM events ORDER BY id LIMIT 1),
		(SELECT max(seq) + 1 FROM event_traces))`); err != nil {
		return fmt.Errorf("prune trace contexts: %w", err)
	}
	return nil
}
