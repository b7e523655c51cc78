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

// statusQuery reads an event's ledger row (in either generation, by the
// condition where, on ?1 and ?2), its frame_log row, its mark, its raw
// object and its frame. An event is acked when its mark says so (acked by
// key) or when its frame is gone (acked whole); a dead-lettered one is
// marked acked and dead, and holds its raw reference in its mark (its
// frame_log row may be gone).
func statusQuery(where string) string {
	return `SELECT l.seq, l.source, l.key, coalesce(m.acked, 0), coalesce(m.dead, 0), l.attempts, l.last_seen, coalesce(m.last_error, ''),
	coalesce(r.fetched_at, 0), coalesce(f.deliveries, -1), v.scheme, v.secret, v.signed_at, v.received_at
	FROM (SELECT seq, source, key, attempts, last_seen FROM ledger_0 WHERE ` + where + `
		UNION ALL SELECT seq, source, key, attempts, last_seen FROM ledger_1 WHERE ` + where + `) l
	LEFT JOIN frame_log fl ON fl.first_seq = (SELECT max(first_seq) FROM frame_log WHERE first_seq <= l.seq) AND fl.last_seq >= l.seq
	LEFT JOIN event_marks m ON m.seq = l.seq
	LEFT JOIN raw_objects r ON r.id = coalesce(fl.raw_id, m.raw_id)
	LEFT JOIN frames f ON f.id = fl.frame_id AND l.seq BETWEEN f.first_seq AND f.last_seq
	LEFT JOIN event_verdicts v ON v.seq = l.seq`
}

// EventBySeq returns the status of event seq of source; ok is false when
// the ledger does not know it (never queued, or forgotten after the
// dedupe window).
func (q *Queue) EventBySeq(ctx context.Context, source string, seq int64) (st EventStatus, ok bool, err error) {
	// The ledger is keyed by (source, key): find the key in the event's
	// frame_log row (a dead event's row may be gone: then in its dead
	// letter), then read it by key.
	r, e, found, err := logEventAt(ctx, q.rdb, seq)
	if err != nil {
		return st, false, fmt.Errorf("read event status: %w", err)
	}
	key := e.key
	if !found || r.source != source {
		err := q.rdb.QueryRowContext(ctx, `SELECT event_key FROM dead_letters WHERE seq = ? AND source = ? AND event_key != '' ORDER BY id DESC LIMIT 1`, seq, source).Scan(&key)
		if errors.Is(err, sql.ErrNoRows) {
			return st, false, nil
		}
		if err != nil {
			return st, false, fmt.Errorf("read event status: %w", err)
		}
	}
	st, ok, err = q.EventByKey(ctx, source, key)
	if err != nil || !ok || st.Seq != seq {
		return EventStatus{}, false, err
	}
	return st, true, nil
}

// EventByKey returns the status of the event of source with idempotency
// key key; ok is false when the ledger does not know it.
func (q *Queue) EventByKey(ctx context.Context, source, key string) (st EventStatus, ok bool, err error) {
	return q.eventStatus(ctx, statusQuery(`source = ?1 AND key = ?2`), source, key)
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
	rows, err := q.rdb.QueryContext(ctx, statusQuery(`source = ?1 AND key IN (SELECT value FROM json_each(?2))`), source, string(list))
	if err != nil {
		return nil, fmt.Errorf("read event statuses: %w", err)
	}
	out := make(map[string]EventStatus, len(keys))
	var newest int64
	for rows.Next() {
		st, err := scanStatus(rows)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("read event statuses: %w", err), rows.Close())
		}
		out[st.Key] = st
		newest = max(newest, st.Seq)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("read event statuses: %w", err)
	}
	if err := q.durable.await(ctx, newest); err != nil {
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
	// Never report a commit its WAL sync has not yet made durable
	// (walsync.go).
	if err := q.durable.await(ctx, st.Seq); err != nil {
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
