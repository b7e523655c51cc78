package queue

import (
	"context"
	"errors"
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

// readTraces returns the trace contexts of the events in [first, last]
// that have their own, by seq.
func readTraces(ctx context.Context, db querier, first, last int64) (map[int64]Trace, error) {
	rows, err := db.QueryContext(ctx, `SELECT seq, traceparent, coalesce(tracestate, '') FROM event_traces WHERE seq BETWEEN ? AND ?`, first, last)
	if err != nil {
		return nil, err
	}
	var out map[int64]Trace
	for rows.Next() {
		var seq int64
		var t Trace
		if err := rows.Scan(&seq, &t.Parent, &t.State); err != nil {
			return nil, errors.Join(err, rows.Close())
		}
		if out == nil {
			out = map[int64]Trace{}
		}
		out[seq] = t
	}
	return out, errors.Join(rows.Err(), rows.Close())
}
