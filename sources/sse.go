package sources

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"time"
)

// SSESpec configures kind "sse": keep a Server-Sent Events stream (an HTTP
// GET answered text/event-stream) open to URL and hand out the records in
// the JSON data of its events, up to MaxBatch events per fetch. The
// cursor is the stream's last event ID: the first connection sends the
// durable one as Last-Event-ID, a reconnect the newest one handed out.
// Run it with a short interval such as "50ms": a fetch returns as soon as
// events are buffered, and the interval is only the pause between two
// fetches when the buffer has run dry.
type SSESpec struct {
	// URL is the stream's address; required, http:// or https://.
	URL string `toml:"url"`
	// Headers are sent with every request; values may use ${ENV} and are
	// never logged. A "Host" entry sets the Host of the request.
	// Last-Event-ID is the source's own; Accept defaults to
	// text/event-stream.
	Headers map[string]string `toml:"headers"`
	// InitialCursor is the Last-Event-ID of the first connection, before
	// any cursor is durable; "" sends none.
	InitialCursor string `toml:"initial_cursor"`
	// EventTypes lists the event types whose events hold records; empty
	// takes every type. Events of other types are skipped (their data is
	// not read), but their ids still move the cursor.
	EventTypes []string `toml:"event_types"`
	// IDField is the dotted path of the record field that is the
	// idempotency key. When empty or absent in a record, the key is the
	// event's own id (from its id line; with "#" and the record's index
	// when the event holds several records), else the SHA-256 of the
	// record's bytes.
	IDField string `toml:"id_field"`
	// TimeField is the dotted path of the record's RFC 3339 timestamp, used
	// for lag; optional.
	TimeField string `toml:"time_field"`
	// RecordsPath is the dotted path of the records inside each event's
	// data, as websocket's records_path: an array there holds one record
	// per element, an object is one record, and data where it is absent or
	// null holds none. When empty, data that is a JSON array holds one
	// record per element and any other data is one record.
	RecordsPath string `toml:"records_path"`
	// MaxBatch is the most events one fetch hands out; four times as many
	// are buffered while nobody fetches, after which reading pauses.
	MaxBatch int `toml:"max_batch"`
	// ReadTimeout is the longest the stream may send nothing, not even a
	// comment, before it is taken for dead and reopened; it also bounds
	// the wait for the response headers.
	ReadTimeout string `toml:"read_timeout"`
	// MaxEventBytes caps one event's data (and each of its lines); a
	// larger event is dead-lettered (its first MaxEventBytes bytes are
	// kept) and skipped.
	MaxEventBytes int `toml:"max_event_bytes"`
	// ReconnectMax caps the wait between reconnect attempts, which grows
	// exponentially with full jitter; the stream's retry field is a floor
	// under every wait. After a 204 the source waits ReconnectMax.
	ReconnectMax string `toml:"reconnect_max"`
	// TLSCAFile is a PEM file of the CA certificates trusted for an
	// https:// URL, instead of the system's.
	TLSCAFile string `toml:"tls_ca_file"`
	// TLSInsecureSkipVerify disables verification of the server's TLS
	// certificate (https:// only). For tests only: it is logged as a
	// warning.
	TLSInsecureSkipVerify bool `toml:"tls_insecure_skip_verify"`
	// OAuth2, when set ([source.NAME.oauth2]), sends every request with a
	// bearer token from an OAuth2 token endpoint (OAuth2Spec); a request
	// answered 401 is sent once more with a new token.
	OAuth2 *OAuth2Spec `toml:"oauth2"`
}

// newSSESpec returns an SSESpec with the kind's defaults.
func newSSESpec() *SSESpec {
	return &SSESpec{
		MaxBatch:      1000,
		ReadTimeout:   "60s",
		MaxEventBytes: 1 << 20,
		ReconnectMax:  "30s",
	}
}

// sseLastEventID is the request header that carries the cursor.
const sseLastEventID = "Last-Event-Id"

// Validate implements Spec.
func (s *SSESpec) Validate() []FieldError {
	errs, _ := s.validate(false)
	return errs
}

// ValidateOffline implements OfflineSpec: tls_ca_file is not read.
func (s *SSESpec) ValidateOffline() ([]FieldError, []string) { return s.validate(true) }

func (s *SSESpec) validate(offline bool) ([]FieldError, []string) {
	var errs []FieldError
	var unread []string
	if s.URL == "" {
		errs = append(errs, FieldError{"url", "is required for kind sse"})
	} else if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, FieldError{"url", "must be an absolute http:// or https:// URL"})
	} else if strings.Contains(s.URL, "{cursor}") {
		errs = append(errs, FieldError{"url", "cannot carry {cursor}: the cursor is sent as the Last-Event-ID header"})
	} else {
		tlsErrs, files := validateClientTLS(s.TLSCAFile, s.TLSInsecureSkipVerify, u.Scheme == "https", "an https:// url", offline)
		errs, unread = append(errs, tlsErrs...), files
	}
	for name := range s.Headers {
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			errs = append(errs, FieldError{"headers", fmt.Sprintf("%q is not a valid header name", name)})
		} else if textproto.CanonicalMIMEHeaderKey(name) == sseLastEventID {
			errs = append(errs, FieldError{"headers." + name, "is set from the cursor: use initial_cursor for the first connection"})
		}
	}
	if !headerValue(s.InitialCursor) {
		errs = append(errs, FieldError{"initial_cursor", "must not hold a control character: it is sent as the Last-Event-ID header"})
	}
	for _, typ := range s.EventTypes {
		if typ == "" || strings.ContainsAny(typ, "\r\n") {
			errs = append(errs, FieldError{"event_types", fmt.Sprintf("%q is not an event type (an event with an empty type is a \"message\")", typ)})
		}
	}
	for _, p := range []struct{ key, val string }{{"id_field", s.IDField}, {"time_field", s.TimeField}, {"records_path", s.RecordsPath}} {
		if p.val != "" && !dottedPath(p.val) {
			errs = append(errs, FieldError{p.key, "must be a dotted path such as \"id\" or \"meta.id\""})
		}
	}
	if s.MaxBatch < 1 || s.MaxBatch > 100_000 {
		errs = append(errs, FieldError{"max_batch", "must be between 1 and 100000"})
	}
	positiveDuration(&errs, "read_timeout", s.ReadTimeout)
	positiveDuration(&errs, "reconnect_max", s.ReconnectMax)
	if s.MaxEventBytes < 1 || s.MaxEventBytes > 1<<30 {
		errs = append(errs, FieldError{"max_event_bytes", "must be between 1 and 1073741824"})
	}
	if s.OAuth2 != nil {
		errs = append(errs, s.OAuth2.validate(s.Headers)...)
	}
	return errs, unread
}

// headerValue reports whether v can be sent as a header value: no control
// character but tab.
func headerValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// Open implements Spec. It does not connect: the first Fetch does.
func (s *SSESpec) Open(env Env) (Source, error) {
	if errs := s.Validate(); len(errs) > 0 {
		return nil, specErrors(env.Name, "sse", errs)
	}
	u, err := url.Parse(s.URL)
	if err != nil {
		return nil, fmt.Errorf("source %q: sse: url: %w", env.Name, err)
	}
	logger := env.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	w := &sseSource{
		streamCore: newStreamCore[sseItem](fmt.Sprintf("source %q: sse %s", env.Name, redactURL(u)),
			"stream", http.MethodGet, 4*s.MaxBatch, env.Trace),
		url:      s.URL,
		initial:  s.InitialCursor,
		header:   make(http.Header, len(s.Headers)+3),
		parser:   sseParser{idField: s.IDField, ws: wsParser{timeField: s.TimeField, recordsPath: s.RecordsPath}},
		maxBatch: s.MaxBatch,
		maxEvent: s.MaxEventBytes,
		log:      logger,
	}
	w.sent = traceURL(u)
	if len(s.EventTypes) > 0 {
		w.parser.types = make(map[string]bool, len(s.EventTypes))
		for _, typ := range s.EventTypes {
			w.parser.types[typ] = true
		}
	}
	for _, d := range []struct {
		key, val string
		dst      *time.Duration
	}{{"read_timeout", s.ReadTimeout, &w.readTimeout}, {"reconnect_max", s.ReconnectMax, &w.reconnectMax}} {
		if *d.dst, err = time.ParseDuration(d.val); err != nil { // Validate accepted it: cannot happen
			return nil, fmt.Errorf("source %q: sse: %s: %w", env.Name, d.key, err)
		}
	}
	w.header.Set("Accept", "text/event-stream")
	w.header.Set("Cache-Control", "no-cache")
	for name, value := range s.Headers {
		if textproto.CanonicalMIMEHeaderKey(name) == "Host" {
			w.host = value
			continue
		}
		w.header.Set(name, value)
	}
	if env.Member != "" {
		w.header.Set(MemberHeader, env.Member)
	}
	if err = w.openClient(env, "sse", s.TLSCAFile, s.TLSInsecureSkipVerify, s.OAuth2, logger); err != nil {
		return nil, err
	}
	return w, nil
}

// sseSource is an open sse source. A reader goroutine (sse_conn.go) owns
// the stream and fills buf with the events received; Fetch drains it.
// streamCore (stream.go) holds the client, the buffer, the stream's state
// and the reader's lifecycle, as for websocket; sse adds the 204, which is
// quiet, not down (stopped).
type sseSource struct {
	streamCore[sseItem]

	url, host string
	// header holds the expanded headers. Its values are secrets: they never
	// appear in errors, logs or traces.
	header http.Header
	// initial is initial_cursor, the cursor when Fetch is first given none.
	initial            string
	parser             sseParser
	maxBatch, maxEvent int
	reconnectMax       time.Duration
	log                *slog.Logger

	// The fields below are guarded by mu.

	// cursor is the newest last event ID handed out, or given to the first
	// Fetch (initial_cursor when that is empty): what the next connection
	// sends as Last-Event-ID. batched is the newest one a batch carried
	// (or the first Fetch was given), so that one handed out with a
	// malformed event alone is committed by the next fetch.
	cursor, batched string
	// retry is the reconnection time the stream's retry field set last, a
	// floor under the wait before every reconnect.
	retry time.Duration
}

// sseItem is one dispatch of the stream, as buffered: the envelope of an
// event that holds records (see sseEnvelope) with its records (Off
// relative to env), the data of a malformed event with why, or neither,
// for an event skipped by event_types or a block with only an id.
type sseItem struct {
	env     []byte
	records []Record
	bad     string
	// lastID is the stream's last event ID after it.
	lastID string
	at     time.Time
}

// Fetch implements Source: it waits until at least one event is buffered,
// or ctx ends or a second has passed (then the batch is empty, not an
// error), and hands out up to MaxBatch buffered events as one batch whose
// Body is the JSON array of their envelopes, [e1,e2,...], where each
// envelope is {"id":"…","event":"…","data":<the data as received>} (no id
// when the event had no id line) and each record's bytes are the data's
// (or an element's). Skipped events are not in Body. A malformed event
// (data that is not JSON, or too big) is a *MalformedError of its own
// fetch, after the good events before it; its Body is the data.
//
// The batch's Cursor is the last event ID after its last event; the next
// connection sends it as Last-Event-ID. cursor, the durable cursor, is
// what the first connection sends (initial_cursor when it is empty);
// later calls' cursors are ignored: the source knows the newer one it
// handed out.
//
// A broken stream is not an error here: the reader reconnects and events
// received before the break stay buffered. Only when the source has had
// no stream for longer than read_timeout and nothing is buffered does
// Fetch return an error, naming the last failure; a request refused with
// a 4xx status other than 408 and 429 is a *PermanentError. A request
// answered 429 or 503 with Retry-After is a *WaitError until the time it
// gave: the reader sends no request before then.
func (w *sseSource) Fetch(ctx context.Context, cursor string) (*Batch, error) {
	if err := w.start(cursor); err != nil {
		return nil, err
	}
	first, err := w.next(ctx)
	if err != nil {
		return nil, err
	}
	if first == nil {
		return w.idle(), nil
	}
	if first.bad != "" {
		w.handOut(first.lastID, false)
		return nil, &MalformedError{Body: first.env, FetchedAt: first.at, Reason: first.bad}
	}
	b := w.assemble(w.take(first, w.maxBatch, func(it *sseItem) bool { return it.bad != "" }))
	b.More = w.more()
	if moved := w.handOut(b.Cursor, true); !moved && len(b.Records) == 0 {
		return &Batch{FetchedAt: b.FetchedAt, More: b.More}, nil // nothing to commit
	}
	return b, nil
}

// handOut notes lastID as the newest last event ID handed out, and, when
// batched, as carried by a batch. It reports whether the batched one
// changed.
func (w *sseSource) handOut(lastID string, batched bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cursor = lastID
	if !batched || w.batched == lastID {
		return false
	}
	w.batched = lastID
	return true
}

// idle returns the batch of a fetch that found nothing buffered: empty, or
// carrying the last event ID handed out with a malformed event, so that
// it becomes durable.
func (w *sseSource) idle() *Batch {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := &Batch{FetchedAt: time.Now()}
	if w.cursor != "" && w.cursor != w.batched {
		b.Body, b.Cursor, w.batched = []byte("[]"), w.cursor, w.cursor
	}
	return b
}

// start notes the caller's cursor on the first call, and starts the
// reader.
func (w *sseSource) start(cursor string) error {
	return w.streamCore.start(func(first bool) {
		if !first {
			return
		}
		if cursor == "" {
			cursor = w.initial // nothing is durable yet
		}
		w.cursor, w.batched = cursor, cursor
	}, w.run)
}

// assemble builds the batch of items: Body is the array of the envelopes
// of those that have one, each record's offset moved into it, and Cursor
// the last event ID after the last item.
func (w *sseSource) assemble(items []*sseItem) *Batch {
	size, n := 2, 0
	for _, it := range items {
		size += len(it.env) + 1
		n += len(it.records)
	}
	last := items[len(items)-1]
	b := &Batch{FetchedAt: last.at, Records: make([]Record, 0, n), Cursor: last.lastID}
	body := make([]byte, 0, size)
	body = append(body, '[')
	for _, it := range items {
		if it.env == nil {
			continue
		}
		if len(body) > 1 {
			body = append(body, ',')
		}
		off := len(body)
		body = append(body, it.env...)
		for _, r := range it.records {
			r.Off += off
			b.Records = append(b.Records, r)
		}
	}
	b.Body = append(body, ']')
	return b
}
