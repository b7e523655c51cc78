package queue

import (
	"database/sql"
	"time"
)

// Verdict is how a signed webhook event was verified when it arrived, kept
// with the event (table event_verdicts, keyed by its seq) so that a
// processor never has to verify it again against a clock. A source without
// a signature stores none, and costs no statement.
type Verdict struct {
	// Scheme is the source's signature scheme ("github", "stripe", ...).
	Scheme string
	// Secret is the position in the source's secrets of the one that
	// matched (0 with a single secret).
	Secret int
	// SignedAt is the time the signature signs, zero when the scheme signs
	// none; ReceivedAt when the request was verified.
	SignedAt, ReceivedAt time.Time
}

// verdictCols is the number of columns of an event_verdicts row.
const verdictCols = 5

// appendRow appends v's event_verdicts row for event seq to args.
func (v *Verdict) appendRow(args []any, seq int64) []any {
	var signed int64
	if !v.SignedAt.IsZero() {
		signed = v.SignedAt.Unix()
	}
	return append(args, seq, v.Scheme, v.Secret, signed, v.ReceivedAt.UnixNano())
}

// prepareVerdicts prepares the inserts of event_verdicts rows on the
// writer's connection, before the writer starts (the connection is the
// writer's alone after that).
func (q *Queue) prepareVerdicts() (err error) {
	q.verdicts, err = prepareMultiInsert(q.wdb, "signature verdicts",
		`INSERT INTO event_verdicts(seq, scheme, secret, signed_at, received_at) VALUES `, verdictCols)
	return err
}

// verdictRow is the event_verdicts columns of a status look-up, NULL when
// the event has no verdict.
type verdictRow struct {
	scheme           sql.NullString
	secret, signedAt sql.NullInt64
	receivedAt       sql.NullInt64
}

// verdict returns the row as a Verdict, nil for none.
func (r verdictRow) verdict() *Verdict {
	if !r.scheme.Valid {
		return nil
	}
	v := &Verdict{Scheme: r.scheme.String, Secret: int(r.secret.Int64), ReceivedAt: time.Unix(0, r.receivedAt.Int64).UTC()}
	if r.signedAt.Int64 != 0 {
		v.SignedAt = time.Unix(r.signedAt.Int64, 0).UTC()
	}
	return v
}
