package sources

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// HTTPPollSpec configures kind "http_poll": GET PollURL every interval and
// read a JSON array of records.
type HTTPPollSpec struct {
	// PollURL is the URL polled; required, http or https.
	PollURL string `toml:"poll_url"`
	// Headers are sent with every request; values may use ${ENV} and are
	// never logged.
	Headers map[string]string `toml:"headers"`
	// IDField is the dotted path of the record field that is the idempotency
	// key; when empty or absent in a record, the key is the SHA-256 of the
	// record's bytes.
	IDField string `toml:"id_field"`
	// CursorField is the dotted path of the record field whose largest value
	// becomes the cursor; empty means the source keeps no cursor.
	CursorField string `toml:"cursor_field"`
	// CursorParam is the query parameter that carries the cursor on the next
	// poll; required when CursorField is set.
	CursorParam string `toml:"cursor_param"`
	// TimeField is the dotted path of the record's RFC 3339 timestamp, used
	// for lag; optional.
	TimeField string `toml:"time_field"`
	// MaxBodyBytes caps a response body; a larger one is an error.
	MaxBodyBytes int64 `toml:"max_body_bytes"`
}

func newHTTPPollSpec() *HTTPPollSpec {
	return &HTTPPollSpec{MaxBodyBytes: 64 << 20}
}

// Validate implements Spec.
func (s *HTTPPollSpec) Validate() []FieldError {
	var errs []FieldError
	if s.PollURL == "" {
		errs = append(errs, FieldError{"poll_url", "is required for kind http_poll"})
	} else if u, err := url.Parse(s.PollURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, FieldError{"poll_url", "must be an absolute http or https URL"})
	}
	if s.CursorField != "" && s.CursorParam == "" {
		errs = append(errs, FieldError{"cursor_param", "is required when cursor_field is set"})
	}
	for _, p := range []struct{ key, val string }{{"id_field", s.IDField}, {"cursor_field", s.CursorField}, {"time_field", s.TimeField}} {
		if p.val != "" && (strings.HasPrefix(p.val, ".") || strings.HasSuffix(p.val, ".") || strings.Contains(p.val, "..")) {
			errs = append(errs, FieldError{p.key, "must be a dotted path such as \"id\" or \"meta.id\""})
		}
	}
	if s.MaxBodyBytes < 1 {
		errs = append(errs, FieldError{"max_body_bytes", "must be positive"})
	}
	return errs
}

// Open implements Spec: it builds the HTTP client. The config package has
// already expanded ${ENV} in the header values: they are used as they are.
func (s *HTTPPollSpec) Open(env Env) (Source, error) {
	if errs := s.Validate(); len(errs) > 0 {
		return nil, specErrors(env.Name, "http_poll", errs)
	}
	u, err := url.Parse(s.PollURL)
	if err != nil {
		return nil, fmt.Errorf("source %q: http_poll: poll_url: %w", env.Name, err)
	}
	header := make(http.Header, len(s.Headers)+1)
	for name, value := range s.Headers {
		header.Set(name, value)
	}
	if header.Get("Accept") == "" {
		header.Set("Accept", "application/json")
	}
	logger := env.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &httpPoll{
		base:        u,
		baseQuery:   u.Query(),
		header:      header,
		idField:     s.IDField,
		cursorField: s.CursorField,
		cursorParam: s.CursorParam,
		timeField:   s.TimeField,
		maxBody:     s.MaxBodyBytes,
		log:         logger,
	}
	p.where = fmt.Sprintf("source %q: poll %s", env.Name, redactURL(u))
	p.transport = http.DefaultTransport.(*http.Transport).Clone()
	p.client = &http.Client{
		Transport:     p.transport,
		Timeout:       env.Timeout,
		CheckRedirect: p.checkRedirect,
	}
	return p, nil
}

// httpPoll is an open http_poll source.
type httpPoll struct {
	// base is PollURL; baseQuery its query, to which the cursor is added.
	base      *url.URL
	baseQuery url.Values
	// header holds the expanded headers. Its values are secrets: they never
	// appear in errors or logs.
	header                                       http.Header
	idField, cursorField, cursorParam, timeField string
	maxBody                                      int64
	// where starts every error: source "NAME": poll URL, with no query or
	// user info, which may hold secrets.
	where     string
	client    *http.Client
	transport *http.Transport
	log       *slog.Logger
}

// Fetch implements Source: one GET of PollURL, parsed into records.
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
func (p *httpPoll) Fetch(ctx context.Context, cursor string) (*Batch, error) {
	u := *p.base
	if p.cursorParam != "" && cursor != "" {
		q := maps.Clone(p.baseQuery) // Set replaces a value slice, never edits one
		q.Set(p.cursorParam, cursor)
		u.RawQuery = q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.where, unwrapURLError(err))
	}
	req.Header = p.header.Clone()
	if host := p.header.Get("Host"); host != "" {
		req.Host = host
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.where, unwrapURLError(err))
	}
	body, err := p.readBody(resp)
	if err != nil {
		return nil, err
	}
	fetchedAt := time.Now()
	p.log.Debug("polled", "url", redactURL(&u), "status", resp.StatusCode, "bytes", len(body))
	if resp.StatusCode == http.StatusNoContent {
		return &Batch{Body: body, FetchedAt: fetchedAt}, nil // nothing new
	}
	return p.parse(body, fetchedAt, cursor)
}

// readBody checks the status and reads the body, at most maxBody bytes.
func (p *httpPoll) readBody(resp *http.Response) ([]byte, error) {
	var body []byte
	var err error
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		err = fmt.Errorf("%s: status %d", p.where, resp.StatusCode)
	} else if body, err = io.ReadAll(io.LimitReader(resp.Body, p.maxBody+1)); err != nil {
		err = fmt.Errorf("%s: read body: %w", p.where, err)
	} else if int64(len(body)) > p.maxBody {
		err = fmt.Errorf("%s: response body is larger than max_body_bytes (%d)", p.where, p.maxBody)
	}
	if cerr := resp.Body.Close(); cerr != nil {
		// The body was read, or is not wanted: a failed close only costs
		// the connection.
		p.log.Debug("closing response body", "error", cerr)
	}
	if err != nil {
		return nil, err
	}
	return body, nil
}

// parse splits body into records. A payload that is not a JSON array is a
// *MalformedError.
func (p *httpPoll) parse(body []byte, fetchedAt time.Time, cursor string) (*Batch, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, &MalformedError{Body: body, FetchedAt: fetchedAt, Reason: "empty body, expected a JSON array"}
	}
	spans, err := jsonscan.SplitArray(body)
	if err != nil {
		return nil, &MalformedError{Body: body, FetchedAt: fetchedAt, Reason: err.Error()}
	}
	b := &Batch{Body: body, FetchedAt: fetchedAt, Records: make([]Record, len(spans))}
	var largest string
	for i, sp := range spans {
		rec := body[sp.Off : sp.Off+sp.Len]
		r := &b.Records[i]
		r.Off, r.Len = sp.Off, sp.Len
		if r.Key = scalarField(rec, p.idField); r.Key == "" {
			sum := sha256.Sum256(rec)
			r.Key = hex.EncodeToString(sum[:])
		}
		if r.Cursor = scalarField(rec, p.cursorField); r.Cursor != "" {
			if largest == "" || CompareCursor(r.Cursor, largest) > 0 {
				largest = r.Cursor
			}
		}
		if ts := scalarField(rec, p.timeField); ts != "" {
			if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
				r.Time = t
			}
		}
	}
	// The cursor only moves forward: an upstream that answers with older
	// records than asked for (or a cursor field mixing kinds of values)
	// must not rewind it. Keeping it can only cause re-fetches, never a skip.
	if largest != "" && cursor != "" && CompareCursor(largest, cursor) < 0 {
		p.log.Warn("records are older than the cursor; keeping the cursor",
			"cursor", cursor, "largest_in_batch", largest)
		largest = ""
	}
	b.Cursor = largest
	return b, nil
}

// scalarField returns the text of the string or number at path in rec: a
// string unescaped, a number as written. It is "" when path is "", absent,
// or holds another kind of value.
func scalarField(rec []byte, path string) string {
	if path == "" {
		return ""
	}
	val, kind, ok := jsonscan.Field(rec, path)
	switch {
	case !ok:
		return ""
	case kind == jsonscan.Number:
		return string(val)
	case kind == jsonscan.String:
		s, err := jsonscan.Unquote(val)
		if err != nil {
			return "" // cannot happen: SplitArray validated the string
		}
		return s
	}
	return ""
}

// checkRedirect follows up to 10 redirects on the same scheme and host.
// Redirects elsewhere are refused: the headers carry credentials, and Go
// forwards every header except Authorization and Cookie to another host.
func (p *httpPoll) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Scheme != p.base.Scheme || req.URL.Host != p.base.Host {
		return fmt.Errorf("redirect to %s refused: only the poll URL's scheme and host are followed", redactURL(req.URL))
	}
	return nil
}

// redactURL returns u without user info or query, which may hold secrets.
func redactURL(u *url.URL) string {
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return r.String()
}

// Close implements Source.
func (p *httpPoll) Close() error {
	p.transport.CloseIdleConnections()
	return nil
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
