package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
)

// DLQEntry is a dead letter as the admin endpoints and `ingestor dlq`
// show it.
type DLQEntry struct {
	ID     int64  `json:"id"`
	Source string `json:"source"`
	// Kind is "event" or "payload" (a malformed upstream response).
	Kind       string               `json:"kind"`
	Reason     string               `json:"reason"`
	RawKey     string               `json:"raw_key"`
	Frame      int64                `json:"frame,omitempty"`
	Seq        int64                `json:"seq,omitempty"`
	Key        string               `json:"key,omitempty"`
	RawOff     int                  `json:"raw_off,omitempty"`
	RawLen     int                  `json:"raw_len,omitempty"`
	Deliveries int                  `json:"deliveries"`
	CreatedAt  time.Time            `json:"created_at"`
	ReplayedAt time.Time            `json:"replayed_at,omitzero"`
	History    []queue.HistoryEntry `json:"history,omitempty"`
	// Payload is the dead-lettered bytes, read from the raw store (show only).
	Payload string `json:"payload,omitempty"`
	// PayloadError says why Payload could not be read.
	PayloadError string `json:"payload_error,omitempty"`
}

func entryOf(d queue.DeadLetter) DLQEntry {
	kind := "event"
	if d.IsPayload() {
		kind = "payload"
	}
	return DLQEntry{ID: d.ID, Source: d.Source, Kind: kind, Reason: d.Reason, RawKey: d.RawKey, Frame: d.Frame, Seq: d.Seq,
		Key: d.Key, RawOff: d.RawOff, RawLen: d.RawLen, Deliveries: d.Deliveries, CreatedAt: d.CreatedAt,
		ReplayedAt: d.ReplayedAt, History: d.History}
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

func (r DLQRequest) filter() (queue.DLQFilter, error) {
	f := queue.DLQFilter{IDs: r.IDs, Source: r.Source, Reason: r.Reason, Since: r.Since, Until: r.Until}
	if f.IsZero() && !r.All {
		return f, ErrEmptyDLQRequest
	}
	return f, nil
}

// DLQ operates on a queue's dead-letter list. The daemon serves it on its
// ops endpoints; `ingestor dlq` uses it directly when no daemon runs.
type DLQ struct {
	q   *queue.Queue
	raw rawstore.Store
	// submit hands replayed frames to a running sender; nil when none runs
	// (the frames are then delivered by the next daemon start).
	submit func([]queue.Frame)
}

// NewDLQ returns a DLQ over q whose payloads are read from raw. submit,
// when not nil, receives the frames of replayed events.
func NewDLQ(q *queue.Queue, raw rawstore.Store, submit func([]queue.Frame)) *DLQ {
	return &DLQ{q: q, raw: raw, submit: submit}
}

// List returns the dead letters f selects, up to f.Limit, and how many
// it selects in all (whatever f.Limit and f.AfterID).
func (d *DLQ) List(ctx context.Context, f queue.DLQFilter) ([]DLQEntry, int, error) {
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

// TotalCountHeader is the response header of GET /dlq giving how many
// dead letters the filter selects in all, beyond the page returned.
const TotalCountHeader = "X-Total-Count"

// registerAdmin adds the dead-letter endpoints to mux, each behind guard.
func (d *Daemon) registerAdmin(mux *http.ServeMux, guard *adminGuard) {
	dlq := NewDLQ(d.queue, d.raw, d.sender.Submit)
	handle := func(pattern string, h http.HandlerFunc) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if status, err := guard.check(r); status != 0 {
				if status == http.StatusUnauthorized {
					w.Header().Set("WWW-Authenticate", `Bearer realm="ingestor admin"`)
				}
				d.log.Warn("admin request refused", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "status", status, "err", err)
				d.writeError(w, status, err)
				return
			}
			h(w, r)
		})
	}
	handle("GET /dlq", func(w http.ResponseWriter, r *http.Request) {
		f, err := ParseDLQQuery(r.URL.Query())
		if err != nil {
			d.writeError(w, http.StatusBadRequest, err)
			return
		}
		list, total, err := dlq.List(r.Context(), f)
		if err != nil {
			d.writeError(w, http.StatusInternalServerError, err)
			return
		}
		w.Header().Set(TotalCountHeader, strconv.Itoa(total))
		d.writeJSON(w, list)
	})
	handle("GET /dlq/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			d.writeError(w, http.StatusBadRequest, fmt.Errorf("dead-letter id %q: %w", r.PathValue("id"), err))
			return
		}
		e, err := dlq.Show(r.Context(), id)
		if err != nil {
			d.writeError(w, statusOf(err), err)
			return
		}
		d.writeJSON(w, e)
	})
	handle("POST /dlq/replay", func(w http.ResponseWriter, r *http.Request) {
		req, ok := d.decodeDLQRequest(w, r)
		if !ok {
			return
		}
		n, err := dlq.Replay(r.Context(), req)
		if err != nil {
			d.writeError(w, statusOf(err), err)
			return
		}
		d.log.Info("dead letters replayed", "events", n)
		d.writeJSON(w, map[string]int{"replayed": n})
	})
	handle("POST /dlq/drop", func(w http.ResponseWriter, r *http.Request) {
		req, ok := d.decodeDLQRequest(w, r)
		if !ok {
			return
		}
		n, err := dlq.Drop(r.Context(), req)
		if err != nil {
			d.writeError(w, statusOf(err), err)
			return
		}
		d.log.Info("dead letters dropped", "entries", n)
		d.writeJSON(w, map[string]int{"dropped": n})
	})
}

// ParseDLQQuery reads a list filter from query parameters: id (repeated,
// to select those ids), source, reason (substring), since and until
// (RFC 3339), limit, after (an id, for paging) and replayed=1 to include
// replayed entries.
func ParseDLQQuery(v url.Values) (queue.DLQFilter, error) {
	f := queue.DLQFilter{Source: v.Get("source"), Reason: v.Get("reason"), IncludeReplayed: v.Get("replayed") == "1"}
	var errs []error
	for _, s := range v["id"] {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("id %q: %w", s, err))
		}
		f.IDs = append(f.IDs, id)
	}
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if s := v.Get(p.name); s != "" {
			t, err := time.Parse(time.RFC3339, s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.name, err))
			}
			*p.dst = t
		}
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("limit %q: want a positive number", s))
		}
		f.Limit = n
	}
	if s := v.Get("after"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("after %q: %w", s, err))
		}
		f.AfterID = n
	}
	return f, errors.Join(errs...)
}

// maxAdminBody caps a request body of the admin endpoints.
const maxAdminBody = 1 << 20

func (d *Daemon) decodeDLQRequest(w http.ResponseWriter, r *http.Request) (DLQRequest, bool) {
	var req DLQRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		d.writeError(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return req, false
	}
	return req, true
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, queue.ErrNoDeadLetter):
		return http.StatusNotFound
	case errors.Is(err, queue.ErrPayloadDeadLetter):
		return http.StatusConflict
	case errors.Is(err, ErrEmptyDLQRequest):
		return http.StatusBadRequest
	default:
		return http.StatusInternalServerError
	}
}

func (d *Daemon) writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		d.log.Debug("write admin response", "err", err) // the client went away
	}
}

func (d *Daemon) writeError(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if werr := json.NewEncoder(w).Encode(map[string]string{"error": err.Error()}); werr != nil {
		d.log.Debug("write admin response", "err", werr)
	}
}
