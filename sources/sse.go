package sources

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
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
	var errs []FieldError
	if s.URL == "" {
		errs = append(errs, FieldError{"url", "is required for kind sse"})
	} else if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, FieldError{"url", "must be an absolute http:// or https:// URL"})
	} else if strings.Contains(s.URL, "{cursor}") {
		errs = append(errs, FieldError{"url", "cannot carry {cursor}: the cursor is sent as the Last-Event-ID header"})
	} else {
		errs = append(errs, validateClientTLS(s.TLSCAFile, s.TLSInsecureSkipVerify, u.Scheme == "https", "an https:// url")...)
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
	return errs
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
		url:          s.URL,
		initial:      s.InitialCursor,
		header:       make(http.Header, len(s.Headers)+3),
		parser:       sseParser{idField: s.IDField, ws: wsParser{timeField: s.TimeField, recordsPath: s.RecordsPath}},
		maxBatch:     s.MaxBatch,
		maxEvent:     s.MaxEventBytes,
		trace:        env.Trace,
		log:          logger,
		where:        fmt.Sprintf("source %q: sse %s", env.Name, redactURL(u)),
		sent:         traceURL(u),
		buf:          make(chan sseItem, 4*s.MaxBatch),
		done:         make(chan struct{}),
		stateChanged: make(chan struct{}),
	}
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
	w.transport = http.DefaultTransport.(*http.Transport).Clone()
	if w.transport.TLSClientConfig, err = clientTLSConfig(s.TLSCAFile, s.TLSInsecureSkipVerify, logger); err != nil {
		return nil, fmt.Errorf("source %q: sse: %w", env.Name, err)
	}
	w.insecure = s.TLSInsecureSkipVerify
	// No client timeout: the response is a stream; read_timeout bounds
	// the wait for each byte instead.
	w.client = &http.Client{Transport: w.transport, CheckRedirect: w.checkRedirect}
	if s.OAuth2 != nil {
		if w.auth, err = openOAuth2(s.OAuth2, env, w.transport, logger); err != nil {
			return nil, fmt.Errorf("source %q: sse: %w", env.Name, err)
		}
	}
	return w, nil
}

// sseSource is an open sse source. A reader goroutine (sse_conn.go) owns
// the stream and fills buf; Fetch drains it.
type sseSource struct {
	url, host string
	// header holds the expanded headers. Its values are secrets: they never
	// appear in errors, logs or traces.
	header http.Header
	// auth, when set, sends each request with an OAuth2 token.
	auth *oauth2Token
	// initial is initial_cursor, the cursor when Fetch is first given none.
	initial string
	// insecure is tls_insecure_skip_verify, warned about on every connect.
	insecure                  bool
	parser                    sseParser
	maxBatch, maxEvent        int
	readTimeout, reconnectMax time.Duration
	// where starts every error: source "NAME": sse URL, without the query
	// or user info, which may hold secrets. sent is the URL as traceURL
	// shows it, for logs and traces.
	where, sent string
	client      *http.Client
	transport   *http.Transport
	trace       func(TraceEvent)
	log         *slog.Logger

	// buf holds the events received and not yet handed out. Only the
	// reader sends to it; only Fetch receives from it.
	buf chan sseItem
	// held is an event Fetch took from buf but could not hand out with
	// the batch it was building; the next Fetch starts with it. Only Fetch
	// uses it.
	held *sseItem

	mu sync.Mutex
	// cursor is the newest last event ID handed out, or given to the first
	// Fetch (initial_cursor when that is empty): what the next connection
	// sends as Last-Event-ID. batched is the newest one a batch carried
	// (or the first Fetch was given), so that one handed out with a
	// malformed event alone is committed by the next fetch.
	cursor, batched string
	// started and closed guard the reader's lifecycle; stop ends it and
	// done is closed when it has returned.
	started, closed bool
	stop            context.CancelFunc
	done            chan struct{}
	// up reports an open stream; stopped that the upstream answered 204,
	// which is quiet, not down. Otherwise downSince is when the source
	// last had a stream (or started) and lastErr why the last attempt
	// failed; permanent marks a request refused with a 4xx status.
	up, stopped bool
	downSince   time.Time
	lastErr     error
	permanent   bool
	// wait is set when the last request was answered with Retry-After:
	// no request goes out before wait.Until, and until then Fetch returns
	// wait when nothing is buffered.
	wait *WaitError
	// retry is the reconnection time the stream's retry field set last, a
	// floor under the wait before every reconnect.
	retry time.Duration
	// stateChanged is closed, and replaced, whenever up, stopped or wait
	// changes.
	stateChanged chan struct{}
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
	items := []*sseItem{first}
take:
	for len(items) < w.maxBatch {
		select {
		case it := <-w.buf:
			if it.bad != "" {
				w.held = &it // hand out the good events first
				break take
			}
			items = append(items, &it)
		default:
			break take // nothing more buffered
		}
	}
	b := w.assemble(items)
	b.More = w.held != nil || len(w.buf) > 0
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
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fmt.Errorf("%s: source is closed", w.where)
	}
	if !w.started {
		if cursor == "" {
			cursor = w.initial // nothing is durable yet
		}
		w.cursor, w.batched = cursor, cursor
		w.started = true
		w.downSince = time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		w.stop = cancel
		go w.run(ctx)
	}
	return nil
}

// sseIdleWait bounds how long a fetch waits for a first event, as
// wsIdleWait does for websocket.
const sseIdleWait = time.Second

// next returns the first event of a fetch: the held one or the next
// buffered one, waiting for it until ctx ends or sseIdleWait has passed
// (nil, nil) or the source has been down too long (an error).
func (w *sseSource) next(ctx context.Context) (*sseItem, error) {
	if it := w.held; it != nil {
		w.held = nil
		return it, nil
	}
	ctx, cancel := context.WithTimeout(ctx, sseIdleWait)
	defer cancel()
	for {
		select {
		case it := <-w.buf:
			return &it, nil
		default:
		}
		changed, deadline, err := w.downState()
		if err != nil {
			return nil, err
		}
		var expire <-chan time.Time
		var timer *time.Timer
		if !deadline.IsZero() {
			timer = time.NewTimer(time.Until(deadline))
			expire = timer.C
		}
		var it *sseItem
		select {
		case got := <-w.buf:
			it = &got
		case <-ctx.Done():
		case <-changed:
		case <-expire:
		case <-w.done:
			err = fmt.Errorf("%s: source is closed", w.where)
		}
		if timer != nil {
			timer.Stop()
		}
		if it != nil || err != nil || ctx.Err() != nil {
			return it, err
		}
	}
}

// downState returns a channel closed when the stream's state changes,
// and, while the source has no stream, when that outage will have lasted
// read_timeout, or the error to report when it already has or the
// upstream asked to wait. A source told 204 is quiet, not down.
func (w *sseSource) downState() (<-chan struct{}, time.Time, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.up || w.stopped {
		return w.stateChanged, time.Time{}, nil
	}
	if w.wait != nil && time.Now().Before(w.wait.Until) {
		return nil, time.Time{}, w.wait
	}
	deadline := w.downSince.Add(w.readTimeout)
	if time.Now().Before(deadline) {
		return w.stateChanged, deadline, nil
	}
	cause := w.lastErr
	if cause == nil {
		cause = errors.New("still connecting")
	}
	err := fmt.Errorf("%s: no stream for %s: %w", w.where, time.Since(w.downSince).Round(time.Millisecond), cause)
	if w.permanent {
		return nil, time.Time{}, &PermanentError{Err: err}
	}
	return nil, time.Time{}, err
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

// Close implements Source: it stops the reader, which closes the stream,
// and waits for it.
func (w *sseSource) Close() error {
	w.mu.Lock()
	w.closed = true
	stop, started := w.stop, w.started
	w.mu.Unlock()
	if started {
		stop()
		<-w.done
	}
	w.transport.CloseIdleConnections()
	return nil
}

// checkRedirect follows up to 10 redirects on the same host: the headers
// carry credentials.
func (w *sseSource) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Host != via[0].URL.Host {
		return fmt.Errorf("redirect to %s refused: only the url's host is followed", redactURL(req.URL))
	}
	return nil
}
