package testupstream

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Paging is how a Server splits its records into pages. Every style serves
// the records whose seq is above the "since" query parameter (the poll's
// cursor), at most Options.PageSize per response.
type Paging int

const (
	// PageSince serves one page per request; the client asks for the next
	// one with since = the last seq it got. It is Feed's behaviour.
	PageSince Paging = iota
	// PageLink adds an RFC 8288 header Link: <URL>; rel="next" while more
	// records follow. The URL is absolute and keeps the request's query,
	// with after=<the last seq served>.
	PageLink
	// PageBodyURL wraps the records in an object (see RecordsPath) with
	// "next": a relative URL built as for PageLink, absent on the last page.
	PageBodyURL
	// PageBodyToken wraps the records in an object with "next_token", an
	// opaque token the client sends back as ?token=, absent on the last page.
	PageBodyToken
	// PagePage serves page ?page=N (1 if absent) of the records; a page past
	// the end is empty.
	PagePage
	// PageOffset serves the records that follow the first ?offset=K (0 if
	// absent); past the end the page is empty.
	PageOffset
	// PageBodyCursor keeps the cursor in the body, as many APIs do: it wraps
	// the records in an object with "next_cursor", an opaque base64 cursor
	// (see BodyCursor) the client sends back as ?cursor=, present on every
	// page, and "has_more", true while more records follow. The "since"
	// parameter is ignored.
	PageBodyCursor
)

// BodyCursor is the opaque cursor PageBodyCursor serves after the record
// with seq n.
func BodyCursor(n int) string {
	return base64.URLEncoding.EncodeToString(fmt.Appendf(nil, "seq:%d", n))
}

// Options configure a Server.
type Options struct {
	// Total is the number of records: {"id":"ev-N","seq":N,...} for N =
	// 1..Total (see ID).
	Total int
	// PageSize caps the records of one response.
	PageSize int
	// Paging is the pagination style. Default PageSince.
	Paging Paging
	// RecordsPath wraps the records in an object at this dotted path, such
	// as "data.items"; PageBodyURL and PageBodyToken default to "data". A
	// wrapped body also has "last_seq": the last seq served (or since).
	RecordsPath string
	// NDJSON serves records one per line instead of as an array; not with
	// RecordsPath or the body styles.
	NDJSON bool
	// CursorHeader, when set, names the request header the "since" value is
	// read from instead of the query.
	CursorHeader string
	// ETag sends an ETag and answers 304 to a request whose If-None-Match
	// matches the response it would send.
	ETag bool
	// Gzip compresses a response when the request accepts gzip.
	Gzip bool
	// TLS serves https; Certificate returns the server's certificate.
	TLS bool
	// Pipe serves on an in-memory network instead of loopback TCP, for
	// tests in a testing/synctest bubble (a goroutine blocked on a socket
	// keeps a bubble's clock from advancing). Clients must dial with
	// DialContext. Create the Server inside the bubble.
	Pipe bool
	// RateWindow, when set, enforces a rate-limit window and announces it
	// in the headers of every response (see RateWindow).
	RateWindow *RateWindow
	// OAuth2, when set, serves a token endpoint at TokenPath and answers
	// 401 to every other request without a valid token (see OAuth2); those
	// answers are not in Requests.
	OAuth2 *OAuth2
	// Held serves no record (an empty page in the paging style) until
	// Release is called, so that a test can start watching before the
	// first record is fetched.
	Held bool
}

// Request is what a Server saw of one request.
type Request struct {
	// Time is when the request arrived.
	Time   time.Time
	Method string
	Path   string
	Query  url.Values
	Header http.Header
	Body   string
	// Status is the status answered; 0 for a request left hanging.
	Status int
	// Gzipped reports that the response body was gzip-encoded.
	Gzipped bool
}

// Server is an HTTP upstream for tests that serves a known sequence of
// records in a chosen paging style, answers scripted faults first, and
// records every request. Every response carries X-Last-Seq: the last seq
// served (or since, when none).
type Server struct {
	// URL is the server's base URL; records are served on every path.
	URL string

	opts Options
	ts   *httptest.Server // when not Pipe
	pipe *pipeListener    // when Pipe

	released atomic.Bool // see Options.Held

	mu       sync.Mutex
	script   []Fault
	requests []Request
	served   map[string]bool
	window   windowState
}

// NewServer starts a Server, closed when the test ends.
func NewServer(t testing.TB, opts Options) *Server {
	if opts.PageSize < 1 {
		opts.PageSize = 100
	}
	if opts.RecordsPath == "" && (opts.Paging == PageBodyURL || opts.Paging == PageBodyToken || opts.Paging == PageBodyCursor) {
		opts.RecordsPath = "data"
	}
	s := &Server{opts: opts, served: make(map[string]bool), window: windowState{start: time.Now()}}
	switch {
	case opts.Pipe:
		s.pipe = newPipeListener()
		hs := &http.Server{Handler: s}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = hs.Serve(s.pipe) // returns ErrServerClosed after Close
		}()
		t.Cleanup(func() {
			if err := hs.Close(); err != nil {
				t.Errorf("testupstream: close: %v", err)
			}
			<-done
		})
		s.URL = "http://upstream.test"
	case opts.TLS:
		s.ts = httptest.NewUnstartedServer(s)
		// Clients that refuse the test certificate are expected.
		s.ts.Config.ErrorLog = log.New(io.Discard, "", 0)
		s.ts.StartTLS()
	default:
		s.ts = httptest.NewServer(s)
	}
	if s.ts != nil {
		t.Cleanup(s.ts.Close)
		s.URL = s.ts.URL
	}
	return s
}

// DialContext connects to a Pipe server, whatever the address: use it as
// an http.Transport's DialContext.
func (s *Server) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if s.pipe == nil {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	return s.pipe.dial(ctx)
}

// Certificate returns a TLS server's certificate, or nil.
func (s *Server) Certificate() *x509.Certificate {
	if s.ts == nil || s.ts.TLS == nil {
		return nil
	}
	return s.ts.Certificate()
}

// Script queues faults: the next len(faults) requests get them, in order,
// then normal responses resume.
func (s *Server) Script(faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, faults...)
}

// Requests returns every request so far, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Served returns every non-empty record page served so far, uncompressed.
func (s *Server) Served() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.served))
	for b := range s.served {
		out = append(out, b)
	}
	return out
}

// Release makes a Held server serve its records.
func (s *Server) Release() { s.released.Store(true) }

// total is how many records the server serves now: none while held.
func (s *Server) total() int {
	if s.opts.Held && !s.released.Load() {
		return 0
	}
	return s.opts.Total
}

// ID returns the id of record n.
func ID(n int) string { return "ev-" + strconv.Itoa(n) }

// Record returns the bytes of record n as served.
func Record(n int) []byte {
	return fmt.Appendf(nil, `{"id":%q,"seq":%d,"ts":"2026-11-22T00:00:%02dZ","body":"record number %d"}`, ID(n), n, n%60, n)
}

// response is a planned answer, recorded before it is written.
type response struct {
	status int
	header http.Header
	body   []byte
	hang   bool
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.opts.OAuth2.intercept(w, r) {
		return
	}
	reqBody, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	req := Request{Time: time.Now(), Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(),
		Header: r.Header.Clone(), Body: string(reqBody)}
	s.mu.Lock()
	var fault *Fault
	if len(s.script) > 0 {
		fault = &s.script[0]
		s.script = s.script[1:]
	}
	s.mu.Unlock()

	var resp response
	if fault != nil && (fault.Status != 0 || fault.Hang) {
		resp = fault.response(req.Time)
	} else {
		resp = s.normal(r)
		if fault != nil {
			for name, vals := range fault.Header {
				resp.header[name] = vals
			}
		}
	}
	if !resp.hang && s.opts.Gzip && len(resp.body) > 0 && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(resp.body); err == nil && zw.Close() == nil {
			resp.body = buf.Bytes()
			resp.header.Set("Content-Encoding", "gzip")
			req.Gzipped = true
		}
	}
	s.mu.Lock()
	if !resp.hang && s.opts.RateWindow != nil {
		s.window.limit(*s.opts.RateWindow, req.Time, &resp)
	}
	if !resp.hang {
		req.Status = resp.status
	}
	s.requests = append(s.requests, req)
	s.mu.Unlock()

	if resp.hang {
		<-r.Context().Done()
		return
	}
	for name, vals := range resp.header {
		w.Header()[name] = vals
	}
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body) // a client gone away is its own problem
}

// normal plans the response with the records the request asks for.
func (s *Server) normal(r *http.Request) response {
	h := http.Header{"Content-Type": {"application/json"}}
	q := r.URL.Query()
	since := q.Get("since")
	if s.opts.CursorHeader != "" {
		since = r.Header.Get(s.opts.CursorHeader)
	}
	from, ok := atoi(since, 0)
	if !ok {
		return badRequest()
	}
	from, ok = s.pageStart(q, from)
	if !ok || from < 0 {
		return badRequest()
	}
	total := s.total()
	last := max(from, min(from+s.opts.PageSize, total))
	more := last < total
	h.Set("X-Last-Seq", strconv.Itoa(last))

	recs := s.records(h, from, last)
	next := ""
	if more && (s.opts.Paging == PageLink || s.opts.Paging == PageBodyURL) {
		nq := r.URL.Query()
		nq.Set("after", strconv.Itoa(last))
		next = r.URL.Path + "?" + nq.Encode()
		if s.opts.Paging == PageLink {
			h.Add("Link", fmt.Sprintf(`<%s%s>; rel="next", <%s%s>; rel="first"`, s.URL, next, s.URL, r.URL.Path))
		}
	}
	body := recs
	if s.opts.RecordsPath != "" {
		body = s.wrap(recs, next, more, last)
	}
	if s.opts.ETag {
		sum := sha256.Sum256(body)
		etag := `"` + hex.EncodeToString(sum[:8]) + `"`
		h.Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			return response{status: http.StatusNotModified, header: h}
		}
	}
	if last > from {
		s.mu.Lock()
		s.served[string(body)] = true
		s.mu.Unlock()
	}
	return response{status: http.StatusOK, header: h, body: body}
}

// pageStart returns the sequence a page starts after: from (the cursor)
// moved by the request's paging parameter q names, and whether that
// parameter is valid.
func (s *Server) pageStart(q url.Values, from int) (int, bool) {
	ok := true
	var n int
	switch s.opts.Paging {
	case PageLink, PageBodyURL:
		n, ok = atoi(q.Get("after"), from)
		from = max(from, n)
	case PageBodyToken:
		if tok := q.Get("token"); tok != "" {
			n, ok = atoi(strings.TrimPrefix(tok, "tok-"), -1)
			ok = ok && strings.HasPrefix(tok, "tok-") && n >= from
			from = n
		}
	case PageBodyCursor:
		from = 0
		if c := q.Get("cursor"); c != "" {
			raw, err := base64.URLEncoding.DecodeString(c)
			from, ok = atoi(strings.TrimPrefix(string(raw), "seq:"), -1)
			ok = ok && err == nil && strings.HasPrefix(string(raw), "seq:")
		}
	case PagePage:
		n, ok = atoi(q.Get("page"), 1)
		ok = ok && n >= 1
		from += (n - 1) * s.opts.PageSize
	case PageOffset:
		n, ok = atoi(q.Get("offset"), 0)
		from += n
	}
	return from, ok
}

// records returns records from+1..last as a JSON array, or as NDJSON
// (then setting h's Content-Type) when the server serves that.
func (s *Server) records(h http.Header, from, last int) []byte {
	var recs []byte
	if s.opts.NDJSON {
		h.Set("Content-Type", "application/x-ndjson")
		for i := from + 1; i <= last; i++ {
			recs = append(append(recs, Record(i)...), '\n')
		}
		return recs
	}
	recs = append(recs, '[')
	for i := from + 1; i <= last; i++ {
		if i > from+1 {
			recs = append(recs, ',')
		}
		recs = append(recs, Record(i)...)
	}
	return append(recs, ']')
}

func badRequest() response {
	return response{status: http.StatusBadRequest, header: http.Header{"Content-Type": {"text/plain"}},
		body: []byte("bad since, after, token, cursor, page or offset")}
}

// wrap puts recs at RecordsPath in an object, with the paging fields.
func (s *Server) wrap(recs []byte, next string, more bool, last int) []byte {
	keys := strings.Split(s.opts.RecordsPath, ".")
	var b []byte
	for _, k := range keys {
		b = fmt.Appendf(b, `{%q:`, k)
	}
	b = append(b, recs...)
	b = append(b, strings.Repeat("}", len(keys)-1)...)
	if next != "" {
		b = fmt.Appendf(b, `,"next":%q`, next)
	}
	if more && s.opts.Paging == PageBodyToken {
		b = fmt.Appendf(b, `,"next_token":"tok-%d"`, last)
	}
	if s.opts.Paging == PageBodyCursor {
		b = fmt.Appendf(b, `,"next_cursor":%q,"has_more":%t`, BodyCursor(last), more)
	}
	return fmt.Appendf(b, `,"last_seq":%d}`, last)
}

// atoi parses s, or returns def for "".
func atoi(s string, def int) (int, bool) {
	if s == "" {
		return def, true
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}
