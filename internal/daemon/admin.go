package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/ingestorhq/ingestor/internal/adminapi"
	"github.com/ingestorhq/ingestor/internal/queue"
)

// registerAdmin adds the dead-letter, quarantine, reload and tap endpoints
// to mux, each behind guard.
func (d *Daemon) registerAdmin(mux *http.ServeMux, guard *adminGuard) {
	dlq := queue.NewDLQ(d.queue, d.raw, d.sender.Submit)
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
	d.registerQuarantine(handle)
	d.registerReload(handle)
	handle("GET "+adminapi.TapPath, d.handleTap)
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
		w.Header().Set(adminapi.TotalCountHeader, strconv.Itoa(total))
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

// registerQuarantine adds the quarantine endpoints to mux through handle,
// which puts each behind the admin guard: GET /quarantine?source=S&limit=N
// (newest first, without bodies), GET /quarantine/{id} (with its body) and
// DELETE /quarantine?source=S.
func (d *Daemon) registerQuarantine(handle func(pattern string, h http.HandlerFunc)) {
	handle("GET /quarantine", func(w http.ResponseWriter, r *http.Request) {
		limit := 100
		if s := r.URL.Query().Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				d.writeError(w, http.StatusBadRequest, fmt.Errorf("limit %q: want a positive number", s))
				return
			}
			limit = n
		}
		list, err := d.queue.QuarantineList(r.Context(), r.URL.Query().Get("source"), limit)
		if err != nil {
			d.writeError(w, http.StatusInternalServerError, err)
			return
		}
		d.writeJSON(w, list)
	})
	handle("GET /quarantine/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			d.writeError(w, http.StatusBadRequest, fmt.Errorf("quarantined delivery id %q: %w", r.PathValue("id"), err))
			return
		}
		e, err := d.queue.Quarantined(r.Context(), id)
		switch {
		case errors.Is(err, queue.ErrNoQuarantined):
			d.writeError(w, http.StatusNotFound, err)
		case err != nil:
			d.writeError(w, http.StatusInternalServerError, err)
		default:
			d.writeJSON(w, e)
		}
	})
	handle("DELETE /quarantine", func(w http.ResponseWriter, r *http.Request) {
		source := r.URL.Query().Get("source")
		if source == "" {
			d.writeError(w, http.StatusBadRequest, errors.New("DELETE /quarantine needs ?source=S"))
			return
		}
		n, err := d.queue.ClearQuarantine(r.Context(), source)
		if err != nil {
			d.writeError(w, http.StatusInternalServerError, err)
			return
		}
		d.log.Info("quarantine cleared", "source", source, "deliveries", n)
		d.writeJSON(w, map[string]int{"cleared": n})
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

func (d *Daemon) decodeDLQRequest(w http.ResponseWriter, r *http.Request) (queue.DLQRequest, bool) {
	var req queue.DLQRequest
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
	case errors.Is(err, queue.ErrEmptyDLQRequest):
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
