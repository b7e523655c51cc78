package sources

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"golang.org/x/time/rate"
)

// HTTPPollSpec configures kind "http_poll": request PollURL every interval,
// follow its pages, and read the records of each page.
//
// The cursor says where the next poll starts. It comes from the records
// (cursor_from = "record": the largest cursor_field value), from a body
// field or from a response header, and is sent back as a query parameter,
// a request header, or in place of {cursor} in PollURL or Body. Every
// request of one poll (its first page and the pages that follow) sends the
// cursor the poll started with; the cursor found on the pages becomes the
// next poll's once the last page is durable. How each pagination mode
// combines with it:
//
//   - "none": one request per poll.
//   - "link", "body_url": the next page is the URL the upstream gives
//     (Link rel="next", or the body field NextURLField), on PollURL's scheme
//     and host. Query parameters of PollURL, Query and CursorParam that the
//     next URL lacks are added to it; those it has are kept as given.
//   - "body_token": the first request again, plus NextTokenParam = the
//     token found at NextTokenField.
//   - "page": the first request with PageParam = PageStart, PageStart+1,
//     ... until a page has no records.
//   - "offset": the first request with OffsetParam = 0, then the number of
//     records received so far, until a page has no records.
//
// Each page is its own batch; the batch cursor of every page but the last
// also carries the page state, so a restart resumes at the next page. After
// MaxPages pages the poll ends early and the next poll, after the
// interval, starts again from its first page with the new cursor; a
// has_more catch-up run stops after MaxPages polls back to back likewise.
type HTTPPollSpec struct {
	// PollURL is the URL polled; required, http or https. {cursor} in it is
	// replaced by the URL-escaped cursor.
	PollURL string `toml:"poll_url"`
	// Method is "GET" (the default) or "POST".
	Method string `toml:"method"`
	// Headers are sent with every request; values may use ${ENV} and are
	// never logged or traced.
	Headers map[string]string `toml:"headers"`
	// Query holds query parameters added to PollURL's (replacing those of
	// the same name); values may use ${ENV}.
	Query map[string]string `toml:"query"`
	// Body is sent with every POST, as JSON (Content-Type application/json
	// unless Headers set one). {cursor} in it is replaced by the cursor
	// escaped for use inside a JSON string.
	Body string `toml:"body"`
	// Format is how records sit in a response: "json" (a JSON array, at
	// RecordsPath if set), "ndjson" (one JSON value per line) or "single"
	// (the body is one record). Default "json".
	Format string `toml:"format"`
	// RecordsPath is the dotted path of the records array in a JSON object
	// body, e.g. "data.items"; "" means the body is the array. A null there
	// means no records. Format "json" only.
	RecordsPath string `toml:"records_path"`
	// IDField is the dotted path of the record field that is the idempotency
	// key; when empty or absent in a record, the key is the SHA-256 of the
	// record's bytes.
	IDField string `toml:"id_field"`
	// SequenceField is the dotted path of the record's upstream sequence
	// number; when CursorField is empty it is the cursor field.
	SequenceField string `toml:"sequence_field"`
	// TimeField is the dotted path of the record's RFC 3339 timestamp, used
	// for lag; optional.
	TimeField string `toml:"time_field"`
	// CursorFrom says where the cursor comes from: "record" (the largest
	// CursorField value, which never moves backwards), "body" (the value at
	// CursorBodyField, e.g. a change token) or "header" (the response header
	// CursorHeader). Default "record".
	CursorFrom string `toml:"cursor_from"`
	// CursorField is the dotted path of the record field whose largest value
	// becomes the cursor, compared as numbers, RFC 3339 times or text;
	// cursor_from = "record" only. Empty (with no SequenceField) means the
	// source keeps no cursor.
	CursorField string `toml:"cursor_field"`
	// CursorBodyField is the dotted path of the cursor in the response body;
	// required with cursor_from = "body".
	CursorBodyField string `toml:"cursor_body_field"`
	// HasMoreField is the dotted path of a boolean in the response body;
	// while it is true (and the cursor at CursorBodyField moved), the next
	// poll is sent at once with the new cursor instead of after Interval.
	// Each page is still its own batch, stored with its cursor. Requires
	// cursor_from = "body".
	HasMoreField string `toml:"has_more_field"`
	// CursorHeader is the response header holding the cursor; required with
	// cursor_from = "header".
	CursorHeader string `toml:"cursor_header"`
	// CursorParam is the query parameter that carries the cursor.
	CursorParam string `toml:"cursor_param"`
	// CursorRequestHeader is the request header that carries the cursor.
	CursorRequestHeader string `toml:"cursor_request_header"`
	// InitialCursor is the cursor of the very first poll, before any is
	// durable; "" sends none.
	InitialCursor string `toml:"initial_cursor"`
	// Pagination is how one poll reads several pages: "none", "link",
	// "body_url", "body_token", "page" or "offset". Default "none".
	Pagination string `toml:"pagination"`
	// NextURLField is the dotted path of the next page's URL in the body;
	// required with pagination = "body_url".
	NextURLField string `toml:"next_url_field"`
	// NextTokenField is the dotted path of the next page's token in the
	// body; required with pagination = "body_token".
	NextTokenField string `toml:"next_token_field"`
	// NextTokenParam is the query parameter that carries the token; required
	// with pagination = "body_token".
	NextTokenParam string `toml:"next_token_param"`
	// PageParam is the query parameter of the page number; required with
	// pagination = "page".
	PageParam string `toml:"page_param"`
	// PageStart is the number of the first page. Default 1.
	PageStart int `toml:"page_start"`
	// OffsetParam is the query parameter of the offset; required with
	// pagination = "offset".
	OffsetParam string `toml:"offset_param"`
	// MaxPages caps the pages fetched back to back: those of one
	// paginated poll, and the polls of a has_more catch-up run. Then the
	// source waits for its interval (Batch.Capped), so that a long
	// catch-up yields, and /status says so. Default 100.
	MaxPages int `toml:"max_pages"`
	// OAuth2, when set ([source.NAME.oauth2]), gets the Authorization
	// header's bearer token from an OAuth2 token endpoint and keeps it
	// fresh (OAuth2Spec).
	OAuth2 *OAuth2Spec `toml:"oauth2"`
	// RateLimit is this source's own request rate, such as "10/s"; "" is
	// unlimited. Every request, page requests included, waits for it.
	RateLimit string `toml:"rate_limit"`
	// RateBurst is how many requests RateLimit lets through at once.
	// Default 1.
	RateBurst int `toml:"rate_burst"`
	// RateLimiter names a shared [rate_limiters.NAME] limiter, for sources
	// that hit one API; every request waits for it (and for RateLimit).
	RateLimiter string `toml:"rate_limiter"`
	// SlowOnRateLimitHeaders makes the source honour the rate-limit headers
	// (X-RateLimit-Remaining/-Reset, RateLimit-Remaining/-Reset and the
	// IETF draft's structured RateLimit field): at 0 remaining, no request
	// is sent before the reset time. Default true.
	SlowOnRateLimitHeaders bool `toml:"slow_on_ratelimit_headers"`
	// TLSCAFile is a PEM file of the CA certificates trusted for an https
	// PollURL, instead of the system's.
	TLSCAFile string `toml:"tls_ca_file"`
	// TLSInsecureSkipVerify disables TLS certificate verification: for
	// tests only, and logged loudly.
	TLSInsecureSkipVerify bool `toml:"tls_insecure_skip_verify"`
	// MaxBodyBytes caps a response body after decompression; a larger one
	// is an error. Default 64 MiB.
	MaxBodyBytes int64 `toml:"max_body_bytes"`
}

func newHTTPPollSpec() *HTTPPollSpec {
	return &HTTPPollSpec{
		Method:       http.MethodGet,
		Format:       "json",
		CursorFrom:   "record",
		Pagination:   "none",
		PageStart:    1,
		MaxPages:     100,
		RateBurst:    1,
		MaxBodyBytes: 64 << 20,

		SlowOnRateLimitHeaders: true,
	}
}

// LimiterName returns the shared rate limiter the source uses, or "".
func (s *HTTPPollSpec) LimiterName() string { return s.RateLimiter }

// cursorField is the record field the cursor is taken from, if any.
func (s *HTTPPollSpec) cursorField() string {
	if s.CursorFrom != "record" {
		return ""
	}
	if s.CursorField != "" {
		return s.CursorField
	}
	return s.SequenceField
}

// keepsCursor reports whether the source finds a cursor in its responses.
func (s *HTTPPollSpec) keepsCursor() bool {
	return s.cursorField() != "" || (s.CursorFrom == "body" && s.CursorBodyField != "") ||
		(s.CursorFrom == "header" && s.CursorHeader != "")
}

// sendsCursor reports whether the cursor has somewhere to go in a request.
func (s *HTTPPollSpec) sendsCursor() bool {
	return s.CursorParam != "" || s.CursorRequestHeader != "" ||
		strings.Contains(s.PollURL, "{cursor}") || strings.Contains(s.Body, "{cursor}")
}

// bodyIsObject reports whether the format lets body-level fields be read.
func (s *HTTPPollSpec) bodyIsObject() bool {
	return s.Format == "single" || (s.Format == "json" && s.RecordsPath != "")
}

// Validate implements Spec.
func (s *HTTPPollSpec) Validate() []FieldError {
	errs, _ := s.validate(false)
	return errs
}

// ValidateOffline implements OfflineSpec: tls_ca_file is not read.
func (s *HTTPPollSpec) ValidateOffline() ([]FieldError, []string) { return s.validate(true) }

func (s *HTTPPollSpec) validate(offline bool) ([]FieldError, []string) {
	var errs []FieldError
	bad := func(key, msg string, args ...any) { errs = append(errs, FieldError{key, fmt.Sprintf(msg, args...)}) }
	https := false
	if s.PollURL == "" {
		bad("poll_url", "is required for kind http_poll")
	} else if u, err := url.Parse(strings.ReplaceAll(s.PollURL, "{cursor}", "c")); err != nil ||
		(u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("poll_url", "must be an absolute http or https URL")
	} else {
		https = u.Scheme == "https"
	}
	switch strings.ToUpper(s.Method) {
	case http.MethodGet:
		if s.Body != "" {
			bad("body", "is only sent with method = \"POST\"")
		}
	case http.MethodPost:
	default:
		bad("method", "must be \"GET\" or \"POST\"")
	}
	for name := range s.Headers {
		if name == "" || strings.ContainsAny(name, " :\r\n") {
			bad("headers", "%q is not a valid header name", name)
		}
	}
	for name := range s.Query {
		if name == "" {
			bad("query", "a parameter name must not be empty")
		}
	}
	if s.OAuth2 != nil {
		errs = append(errs, s.OAuth2.validate(s.Headers)...)
	}
	paths := []struct{ key, val string }{
		{"records_path", s.RecordsPath}, {"id_field", s.IDField}, {"sequence_field", s.SequenceField},
		{"time_field", s.TimeField}, {"cursor_field", s.CursorField}, {"cursor_body_field", s.CursorBodyField},
		{"has_more_field", s.HasMoreField},
		{"next_url_field", s.NextURLField}, {"next_token_field", s.NextTokenField},
	}
	for _, p := range paths {
		if p.val != "" && !dottedPath(p.val) {
			bad(p.key, "must be a dotted path such as \"id\" or \"meta.id\"")
		}
	}
	switch s.Format {
	case "json":
	case "ndjson", "single":
		if s.RecordsPath != "" {
			bad("records_path", "is only used with format = \"json\"")
		}
	default:
		bad("format", "must be \"json\", \"ndjson\" or \"single\"")
	}
	errs = append(errs, s.validateCursor()...)
	errs = append(errs, s.validatePagination()...)
	if s.RateLimit != "" {
		if _, err := ParseRate(s.RateLimit); err != nil {
			bad("rate_limit", "%v", err)
		}
	}
	if s.RateBurst < 1 {
		bad("rate_burst", "must be at least 1")
	}
	tlsErrs, unread := validateClientTLS(s.TLSCAFile, s.TLSInsecureSkipVerify, https, "an https poll_url", offline)
	errs = append(errs, tlsErrs...)
	if s.MaxBodyBytes < 1 {
		bad("max_body_bytes", "must be positive")
	}
	return errs, unread
}

// validateCursor checks where the cursor comes from and where it goes.
func (s *HTTPPollSpec) validateCursor() []FieldError {
	var errs []FieldError
	bad := func(key, msg string) { errs = append(errs, FieldError{key, msg}) }
	switch s.CursorFrom {
	case "record":
	case "body":
		if s.CursorBodyField == "" {
			bad("cursor_body_field", "is required with cursor_from = \"body\"")
		} else if !s.bodyIsObject() {
			bad("cursor_body_field", "needs a body that is an object: format = \"single\", or \"json\" with records_path")
		}
	case "header":
		if s.CursorHeader == "" {
			bad("cursor_header", "is required with cursor_from = \"header\"")
		}
	default:
		bad("cursor_from", "must be \"record\", \"body\" or \"header\"")
	}
	if s.CursorField != "" && s.CursorFrom != "record" {
		bad("cursor_field", "is only used with cursor_from = \"record\"")
	}
	if s.CursorBodyField != "" && s.CursorFrom != "body" {
		bad("cursor_body_field", "is only used with cursor_from = \"body\"")
	}
	if s.HasMoreField != "" && (s.CursorFrom != "body" || s.CursorBodyField == "") {
		bad("has_more_field", "requires cursor_from = \"body\" and cursor_body_field")
	}
	if s.CursorHeader != "" && s.CursorFrom != "header" {
		bad("cursor_header", "is only used with cursor_from = \"header\"")
	}
	if len(errs) > 0 {
		return errs // the checks below would only repeat them
	}
	switch {
	case s.keepsCursor() && !s.sendsCursor():
		why := "cursor_from = \"" + s.CursorFrom + "\""
		if s.CursorFrom == "record" {
			why = "cursor_field is set"
			if s.CursorField == "" {
				why = "sequence_field is set"
			}
		}
		bad("cursor_param", "is required when "+why+" (or set cursor_request_header, or put {cursor} in poll_url or body)")
	case !s.keepsCursor() && s.sendsCursor():
		bad("cursor_from", "finds no cursor to send: set cursor_field (or sequence_field), or cursor_from = \"body\" or \"header\" with its key")
	case !s.keepsCursor() && s.InitialCursor != "":
		bad("initial_cursor", "is only used when the source keeps a cursor")
	}
	if s.CursorRequestHeader != "" && strings.ContainsAny(s.CursorRequestHeader, " :\r\n") {
		bad("cursor_request_header", "is not a valid header name")
	}
	return errs
}

// validatePagination checks the pagination mode and its keys.
func (s *HTTPPollSpec) validatePagination() []FieldError {
	var errs []FieldError
	bad := func(key, msg string) { errs = append(errs, FieldError{key, msg}) }
	only := func(key, val, mode string) {
		if val != "" && s.Pagination != mode {
			bad(key, "is only used with pagination = \""+mode+"\"")
		}
	}
	only("next_url_field", s.NextURLField, "body_url")
	only("next_token_field", s.NextTokenField, "body_token")
	only("next_token_param", s.NextTokenParam, "body_token")
	only("page_param", s.PageParam, "page")
	only("offset_param", s.OffsetParam, "offset")
	var param string
	switch s.Pagination {
	case "none", "link":
	case "body_url":
		if s.NextURLField == "" {
			bad("next_url_field", "is required with pagination = \"body_url\"")
		} else if !s.bodyIsObject() {
			bad("next_url_field", "needs a body that is an object: format = \"single\", or \"json\" with records_path")
		}
	case "body_token":
		if s.NextTokenField == "" {
			bad("next_token_field", "is required with pagination = \"body_token\"")
		} else if !s.bodyIsObject() {
			bad("next_token_field", "needs a body that is an object: format = \"single\", or \"json\" with records_path")
		}
		if param = s.NextTokenParam; param == "" {
			bad("next_token_param", "is required with pagination = \"body_token\"")
		}
	case "page":
		if param = s.PageParam; param == "" {
			bad("page_param", "is required with pagination = \"page\"")
		}
	case "offset":
		if param = s.OffsetParam; param == "" {
			bad("offset_param", "is required with pagination = \"offset\"")
		}
	default:
		bad("pagination", "must be \"none\", \"link\", \"body_url\", \"body_token\", \"page\" or \"offset\"")
	}
	if param != "" && param == s.CursorParam {
		bad("cursor_param", "must differ from the pagination parameter")
	}
	if s.PageStart < 0 {
		bad("page_start", "must not be negative")
	}
	if s.MaxPages < 1 {
		bad("max_pages", "must be at least 1")
	}
	return errs
}

// Open implements Spec: it builds the HTTP client and the rate limiters. The
// config package has already expanded ${ENV} in the values: they are used as
// they are.
func (s *HTTPPollSpec) Open(env Env) (Source, error) {
	if errs := s.Validate(); len(errs) > 0 {
		return nil, specErrors(env.Name, "http_poll", errs)
	}
	fail := func(key string, err error) (Source, error) {
		return nil, fmt.Errorf("source %q: http_poll: %s: %w", env.Name, key, err)
	}
	logger := env.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &httpPoll{
		spec:       *s,
		method:     strings.ToUpper(s.Method),
		rules:      recordRules{format: s.Format, recordsPath: s.RecordsPath, idField: s.IDField, cursorField: s.cursorField(), timeField: s.TimeField},
		trace:      env.Trace,
		log:        logger,
		validators: make(map[string]validators),
	}
	var err error
	if p.base, err = url.Parse(strings.ReplaceAll(s.PollURL, "{cursor}", "c")); err != nil {
		return fail("poll_url", err)
	}
	// The parameters of PollURL that do not hold {cursor} are the same
	// whatever the cursor.
	p.fixedQuery = p.base.Query()
	if other, err := url.Parse(strings.ReplaceAll(s.PollURL, "{cursor}", "d")); err == nil {
		q := other.Query()
		for name, vals := range p.fixedQuery {
			if !slices.Equal(vals, q[name]) {
				delete(p.fixedQuery, name)
			}
		}
	}
	for name, value := range s.Query {
		p.fixedQuery.Set(name, value)
	}
	p.header = s.requestHeader(env.Member)
	if s.RateLimit != "" {
		r, err := ParseRate(s.RateLimit)
		if err != nil {
			return fail("rate_limit", err)
		}
		p.limiters = append(p.limiters, rate.NewLimiter(r.Limit, s.RateBurst))
	}
	if s.RateLimiter != "" {
		l := env.Limiters.Get(s.RateLimiter)
		if l == nil {
			return fail("rate_limiter", fmt.Errorf("no [rate_limiters.%s] is defined", s.RateLimiter))
		}
		p.limiters = append(p.limiters, l)
	}
	p.held = make([]*rate.Reservation, len(p.limiters))
	p.where = fmt.Sprintf("source %q: poll %s", env.Name, redactURL(p.base))

	p.transport = http.DefaultTransport.(*http.Transport).Clone()
	if p.transport.TLSClientConfig, err = clientTLSConfig(s.TLSCAFile, s.TLSInsecureSkipVerify, logger); err != nil {
		return nil, fmt.Errorf("source %q: http_poll: %w", env.Name, err)
	}
	p.client = &http.Client{
		Transport:     env.transport(p.transport),
		Timeout:       env.Timeout,
		CheckRedirect: p.checkRedirect,
	}
	if s.OAuth2 != nil {
		if p.auth, err = openOAuth2(s.OAuth2, env, p.transport, logger); err != nil {
			return fail("oauth2", err)
		}
	}
	return p, nil
}

// requestHeader returns the header every request of the source sends:
// Headers, with Accept (and for a Body, Content-Type) application/json
// unless they set it, and MemberHeader in cluster mode.
func (s *HTTPPollSpec) requestHeader(member string) http.Header {
	h := make(http.Header, len(s.Headers)+2)
	for name, value := range s.Headers {
		h.Set(name, value)
	}
	if h.Get("Accept") == "" {
		h.Set("Accept", "application/json")
	}
	if member != "" {
		h.Set(MemberHeader, member)
	}
	if s.Body != "" && h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json")
	}
	return h
}

// errOtherHost refuses a redirect or a next page URL on another scheme or
// host than the poll URL's: the headers carry credentials.
var errOtherHost = errors.New("only the poll URL's scheme and host are followed")
