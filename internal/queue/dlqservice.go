package queue

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DLQEntry is a dead letter as the admin endpoints and `ingestor dlq`
// show it.
type DLQEntry struct {
	ID     int64  `json:"id"`
	Source string `json:"source"`
	// Kind is "event" or "payload" (a malformed upstream response).
	Kind       string `json:"kind"`
	Reason     string `json:"reason"`
	RawKey     string `json:"raw_key"`
	Frame      int64  `json:"frame,omitempty"`
	Seq        int64  `json:"seq,omitempty"`
	Key        string `json:"key,omitempty"`
	RawOff     int    `json:"raw_off,omitempty"`
	RawLen     int    `json:"raw_len,omitempty"`
	Deliveries int    `json:"deliveries"`
	// Count is how many times the payload failed while the entry was
	// active (1 for an event); LastSeen the last time.
	Count      int            `json:"count"`
	LastSeen   time.Time      `json:"last_seen"`
	CreatedAt  time.Time      `json:"created_at"`
	ReplayedAt time.Time      `json:"replayed_at,omitzero"`
	ResolvedAt time.Time      `json:"resolved_at,omitzero"`
	History    []HistoryEntry `json:"history,omitempty"`
	// Payload is the dead-lettered bytes, read from the raw store (show only).
	Payload string `json:"payload,omitempty"`
	// PayloadError says why Payload could not be read.
	PayloadError string `json:"payload_error,omitempty"`
}

// entryOf returns d as the admin endpoints show it.
func entryOf(d DeadLetter) DLQEntry {
	kind := "event"
	if d.IsPayload() {
		kind = "payload"
	}
	return DLQEntry{ID: d.ID, Source: d.Source, Kind: kind, Reason: d.Reason, RawKey: d.RawKey, Frame: d.Frame, Seq: d.Seq,
		Key: d.Key, RawOff: d.RawOff, RawLen: d.RawLen, Deliveries: d.Deliveries, Count: d.Count, LastSeen: d.LastSeen, CreatedAt: d.CreatedAt,
		ReplayedAt: d.ReplayedAt, ResolvedAt: d.ResolvedAt, History: d.History}
}

// DLQRequest selects the dead letters to replay or drop: IDs, a filter, or
// All. An empty request is refused, so that a slip never selects
// everything.
type DLQRequest struct {
	IDs    []int64   `json:"ids,omitempty"`
	Source string    `json:"source,omitempty"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since,omitzero"`
	Until  time.Time `json:"until,omitzero"`
	All    bool      `json:"all,omitempty"`
}

// ErrEmptyDLQRequest is returned for a request naming no ids, no filter
// and not All.
var ErrEmptyDLQRequest = errors.New("name dead-letter ids, a filter (source, reason, since, until) or all")

// filter returns the DLQFilter r selects, refusing an empty request.
func (r DLQRequest) filter() (DLQFilter, error) {
	f := DLQFilter{IDs: r.IDs, Source: r.Source, Reason: r.Reason, Since: r.Since, Until: r.Until}
	if f.IsZero() && !r.All {
		return f, ErrEmptyDLQRequest
	}
	return f, nil
}

// RawReader reads raw objects by key from the raw store that dead letters
// point into; rawstore.Store is one.
type RawReader interface {
	Get(ctx context.Context, key string) ([]byte, error)
}

// DLQ operates on a queue's dead-letter list. The daemon serves it on its
// admin endpoints; `ingestor dlq` uses it directly when no daemon runs.
type DLQ struct {
	q   *Queue
	raw RawReader
	// submit hands replayed frames to a running sender; nil when none runs
	// (the frames are then delivered by the next daemon start).
	submit func([]Frame)
}

// NewDLQ returns a DLQ over q whose payloads are read from raw. submit,
// when not nil, receives the frames of replayed events.
func NewDLQ(q *Queue, raw RawReader, submit func([]Frame)) *DLQ {
	return &DLQ{q: q, raw: raw, submit: submit}
}

// List returns the dead letters f selects, up to f.Limit, and how many
// it selects in all (whatever f.Limit and f.AfterID).
func (d *DLQ) List(ctx context.Context, f DLQFilter) ([]DLQEntry, int, error) {
	dls, err := d.q.ListDeadLetters(ctx, f)
	if err != nil {
		return nil, 0, err
	}
	total, err := d.q.CountDeadLetters(ctx, f)
	if err != nil {
		return nil, 0, err
	}
	out := make([]DLQEntry, 0, len(dls))
	for _, dl := range dls {
		out = append(out, entryOf(dl))
	}
	return out, total, nil
}

// Show returns one dead letter with its history and payload.
func (d *DLQ) Show(ctx context.Context, id int64) (DLQEntry, error) {
	dl, err := d.q.DeadLetterByID(ctx, id)
	if err != nil {
		return DLQEntry{}, err
	}
	e := entryOf(dl)
	body, err := d.raw.Get(ctx, dl.RawKey)
	switch {
	case err != nil:
		e.PayloadError = fmt.Sprintf("read raw object %s: %v", dl.RawKey, err)
	case dl.IsPayload():
		e.Payload = string(body)
	case dl.RawLen == 0:
		e.PayloadError = "the event is no longer held (replayed); see raw_key"
	case dl.RawOff < 0 || dl.RawOff+dl.RawLen > len(body):
		e.PayloadError = fmt.Sprintf("raw object %s: range [%d,+%d) outside %d bytes", dl.RawKey, dl.RawOff, dl.RawLen, len(body))
	default:
		e.Payload = string(body[dl.RawOff : dl.RawOff+dl.RawLen])
	}
	return e, nil
}

// Replay queues the events of the selected dead letters again and returns
// how many.
func (d *DLQ) Replay(ctx context.Context, r DLQRequest) (int, error) {
	f, err := r.filter()
	if err != nil {
		return 0, err
	}
	n, frames, err := d.q.ReplayDeadLetters(ctx, f)
	if err != nil {
		return 0, err
	}
	if d.submit != nil {
		d.submit(frames)
	}
	return n, nil
}

// Drop deletes the selected dead letters and returns how many.
func (d *DLQ) Drop(ctx context.Context, r DLQRequest) (int, error) {
	f, err := r.filter()
	if err != nil {
		return 0, err
	}
	return d.q.DropDeadLetters(ctx, f)
}

// TotalCountHeader is the response header of the daemon's GET /dlq giving
// how many dead letters the filter selects in all, beyond the page
// returned.
const TotalCountHeader = "X-Total-Count"
