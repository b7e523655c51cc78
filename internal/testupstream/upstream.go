// Package testupstream is an HTTP upstream for tests, in the manner of
// net/http/httptest: it serves a known, finite sequence of JSON records
// with a "since" cursor, records what it served, and can be told to answer
// with malformed payloads.
package testupstream

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
)

// Feed serves records {"id":"ev-<n>","seq":<n>,"ts":"...","body":"..."} for
// n = 1..Total, at most PageSize per response, those with seq > the "since"
// query parameter.
type Feed struct {
	// URL is the feed's base URL; poll it with ?since=CURSOR.
	URL string

	srv      *httptest.Server
	total    int
	pageSize int

	mu       sync.Mutex
	bad      []string // queued malformed responses, served before records
	requests []string // "since" value of every request
	bodies   map[string]bool
}

// Malformed bodies the feed can be told to serve.
const (
	NotJSON    = "this is not json"
	WrongShape = `{"error":"an object, not an array"}`
	Empty      = ""
)

// New starts a feed of total records served pageSize at a time.
func New(t testing.TB, total, pageSize int) *Feed {
	f := &Feed{total: total, pageSize: pageSize, bodies: make(map[string]bool)}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	f.URL = f.srv.URL
	return f
}

// ServeMalformed makes the next len(bodies) responses the given bodies.
func (f *Feed) ServeMalformed(bodies ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bad = append(f.bad, bodies...)
}

// Requests returns the "since" value of every request so far.
func (f *Feed) Requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// Served returns every non-empty record page served so far.
func (f *Feed) Served() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.bodies))
	for b := range f.bodies {
		out = append(out, b)
	}
	return out
}

// ID returns the id of record n.
func ID(n int) string { return "ev-" + strconv.Itoa(n) }

func (f *Feed) serve(w http.ResponseWriter, r *http.Request) {
	since := r.URL.Query().Get("since")
	f.mu.Lock()
	f.requests = append(f.requests, since)
	if len(f.bad) > 0 {
		body := f.bad[0]
		f.bad = f.bad[1:]
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
		return
	}
	f.mu.Unlock()
	from := 0
	if since != "" {
		n, err := strconv.Atoi(since)
		if err != nil {
			http.Error(w, "bad since", http.StatusBadRequest)
			return
		}
		from = n
	}
	body := make([]byte, 0, 128*f.pageSize)
	body = append(body, '[')
	for n := from + 1; n <= min(from+f.pageSize, f.total); n++ {
		if n > from+1 {
			body = append(body, ',')
		}
		body = fmt.Appendf(body, `{"id":%q,"seq":%d,"ts":"2026-11-22T00:00:%02dZ","body":"record number %d"}`, ID(n), n, n%60, n)
	}
	body = append(body, ']')
	if len(body) > 2 {
		f.mu.Lock()
		f.bodies[string(body)] = true
		f.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}
