package sources

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/ingestorhq/ingestor/internal/pagebuf"
)

// httpPoll is an open http_poll source. Fetch is called by one goroutine at
// a time; MissingIDs and NewestRecordTime may be called from any.
type httpPoll struct {
	spec   HTTPPollSpec
	method string
	rules  recordRules
	// base is PollURL with {cursor} filled in: its scheme and host are the
	// only ones requests and redirects may go to.
	base *url.URL
	// fixedQuery holds the query parameters every request carries: those of
	// PollURL without {cursor}, then Query.
	fixedQuery url.Values
	// header holds the expanded headers. Its values are secrets: they never
	// appear in errors, logs or traces.
	header http.Header
	// limiters are waited on before every request: the source's own, then
	// the shared one. held keeps a reservation made for a request that was
	// not sent, for the next Fetch to use.
	limiters []*rate.Limiter
	held     []*rate.Reservation
	// where starts every error: source "NAME": poll URL, with no query or
	// user info, which may hold secrets.
	where     string
	client    *http.Client
	transport *http.Transport
	// auth, when set, sends each request with an OAuth2 token.
	auth  *oauth2Token
	trace func(TraceEvent)
	log   *slog.Logger
	// lastBody is the size of the last body accepted, the guess for the
	// next one's when the response does not say (Fetch is never
	// concurrent); a refused body does not count, or every later poll
	// would start with a buffer of max_body_bytes.
	lastBody int64
	// lastRecords is how many records the last page accepted held, and
	// lastRecordsBody its size: expectRecords scales them to the next one.
	lastRecords, lastRecordsBody int

	// validators remembers ETag and Last-Modified by URL, for conditional
	// requests. They are dropped when Fetch is called with a cursor other
	// than the one the last batch asked for (expect), since the caller then
	// fetches again what was not made durable.
	validators map[string]validators
	expect     string
	haveExpect bool
	// notBefore is set by Retry-After or an exhausted X-RateLimit budget:
	// no request is sent before it. notBeforeWhy says which.
	notBefore    time.Time
	notBeforeWhy string
	// notBeforeReason is the WaitError reason of notBefore.
	notBeforeReason string

	// streak counts the fetches before this one that went back to back
	// (each said More): a has_more catch-up run stops at max_pages.
	streak int

	missingIDs atomic.Int64
	newest     atomic.Int64 // unix nanoseconds; 0 = none yet
}

// validators are a response's cache validators.
type validators struct{ etag, lastModified string }

// MissingIDs returns how many records fetched so far lacked id_field and
// were keyed by the SHA-256 of their bytes instead.
func (p *httpPoll) MissingIDs() int64 { return p.missingIDs.Load() }

// NewestRecordTime returns the newest time_field value seen in a successful
// fetch, or the zero time.
func (p *httpPoll) NewestRecordTime() time.Time {
	if n := p.newest.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Fetch implements Source: one request (the poll's first page, or the
// page the cursor says comes next), parsed into records.
//
// Cursor invariant: the cursor sent is the largest cursor value among the
// records already made durable, and the upstream is expected to return the
// records whose cursor is >= it (or > it). With >=, the records whose cursor
// equals the current cursor are fetched again by the next poll; that is
// intended, and the queue drops them by their idempotency key. So the cursor
// never skips an event, even when several records share one cursor value and
// a page ends among them. (With >, an upstream that ends a page among
// records sharing a value would skip the rest: that is the upstream's
// contract to keep, nothing here can see it.)
func (p *httpPoll) Fetch(ctx context.Context, stored string) (*Batch, error) {
	if now := time.Now(); now.Before(p.notBefore) {
		return nil, &WaitError{Until: p.notBefore, Err: fmt.Errorf("%s: %s", p.where, p.notBeforeWhy), Reason: p.notBeforeReason}
	}
	if p.haveExpect && stored != p.expect {
		clear(p.validators)
	}
	c := decodeCursor(stored)
	if stored == "" {
		c.Start = p.spec.InitialCursor
	}
	if c.Next != "" && c.Mode != p.spec.Pagination {
		// The config changed in the middle of a poll: its page state means
		// nothing now. Starting the poll again from its cursor can only
		// fetch again what is durable, never skip.
		p.log.Info("pagination changed in the middle of a poll; starting it again from its cursor",
			"was", c.Mode, "now", p.spec.Pagination)
		c = pollCursor{Start: c.Start}
	}
	req, err := p.newRequest(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.where, err)
	}
	var notes []string
	if c.Next != "" {
		notes = append(notes, "page "+strconv.Itoa(c.Pages+1))
	}
	waited, err := p.waitLimiters(ctx)
	if waited > 0 {
		notes = append(notes, "waited "+waited.Round(time.Millisecond).String()+" for rate limit")
	}
	if err != nil {
		return nil, err
	}

	start := time.Now()
	ev := TraceEvent{Method: req.Method, URL: traceURL(req.URL)}
	b, err := p.exchange(req, c, stored, &ev, &notes)
	ev.Duration, ev.Err, ev.Note = time.Since(start), err, strings.Join(notes, "; ")
	p.log.DebugContext(ctx, "polled", "url", redactURL(req.URL), "status", ev.Status, "bytes", ev.Bytes, "note", ev.Note)
	if p.trace != nil {
		p.trace(ev)
	}
	if err != nil {
		p.streak = 0
		return nil, err
	}
	if b.More {
		p.streak++
	} else {
		p.streak = 0
	}
	p.expect, p.haveExpect = stored, true
	if b.Cursor != "" {
		p.expect = b.Cursor
	}
	return b, nil
}

// newRequest builds the request for the page c says comes next.
func (p *httpPoll) newRequest(ctx context.Context, c pollCursor) (*http.Request, error) {
	var u *url.URL
	if c.Next != "" && (p.spec.Pagination == "link" || p.spec.Pagination == "body_url") {
		ref, err := url.Parse(c.Next)
		if err != nil {
			return nil, fmt.Errorf("stored next page URL: %w", err)
		}
		u = p.base.ResolveReference(ref)
		q := u.Query()
		for name, vals := range p.fixedQuery {
			if _, ok := q[name]; !ok {
				q[name] = vals
			}
		}
		if p.spec.CursorParam != "" && c.Start != "" && !q.Has(p.spec.CursorParam) {
			q.Set(p.spec.CursorParam, c.Start)
		}
		u.RawQuery = q.Encode()
	} else {
		var err error
		if u, err = url.Parse(fillURLCursor(p.spec.PollURL, c.Start)); err != nil {
			return nil, err
		}
		q := u.Query()
		for name, value := range p.spec.Query {
			q.Set(name, value)
		}
		if p.spec.CursorParam != "" && c.Start != "" {
			q.Set(p.spec.CursorParam, c.Start)
		}
		switch p.spec.Pagination {
		case "body_token":
			if c.Next != "" {
				q.Set(p.spec.NextTokenParam, c.Next)
			}
		case "page":
			q.Set(p.spec.PageParam, orDefault(c.Next, strconv.Itoa(p.spec.PageStart)))
		case "offset":
			q.Set(p.spec.OffsetParam, orDefault(c.Next, "0"))
		}
		if len(q) > 0 {
			u.RawQuery = q.Encode()
		}
	}
	var body io.Reader
	if p.method == http.MethodPost && p.spec.Body != "" {
		body = strings.NewReader(strings.ReplaceAll(p.spec.Body, "{cursor}", string(appendJSONStringBody(nil, c.Start))))
	}
	req, err := http.NewRequestWithContext(ctx, p.method, u.String(), body)
	if err != nil {
		return nil, unwrapURLError(err)
	}
	req.Header = p.header.Clone()
	if host := p.header.Get("Host"); host != "" {
		req.Host = host
	}
	if p.spec.CursorRequestHeader != "" && c.Start != "" {
		req.Header.Set(p.spec.CursorRequestHeader, c.Start)
	}
	// Only a poll's first page is asked conditionally: a 304 there means
	// nothing new, while a page further on may be unchanged when the pages
	// after it are not.
	if c.Next == "" && p.method == http.MethodGet {
		if v, ok := p.validators[u.String()]; ok {
			if v.etag != "" {
				req.Header.Set("If-None-Match", v.etag)
			}
			if v.lastModified != "" {
				req.Header.Set("If-Modified-Since", v.lastModified)
			}
		}
	}
	return req, nil
}

// requestError is the source's error for a request that got no answer:
// a redirect to another host is a configuration problem, and an OAuth2
// token request's error is already the source's.
func (p *httpPoll) requestError(err error) error {
	var te *tokenError
	if errors.As(err, &te) {
		return te.err
	}
	err = unwrapURLError(err)
	if errors.Is(err, errOtherHost) {
		return &PermanentError{Err: fmt.Errorf("%s: %w", p.where, err)}
	}
	return fmt.Errorf("%s: %w", p.where, err)
}

// do sends req; with oauth2, with a token, and a 401 answer drops the
// token and sends req once more with a new one before the answer counts.
func (p *httpPoll) do(req *http.Request, notes *[]string) (*http.Response, error) {
	if p.auth == nil {
		return p.client.Do(req)
	}
	resp, again, err := p.auth.send(p.client, req, func(r *http.Response) { p.discard(r) })
	if again {
		*notes = append(*notes, "401: sent again with a new oauth2 token")
	}
	return resp, err
}

// orDefault returns a unless it is empty, else b.
func orDefault(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// exchange sends req and turns the response into a batch or an error.
func (p *httpPoll) exchange(req *http.Request, c pollCursor, stored string, ev *TraceEvent, notes *[]string) (*Batch, error) {
	var body []byte // read so far, for the trace
	resp, err := p.do(req, notes)
	if err != nil {
		return nil, p.requestError(err)
	}
	ev.Status = resp.StatusCode
	now := time.Now()
	defer func() { ev.Bytes = len(body) }()
	p.noteRateLimitHeaders(resp.Header, now, notes)
	switch status := resp.StatusCode; {
	case status == http.StatusNotModified || status == http.StatusNoContent:
		body = p.discard(resp)
		if status == http.StatusNotModified {
			*notes = append(*notes, "304 not modified")
		}
		b := &Batch{FetchedAt: now}
		b.Cursor = p.batchCursor(c, "", "", stored)
		return b, nil
	case status >= 200 && status <= 299:
		if body, err = p.readBody(resp); err != nil {
			return nil, err
		}
	default:
		body = p.discard(resp)
		return nil, p.statusError(resp, now, notes)
	}

	fetchedAt := time.Now()
	ex, err := p.rules.extract(body, SliceRecords, p.expectRecords(len(body)))
	if err != nil {
		return nil, &MalformedError{Body: body, FetchedAt: fetchedAt, Reason: err.Error(), Refetch: true}
	}
	p.lastRecords, p.lastRecordsBody = ex.total, len(body)
	if ex.missingIDs > 0 {
		p.missingIDs.Add(int64(ex.missingIDs))
		p.log.Debug("records without the id field, keyed by their SHA-256", "id_field", p.spec.IDField, "count", ex.missingIDs)
	}
	if t := ex.newest.UnixNano(); !ex.newest.IsZero() && t > p.newest.Load() {
		p.newest.Store(t)
	}
	b := &Batch{Body: body, FetchedAt: fetchedAt, Records: ex.records, Rest: ex.rest, Page: bodies.NewPage(body)}
	var found string
	switch p.spec.CursorFrom {
	case "record":
		found = ex.largest
	case "body":
		found = scalarField(body, p.spec.CursorBodyField)
	case "header":
		found = resp.Header.Get(p.spec.CursorHeader)
	}
	next, err := p.nextPage(resp, b, req.URL, c.Next)
	if err != nil {
		return nil, err
	}
	if next != "" && c.Pages+1 >= p.spec.MaxPages {
		*notes = append(*notes, "max_pages reached")
		next, b.Capped = "", true
	}
	b.Cursor, b.More = p.batchCursor(c, found, next, stored), next != ""
	if next == "" && p.hasMore(body, c, found) {
		if p.streak+1 >= p.spec.MaxPages {
			*notes = append(*notes, fmt.Sprintf("has_more, but max_pages (%d) pages went back to back: next poll after the interval", p.spec.MaxPages))
			b.Capped = true
		} else {
			*notes = append(*notes, "has_more: next poll at once")
			b.More = true
		}
	}
	if c.Next == "" && p.method == http.MethodGet {
		if v := (validators{resp.Header.Get("ETag"), resp.Header.Get("Last-Modified")}); v != (validators{}) {
			p.validators[req.URL.String()] = v
		}
	}
	return b, nil
}

// batchCursor is the cursor to store once a page is durable: the page state
// when another page follows, the next poll's cursor after the last page;
// "" when that is what is stored already.
func (p *httpPoll) batchCursor(c pollCursor, found, next, stored string) string {
	c.Found = p.foundCursor(c.Found, found)
	var out string
	if next != "" {
		out = pollCursor{Start: c.Start, Found: c.Found, Next: next, Pages: c.Pages + 1, Mode: p.spec.Pagination}.encode()
	} else {
		out = pollCursor{Start: p.finalCursor(c)}.encode()
	}
	switch {
	case out == stored:
		return ""
	case out == "":
		return "{}" // no cursor, replacing a stored page state
	}
	return out
}

// readBody reads a 2xx response's body, at most MaxBodyBytes after
// decompression. Go's transport decompresses gzip itself unless the
// headers ask for an encoding; then a gzip body is decompressed here.
func (p *httpPoll) readBody(resp *http.Response) ([]byte, error) {
	defer p.closeBody(resp)
	r := io.Reader(resp.Body)
	switch enc := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		gz, err := gzip.NewReader(resp.Body)
		if err != nil {
			return nil, fmt.Errorf("%s: gzip body: %w", p.where, err)
		}
		r = gz
	default:
		return nil, &PermanentError{Err: fmt.Errorf("%s: unsupported Content-Encoding %q (only gzip is decoded; do not set Accept-Encoding in headers)", p.where, enc)}
	}
	limit := p.spec.MaxBodyBytes
	if r == io.Reader(resp.Body) && resp.ContentLength > limit {
		// Refused before reading: nothing of it is ever held.
		return nil, fmt.Errorf("%s: response body is larger than max_body_bytes (%d): Content-Length %d", p.where, limit, resp.ContentLength)
	}
	// The buffer starts at the size the response announces (or the last
	// body's), so that a page is read into one allocation instead of a
	// dozen growing copies.
	size := p.lastBody
	if resp.ContentLength >= 0 && r == io.Reader(resp.Body) {
		size = resp.ContentLength
	}
	body, err := readInto(r, bodies.Get(bodyCap(size, limit)), limit)
	n := len(body)
	switch {
	case err != nil:
		err = fmt.Errorf("%s: read body: %w", p.where, err)
	case int64(n) > limit:
		err = fmt.Errorf("%s: response body is larger than max_body_bytes (%d)", p.where, limit)
	default:
		p.lastBody = int64(n)
		return body, nil
	}
	body = nil // dropped, for releaseBody to collect
	releaseBody(n)
	return body, err
}

// readAll reads r to its end into one buffer and returns what it read, at
// most limit+1 bytes: limit+1 means the body is larger than limit. The
// buffer starts at size+1 bytes (size is the body's announced or guessed
// size; the byte more sees the end without growing) and doubles, never
// past limit+1; a body that fills less than three quarters of it is
// copied into a buffer of its own size, so that a page in flight holds
// only its bytes.
func readAll(r io.Reader, size, limit int64) ([]byte, error) {
	return readInto(r, make([]byte, 0, bodyCap(size, limit)), limit)
}

// bodyCap is the capacity readAll starts with for a body of size bytes
// under limit.
func bodyCap(size, limit int64) int {
	return int(min(max(size+1, bytes.MinRead), limit+1))
}

// bodies are the buffers of the pages the http_poll sources fetch: the
// pipeline gives each back once nothing reads it any more (pagebuf).
var bodies pagebuf.Pool

// readInto is readAll into buf, an empty buffer of readAll's starting
// capacity or more (one from bodies, whose slack is small when the size
// was announced).
func readInto(r io.Reader, buf []byte, limit int64) ([]byte, error) {
	end := limit + 1
	for {
		room := min(int64(cap(buf)), end) - int64(len(buf))
		if room == 0 {
			if int64(len(buf)) == end {
				return buf, nil
			}
			grown := make([]byte, len(buf), min(2*int64(cap(buf)), end))
			copy(grown, buf)
			buf = grown
			continue
		}
		n, err := r.Read(buf[len(buf) : int64(len(buf))+room])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return buf, err
		}
	}
	if slack := cap(buf) - len(buf); slack > 64<<10 && slack > len(buf)/3 {
		buf = bytes.Clone(buf)
	}
	return buf, nil
}

// expectRecords guesses how many records a page of size bytes holds,
// from the last page: the capacity its records start with (0: no guess).
func (p *httpPoll) expectRecords(size int) int {
	if p.lastRecords == 0 || p.lastRecordsBody == 0 {
		return 0
	}
	n := int(int64(p.lastRecords) * int64(size) / int64(p.lastRecordsBody))
	return n + n/16 + 1
}

// releaseAt is the size from which the memory of a body read in vain is
// handed back to the operating system at once (releaseBody).
const releaseAt = 8 << 20

// releaseBody returns the memory of a body of n bytes that was read and
// then dropped (larger than max_body_bytes, or cut short) to the operating
// system, when it is large. Nothing refers to it any more, but the garbage
// collector, whose goal grew while the body was read, would keep it in the
// heap until the heap grew that much again or its forced collection every
// two minutes: an idle daemon would hold several times the body for
// minutes. debug.FreeOSMemory collects and returns it now, at the cost of
// one collection, paid only by a fetch that read a large body in vain.
func releaseBody(n int) {
	if n >= releaseAt {
		debug.FreeOSMemory()
	}
}

// discard reads a little of an unwanted body, so the connection can be
// reused, closes it, and returns what it read.
func (p *httpPoll) discard(resp *http.Response) []byte {
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		p.log.Debug("discarding response body", "error", err)
	}
	p.closeBody(resp)
	return b
}

func (p *httpPoll) closeBody(resp *http.Response) {
	if err := resp.Body.Close(); err != nil {
		// The body was read, or is not wanted: a failed close only costs
		// the connection.
		p.log.Debug("closing response body", "error", err)
	}
}

// statusError classifies a response that is neither 2xx nor 304: a
// *WaitError when the upstream said when to come back, a plain error (the
// caller backs off) for 408, 429 and 5xx, a *PermanentError for other 4xx.
func (p *httpPoll) statusError(resp *http.Response, now time.Time, notes *[]string) error {
	status := resp.StatusCode
	err := fmt.Errorf("%s: status %d", p.where, status)
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		if until, ok := retryAfter(resp.Header.Get("Retry-After"), now); ok {
			*notes = append(*notes, "Retry-After "+until.Sub(now).Round(time.Millisecond).String())
			p.notBefore, p.notBeforeWhy, p.notBeforeReason = until, fmt.Sprintf("status %d asked to retry after %s", status, until.UTC().Format(time.RFC3339)), WaitRetryAfter
			return &WaitError{Until: until, Err: err, Reason: WaitRetryAfter}
		}
	}
	if p.spec.SlowOnRateLimitHeaders && (status == http.StatusTooManyRequests || status == http.StatusForbidden) {
		if until, ok := rateLimitReset(resp.Header, now); ok {
			p.notBefore, p.notBeforeWhy, p.notBeforeReason = until, "rate limit exhausted until "+until.UTC().Format(time.RFC3339), WaitRateLimit
			return &WaitError{Until: until, Err: err, Reason: WaitRateLimit}
		}
	}
	switch {
	case status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500:
		return err
	case status >= 400:
		return &PermanentError{Err: err}
	}
	return err
}

// checkRedirect follows up to 10 redirects on the same scheme and host.
// Redirects elsewhere are refused: the headers carry credentials, and Go
// forwards every header except Authorization and Cookie to another host.
func (p *httpPoll) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Scheme != p.base.Scheme || req.URL.Host != p.base.Host {
		return fmt.Errorf("redirect to %s refused: %w", redactURL(req.URL), errOtherHost)
	}
	return nil
}

// Close implements Source.
func (p *httpPoll) Close() error {
	p.transport.CloseIdleConnections()
	return nil
}

// redactURL returns u without user info or query, which may hold secrets.
func redactURL(u *url.URL) string {
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return r.String()
}

// unwrapURLError drops the *url.Error wrapper, whose message repeats the
// full URL with its query.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
