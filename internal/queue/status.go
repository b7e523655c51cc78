package queue

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The states an event's status lookup answers.
const (
	// StatusQueued: committed, not yet sent to a processor.
	StatusQueued = "queued"
	// StatusDelivered: sent at least once, not yet acked.
	StatusDelivered = "delivered"
	// StatusAcked: a processor acked it.
	StatusAcked = "acked"
	// StatusDeadLettered: it sits in the dead-letter list.
	StatusDeadLettered = "dead_lettered"
)

// EventStatus is where one event stands in the queue's ledger.
type EventStatus struct {
	// Seq is the event's id in this queue.
	Seq    int64
	Source string
	Key    string
	// Status is one of StatusQueued, StatusDelivered, StatusAcked and
	// StatusDeadLettered.
	Status string
	// Deliveries counts the times its frame was sent to a processor, as
	// far as recorded (the sender records them in batches); it is known
	// only while the event is pending and is 0 once it is acked.
	Deliveries int
	// Received counts the arrivals of the event: 1, plus one for each
	// duplicate the ledger turned away.
	Received int
	// CreatedAt is when it was first received; UpdatedAt the last time
	// a duplicate of it arrived, or CreatedAt.
	CreatedAt, UpdatedAt time.Time
	// LastError is the last nack reason or delivery error, if any.
	LastError string
	// Verdict is the signature verdict stored with the event, or nil.
	Verdict *Verdict
}

// statusQuery reads an event's ledger row, its raw object and its frame.
// An event is acked when its row says so (acked by key) or when its frame
// is gone (acked whole); a dead-lettered one is marked acked and dead.
const statusQuery = `SELECT e.id, e.source, e.key, e.acked, e.dead, e.attempts, e.last_seen, e.last_error,
	r.fetched_at, coalesce(f.deliveries, -1), v.scheme, v.secret, v.signed_at, v.received_at
	FROM events e JOIN raw_objects r ON r.id = e.raw_id LEFT JOIN frames f ON f.id = e.frame_id
	LEFT JOIN event_verdicts v ON v.seq = e.id `

// EventBySeq returns the status of event seq of source; ok is false when
// the ledger does not know it (never queued, or forgotten after the
// dedupe window).
func (q *Queue) EventBySeq(ctx context.Context, source string, seq int64) (st EventStatus, ok bool, err error) {
	return q.eventStatus(ctx, statusQuery+`WHERE e.id = ? AND e.source = ?`, seq, source)
}

// EventByKey returns the status of the event of source with idempotency
// key key; ok is false when the ledger does not know it.
func (q *Queue) EventByKey(ctx context.Context, source, key string) (st EventStatus, ok bool, err error) {
	return q.eventStatus(ctx, statusQuery+`WHERE e.source = ? AND e.key = ?`, source, key)
}

// EventsByKeys returns the statuses of the events of source with the
// idempotency keys keys, by key, in one query (a key the ledger does not
// know is left out): the push inbox answers a group's duplicates with it,
// one read however many duplicates the group holds.
func (q *Queue) EventsByKeys(ctx context.Context, source string, keys []string) (map[string]EventStatus, error) {
	list, err := json.Marshal(keys)
	if err != nil {
		return nil, fmt.Errorf("read event statuses: %w", err)
	}
	rows, err := q.rdb.QueryContext(ctx, statusQuery+`WHERE e.source = ? AND e.key IN (SELECT value FROM json_each(?))`, source, string(list))
	if err != nil {
		return nil, fmt.Errorf("read event statuses: %w", err)
	}
	out := make(map[string]EventStatus, len(keys))
	for rows.Next() {
		st, err := scanStatus(rows)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("read event statuses: %w", err), rows.Close())
		}
		out[st.Key] = st
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("read event statuses: %w", err)
	}
	return out, nil
}

func (q *Queue) eventStatus(ctx context.Context, query string, args ...any) (EventStatus, bool, error) {
	st, err := scanStatus(q.rdb.QueryRowContext(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("read event status: %w", err)
	}
	return st, true, nil
}

// scanStatus reads one row of statusQuery.
func scanStatus(s scanner) (EventStatus, error) {
	var st EventStatus
	var acked, dead bool
	var lastSeen, created int64
	var deliveries int
	var v verdictRow
	if err := s.Scan(&st.Seq, &st.Source, &st.Key, &acked, &dead,
		&st.Received, &lastSeen, &st.LastError, &created, &deliveries, &v.scheme, &v.secret, &v.signedAt, &v.receivedAt); err != nil {
		return st, err
	}
	st.CreatedAt = time.Unix(0, created)
	st.Verdict = v.verdict()
	st.UpdatedAt = st.CreatedAt
	if lastSeen > created {
		st.UpdatedAt = time.Unix(0, lastSeen)
	}
	switch {
	case dead:
		st.Status = StatusDeadLettered
	case acked || deliveries < 0:
		st.Status = StatusAcked
	case deliveries > 0:
		st.Status, st.Deliveries = StatusDelivered, deliveries
	default:
		st.Status = StatusQueued
	}
	return st, nil
}
