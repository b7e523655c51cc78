// Package testupstream holds HTTP upstreams for tests, in the manner of
// net/http/httptest. A Server serves a known, finite sequence of JSON
// records with stable ids in any of the common paging styles, answers
// scripted faults (429 with Retry-After, 5xx, hangs, malformed or oversize
// bodies, X-RateLimit headers), can enforce a rate-limit window that counts
// overruns (Options.RateWindow), supports ETag/304 and gzip, and records
// every request with its time, so tests can assert when requests were
// sent; a held one (Options.Held, NewHeld) serves nothing until Release,
// so a test can start watching before the first record. With
// Options.Pipe it runs on an in-memory network, for tests in a
// testing/synctest bubble. Feed is the simple form: records after a
// "since" cursor, one page per request. NewWS serves a WebSocket feed.
package testupstream

import (
	"net/http"
	"testing"
)

// Feed serves records {"id":"ev-<n>","seq":<n>,"ts":"...","body":"..."} for
// n = 1..Total, at most PageSize per response, those with seq > the "since"
// query parameter.
type Feed struct {
	// URL is the feed's base URL; poll it with ?since=CURSOR.
	URL string

	s *Server
}

// Malformed bodies the feed can be told to serve.
const (
	NotJSON    = "this is not json"
	WrongShape = `{"error":"an object, not an array"}`
	Empty      = ""
	// Truncated is a page cut off in the middle of its first record, as a
	// dropped connection leaves it.
	Truncated = `[{"id":"ev-1","seq":1,"ts":"2026-11-22T00:00:01Z","bo`
)

// New starts a feed of total records served pageSize at a time.
func New(t testing.TB, total, pageSize int) *Feed {
	s := NewServer(t, Options{Total: total, PageSize: pageSize})
	return &Feed{URL: s.URL, s: s}
}

// NewHeld starts a feed like New that serves no record until Release.
func NewHeld(t testing.TB, total, pageSize int) *Feed {
	s := NewServer(t, Options{Total: total, PageSize: pageSize, Held: true})
	return &Feed{URL: s.URL, s: s}
}

// Release makes a held feed serve its records.
func (f *Feed) Release() { f.s.Release() }

// ServeMalformed makes the next len(bodies) responses the given bodies,
// with status 200.
func (f *Feed) ServeMalformed(bodies ...string) {
	faults := make([]Fault, len(bodies))
	for i, b := range bodies {
		faults[i] = Body(http.StatusOK, b)
	}
	f.s.Script(faults...)
}

// Requests returns the "since" value of every request so far.
func (f *Feed) Requests() []string {
	reqs := f.s.Requests()
	out := make([]string, len(reqs))
	for i, r := range reqs {
		out[i] = r.Query.Get("since")
	}
	return out
}

// Served returns every non-empty record page served so far.
func (f *Feed) Served() []string { return f.s.Served() }
