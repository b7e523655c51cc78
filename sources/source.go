// Package sources holds the source kinds. A kind is a group of files
// named after it. KIND.go holds its Spec (the keys of a [source.NAME] block
// beyond the common ones, with their defaults), Validate and Open; a small
// kind keeps its fetch logic there too (demo.go), a larger one splits it
// into KIND_PART.go files beside it. http_poll is httppoll.go with
// httppoll_fetch.go (requests and responses), httppoll_pages.go
// (pagination and the cursor), httppoll_records.go (finding records) and
// httppoll_limits.go (rate limits and Retry-After); websocket is
// websocket.go (Spec, Open, Fetch) with websocket_conn.go (the connection,
// reads and keepalive) and websocket_parse.go (messages into records); sse
// is sse.go (Spec, Open, Fetch) with sse_conn.go (the stream, reconnects
// and timeouts) and sse_parse.go (the event-stream scanner, and events
// into records).
// Their tests are the KIND*_test.go files. A new kind adds its files and
// one line to the kinds map in source.go.
//
// The push kinds, webhook (webhook.go) and ws_ingress (wsingress.go),
// hold only their Spec here: their upstreams send to the daemon's push
// listener, which package internal/push serves.
//
// This file holds what every kind shares: Source, Spec, Env, Batch,
// Record and the errors a Fetch returns. cursor.go, push.go, ratelimit.go,
// tls.go, oauth2.go and stream.go hold what several kinds use: cursor
// comparison, what the push kinds (webhook, ws_ingress) share, named rate
// limiters, client TLS settings, OAuth2 tokens (http_poll, websocket,
// sse), and what the streaming kinds (websocket, sse) share: the reader
// goroutine's buffer and lifecycle, the connection's state, and the
// outage errors of Fetch.
package sources

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/pagebuf"
)

// Record is one event found in a fetched payload. Its bytes are
// Batch.Body[Off:Off+Len], exactly as the upstream sent them.
type Record struct {
	// Key is the idempotency key, stable across re-fetches of the same record.
	Key string
	// Cursor is the record's cursor value as found (raw JSON scalar text, quotes
	// removed), or empty when the source has no cursor field.
	Cursor string
	// Time is the record's own timestamp, or the zero time when unknown.
	Time time.Time
	// Off and Len locate the record's bytes in Batch.Body.
	Off, Len int
}

// Batch is the result of one fetch: one raw payload and the records in it.
type Batch struct {
	// Body is the raw payload exactly as fetched (after transport decoding such
	// as gzip). It is what the raw store keeps.
	Body []byte
	// FetchedAt is when the payload was received.
	FetchedAt time.Time
	// Records are the events found in Body, in upstream order: all of
	// them, or when Rest is set the first SliceRecords of them.
	Records []Record
	// Rest, when set, reads the records that follow Records in Body, a
	// slice at a time: a page of more than SliceRecords records keeps
	// only its first slice in Records, so that the records of a page of
	// any size are never all in memory at once. Whoever takes the batch
	// reads the rest as it goes (the pipeline commits the page in slices).
	Rest *RecordReader
	// Cursor is the cursor to persist once this batch is durable; empty means
	// the cursor does not change. It is opaque to the caller: a source may
	// encode several values in it (a page token and a high-water mark, say),
	// so that a restart resumes mid-pagination at the right page.
	Cursor string
	// More reports that the upstream has more data right now (the next page
	// of a paginated poll): the caller fetches again, with Cursor, as soon
	// as its window allows instead of waiting for the interval.
	More bool
	// Capped reports that the upstream has more right now, but the source
	// has fetched max_pages pages back to back (a catch-up run, or the
	// pages of one poll): the caller waits for its interval before the
	// next fetch, so that a long catch-up yields, and says so.
	Capped bool
	// Page, when set, is the pooled buffer Body was read into (pagebuf):
	// whoever takes the batch calls Page.Release once it is committed and
	// only its frames still read Body (each through its own hold), or
	// Page.Keep when something may read Body later than that. Left alone,
	// the buffer is simply not recycled.
	Page *pagebuf.Page
	// Trace is the span context of the poll that fetched the batch, set by
	// the pipeline; its raw write and commit are traced under it when it
	// is sampled, and its events carry it to processors.
	Trace trace.SpanContext
}

// SliceRecords is the most records of one page found, held and committed
// at once: a page with more is taken in slices of this many (Batch.Rest),
// so that the memory a page in flight needs is its bytes plus at most a
// few slices of records, whatever the number of records it holds.
const SliceRecords = 10000

// RecordCount returns the number of records in the batch not taken yet:
// before Rest is read, all of the page's.
func (b *Batch) RecordCount() int {
	n := len(b.Records)
	if b.Rest != nil {
		n += b.Rest.Left()
	}
	return n
}

// WaitError asks the caller not to call Fetch again before Until, for
// example because the upstream answered 429 or 503 with Retry-After.
type WaitError struct {
	Until time.Time
	Err   error
	// Reason says who asked for the wait: WaitRetryAfter or WaitRateLimit
	// (empty counts as WaitRetryAfter).
	Reason string
}

// The reasons of a WaitError.
const (
	// WaitRetryAfter: the upstream answered with Retry-After.
	WaitRetryAfter = "retry_after"
	// WaitRateLimit: the upstream's rate-limit headers said no request is
	// left, or the source's own rate limiter has no slot soon.
	WaitRateLimit = "rate_limit"
)

func (e *WaitError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.Err, e.Until.UTC().Format(time.RFC3339))
}

func (e *WaitError) Unwrap() error { return e.Err }

// PermanentError marks a failure that retrying soon will not fix, such as a
// 4xx answer other than 408 and 429: a configuration problem. The caller
// logs it once per streak and backs off to its cap.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }

func (e *PermanentError) Unwrap() error { return e.Err }

// Parser is implemented by sources that can parse a payload again from the
// raw store with their current rules (replay, check-source).
type Parser interface {
	// Parse extracts records from body as Fetch would have. The returned
	// batch has no Cursor and no More.
	Parse(body []byte, fetchedAt time.Time) (*Batch, error)
}

// TraceEvent describes one upstream request, for `ingestor check-source`.
type TraceEvent struct {
	// Method and URL of the request; the URL has credentials and the query
	// values of secret parameters removed. Header values are never traced.
	Method, URL string
	// Status is the HTTP status, 0 when no response came.
	Status   int
	Duration time.Duration
	// Bytes is the size of the response body read.
	Bytes int
	// Err is the request's error, if any.
	Err error
	// Note is a short remark, e.g. "304 not modified" or "rate limited 200ms".
	Note string
}

// MalformedError reports a payload that could not be parsed. The fetch itself
// worked: the payload is dead-lettered with Reason and polling goes on.
type MalformedError struct {
	// Body is the payload as received; it may be empty.
	Body []byte
	// FetchedAt is when the payload was received.
	FetchedAt time.Time
	// Reason says what is wrong, without the source name.
	Reason string
	// Refetch reports that the payload answered a request the caller can
	// send again with the same cursor (http_poll), which may then succeed:
	// the caller retries it up to malformed_retries times before
	// dead-lettering it. A message read from a stream is gone once read,
	// so it is dead-lettered at once.
	Refetch bool
}

func (e *MalformedError) Error() string { return "malformed payload: " + e.Reason }

// AsMalformed reports whether err is (or wraps) a *MalformedError.
func AsMalformed(err error) (*MalformedError, bool) {
	var m *MalformedError
	ok := errors.As(err, &m)
	return m, ok
}

// Source is one configured feed. Fetch is called by one goroutine at a time.
type Source interface {
	// Fetch performs one poll. cursor is the last durable cursor ("" on the
	// first run). It returns a batch (possibly with no records), a
	// *MalformedError for a payload that could not be parsed, or another error
	// for a failed request, which the caller retries with backoff.
	Fetch(ctx context.Context, cursor string) (*Batch, error)
	// Close releases the source's resources.
	Close() error
}

// Env is what every source is built with, besides its own Spec.
type Env struct {
	// Name is the source's name, the NAME in [source.NAME].
	Name string
	// Timeout bounds one fetch.
	Timeout time.Duration
	// Logger already carries the source name.
	Logger *slog.Logger
	// Limiters holds the shared, named rate limiters ([rate_limiters.NAME]);
	// nil when none are configured.
	Limiters *RateLimiters
	// Trace, when set, is called for every upstream request.
	Trace func(TraceEvent)
	// Member is the cluster member running the source ("" outside cluster
	// mode); HTTP sources send it as MemberHeader with every request, so
	// an upstream's logs show which daemon asked.
	Member string
	// TracerProvider, when set, traces every upstream HTTP request as a
	// child of the poll's span (telemetry on); nil traces none.
	TracerProvider trace.TracerProvider
}

// transport returns t, traced with otelhttp (the HTTP client semantic
// conventions) when tracing is on.
func (env Env) transport(t http.RoundTripper) http.RoundTripper {
	if env.TracerProvider == nil {
		return t
	}
	return otelhttp.NewTransport(t, otelhttp.WithTracerProvider(env.TracerProvider),
		otelhttp.WithPropagators(propagation.TraceContext{}))
}

// MemberHeader carries Env.Member on upstream requests.
const MemberHeader = "X-Ingestor-Member"

// FieldError is a problem with one key of a source block. The config package
// adds the file, line and source name.
type FieldError struct {
	// Key is the TOML key the problem is about.
	Key string
	// Msg says what is wrong with it.
	Msg string
}

func (e FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Key, e.Msg) }

// Spec is the kind-specific configuration of a source. The config package
// decodes a [source.NAME] block into the Spec returned by NewSpec (which
// carries the kind's defaults), then calls Validate.
type Spec interface {
	// Validate returns every problem with the decoded values.
	Validate() []FieldError
	// Open builds the source.
	Open(env Env) (Source, error)
}

// OfflineSpec is a Spec whose Validate reads files that its keys name (a
// CA bundle, a token file), which may exist only on the machine the
// daemon runs on. ValidateOffline checks everything Validate checks
// except those files' contents: it reads no file, and only checks that a
// path is given where one is required. It also returns the keys of the
// files it did not read.
type OfflineSpec interface {
	Spec
	ValidateOffline() (problems []FieldError, unread []string)
}

// kinds maps a kind name to a constructor of its Spec with defaults applied.
var kinds = map[string]func() Spec{
	"demo":       func() Spec { return newDemoSpec() },
	"http_poll":  func() Spec { return newHTTPPollSpec() },
	"websocket":  func() Spec { return newWebSocketSpec() },
	"sse":        func() Spec { return newSSESpec() },
	"webhook":    func() Spec { return newWebhookSpec() },
	"ws_ingress": func() Spec { return newWSIngressSpec() },
}

// NewSpec returns a new Spec with defaults for kind, or false for an unknown kind.
func NewSpec(kind string) (Spec, bool) {
	f, ok := kinds[kind]
	if !ok {
		return nil, false
	}
	return f(), true
}

// Kinds returns the known kind names, sorted.
func Kinds() []string {
	out := make([]string, 0, len(kinds))
	for k := range kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
