package queue

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// The quarantine keeps the last deliveries a webhook source refused (a bad
// signature, a wrong token, a body too large, ...), so that ops can see why
// a provider's requests fail. It is bounded per source: each insert drops
// the source's oldest entries beyond its Keep in the same transaction. Its
// writes are lazy (see request.lazy): losing the last few to a power cut
// is fine, and they never wait for an fsync.

// ErrNoQuarantined is returned by Quarantined for an id the quarantine does
// not hold.
var ErrNoQuarantined = errors.New("no such quarantined delivery")

// Rejected is one refused delivery in the quarantine.
type Rejected struct {
	// ID is set by the quarantine.
	ID     int64     `json:"id"`
	Source string    `json:"source"`
	At     time.Time `json:"at"`
	// Reason is a short machine reason (bad_signature, missing_token,
	// too_large, ...); Detail the error the sender was answered.
	Reason    string `json:"reason"`
	Detail    string `json:"detail"`
	Code      int    `json:"code"`
	RequestID string `json:"request_id"`
	Remote    string `json:"remote"`
	Method    string `json:"method"`
	Path      string `json:"path"`
	// Headers are the request's headers, secrets redacted by the caller.
	Headers map[string][]string `json:"headers"`
	// Body is the request body as far as it was read, capped; Truncated is
	// true when it is not the whole body. Quarantine lists leave Body out.
	Body      []byte `json:"-"`
	Truncated bool   `json:"truncated"`
	// Keep is, when writing, how many entries of Source the quarantine
	// keeps (quarantine_size); it is not stored.
	Keep int `json:"-"`
}

// rejectedJSON is Rejected's JSON: the body as text when it is valid
// UTF-8, else as base64.
type rejectedJSON struct {
	rejectedFields
	Body         *string `json:"body,omitempty"`
	BodyEncoding string  `json:"body_encoding,omitempty"`
}

// rejectedFields is Rejected without its JSON methods.
type rejectedFields Rejected

// MarshalJSON implements json.Marshaler.
func (r Rejected) MarshalJSON() ([]byte, error) {
	j := rejectedJSON{rejectedFields: rejectedFields(r)}
	if r.Body != nil {
		text, enc := BodyText(r.Body)
		j.Body, j.BodyEncoding = &text, enc
	}
	return json.Marshal(j)
}

// UnmarshalJSON implements json.Unmarshaler.
func (r *Rejected) UnmarshalJSON(b []byte) error {
	var j rejectedJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*r = Rejected(j.rejectedFields)
	if j.Body == nil {
		return nil
	}
	if j.BodyEncoding == "base64" {
		body, err := base64.StdEncoding.DecodeString(*j.Body)
		if err != nil {
			return fmt.Errorf("body: %w", err)
		}
		r.Body = body
		return nil
	}
	r.Body = []byte(*j.Body)
	return nil
}

// BodyText returns body as text ("text") when it is valid UTF-8, else as
// standard base64 ("base64").
func BodyText(body []byte) (text, encoding string) {
	if utf8.Valid(body) {
		return string(body), "text"
	}
	return base64.StdEncoding.EncodeToString(body), "base64"
}

// Quarantine stores rs, each keeping at most its Keep newest entries of its
// source (the oldest are dropped in the same transaction), as one lazy
// request of the writer.
func (q *Queue) Quarantine(ctx context.Context, rs []Rejected) error {
	r := &request{lazy: true, apply: func(tx *sql.Tx) error {
		for _, e := range rs {
			headers, err := json.Marshal(e.Headers)
			if err != nil {
				return fmt.Errorf("quarantine a delivery of %s: headers: %w", e.Source, err)
			}
			body := e.Body
			if body == nil {
				body = []byte{}
			}
			if _, err := tx.Exec(`INSERT INTO quarantine(source, at, reason, detail, code, request_id, remote, method, path, headers, body, truncated)
				VALUES (?,?,?,?,?,?,?,?,?,?,?,?)`, e.Source, e.At.UnixNano(), e.Reason, e.Detail, e.Code, e.RequestID,
				e.Remote, e.Method, e.Path, string(headers), body, e.Truncated); err != nil {
				return fmt.Errorf("quarantine a delivery of %s: %w", e.Source, err)
			}
			if _, err := tx.Exec(`DELETE FROM quarantine WHERE source = ?1 AND id <=
				(SELECT id FROM quarantine WHERE source = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)`, e.Source, max(e.Keep, 0)); err != nil {
				return fmt.Errorf("quarantine a delivery of %s: drop the oldest: %w", e.Source, err)
			}
		}
		return nil
	}}
	return q.submit(ctx, r, nil)
}

// ClearQuarantine deletes every quarantined delivery of source and returns
// how many there were.
func (q *Queue) ClearQuarantine(ctx context.Context, source string) (int, error) {
	var n int64
	r := &request{apply: func(tx *sql.Tx) error {
		res, err := tx.Exec(`DELETE FROM quarantine WHERE source = ?`, source)
		if err != nil {
			return fmt.Errorf("clear the quarantine of %s: %w", source, err)
		}
		n, err = res.RowsAffected()
		return err
	}}
	if err := q.submit(ctx, r, nil); err != nil {
		return 0, err
	}
	return int(n), nil
}

// quarantineColumns are the columns of a Rejected but its body.
const quarantineColumns = `id, source, at, reason, detail, code, request_id, remote, method, path, headers, truncated`

// QuarantineList returns the newest limit quarantined deliveries, of source
// only unless it is "", newest first, without their bodies.
func (q *Queue) QuarantineList(ctx context.Context, source string, limit int) ([]Rejected, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := q.rdb.QueryContext(ctx, `SELECT `+quarantineColumns+` FROM quarantine
		WHERE ?1 = '' OR source = ?1 ORDER BY id DESC LIMIT ?2`, source, limit)
	if err != nil {
		return nil, fmt.Errorf("list the quarantine: %w", err)
	}
	list := []Rejected{}
	for rows.Next() {
		e, err := scanRejected(rows.Scan)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("list the quarantine: %w", err), rows.Close())
		}
		list = append(list, e)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("list the quarantine: %w", err)
	}
	return list, nil
}

// Quarantined returns the quarantined delivery id with its body, or
// ErrNoQuarantined.
func (q *Queue) Quarantined(ctx context.Context, id int64) (Rejected, error) {
	var body []byte
	e, err := scanRejected(func(dest ...any) error {
		return q.rdb.QueryRowContext(ctx, `SELECT `+quarantineColumns+`, body FROM quarantine WHERE id = ?`, id).
			Scan(append(dest, &body)...)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return e, fmt.Errorf("quarantined delivery %d: %w", id, ErrNoQuarantined)
	}
	if err != nil {
		return e, fmt.Errorf("read quarantined delivery %d: %w", id, err)
	}
	if body == nil {
		body = []byte{}
	}
	e.Body = body
	return e, nil
}

// scanRejected reads quarantineColumns with scan.
func scanRejected(scan func(dest ...any) error) (Rejected, error) {
	var e Rejected
	var at int64
	var headers string
	if err := scan(&e.ID, &e.Source, &at, &e.Reason, &e.Detail, &e.Code, &e.RequestID, &e.Remote, &e.Method, &e.Path,
		&headers, &e.Truncated); err != nil {
		return e, err
	}
	e.At = time.Unix(0, at).UTC()
	if err := json.Unmarshal([]byte(headers), &e.Headers); err != nil {
		return e, fmt.Errorf("quarantined delivery %d: headers: %w", e.ID, err)
	}
	return e, nil
}
