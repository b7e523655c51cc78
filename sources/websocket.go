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

// WebSocketSpec configures kind "websocket": keep a WebSocket connection to
// URL open, optionally send a subscribe message after every connect, and
// hand out the JSON messages received, up to MaxBatch per fetch. Run it
// with a short interval such as "50ms": a fetch returns as soon as
// messages are buffered, and the interval is only the pause between two
// fetches when the buffer has run dry.
type WebSocketSpec struct {
	// URL is the WebSocket endpoint; required, ws:// or wss://. Each
	// "{cursor}" in it is replaced by the cursor of the handshake (see
	// Subscribe), URL-escaped, as in http_poll's poll_url.
	URL string `toml:"url"`
	// Headers are sent with every handshake; values may use ${ENV} and are
	// never logged. A "Host" entry sets the Host of the handshake. Each
	// "{cursor}" in a value (not Host's) is replaced by the cursor of the
	// handshake, as it is.
	Headers map[string]string `toml:"headers"`
	// Subscribe is a message sent as text after every connect; empty sends
	// nothing. Each "{cursor}" in it is replaced by the newest cursor handed
	// out (after a restart, the durable cursor; InitialCursor on the very
	// first run), escaped as inside a JSON string but without quotes, which
	// leaves numbers and timestamps as they are.
	Subscribe string `toml:"subscribe"`
	// InitialCursor is the cursor of the first connection, before any is
	// durable; "" by default. It needs CursorField.
	InitialCursor string `toml:"initial_cursor"`
	// IDField is the dotted path of the record field that is the idempotency
	// key; when empty or absent in a record, the key is the SHA-256 of the
	// record's bytes.
	IDField string `toml:"id_field"`
	// CursorField is the dotted path of the record field whose largest value
	// (compared by CompareCursor) becomes the cursor; empty keeps no cursor.
	// When set, the cursor must be sent: "{cursor}" must appear in URL, a
	// header value or Subscribe, or every reconnect would replay the feed
	// from its start.
	CursorField string `toml:"cursor_field"`
	// TimeField is the dotted path of the record's RFC 3339 timestamp, used
	// for lag; optional.
	TimeField string `toml:"time_field"`
	// RecordsPath is the dotted path of the records inside each message: an
	// array there holds one record per element, an object is one record,
	// and a message where it is absent or null (an ack, a heartbeat) holds
	// none. When empty, a message that is a JSON array holds one record
	// per element and any other message is one record.
	RecordsPath string `toml:"records_path"`
	// MaxBatch is the most messages one fetch hands out; four times as many
	// are buffered while nobody fetches, after which reading pauses.
	MaxBatch int `toml:"max_batch"`
	// PingInterval is how often a ping is sent while the connection is
	// read; shorter than ReadTimeout.
	PingInterval string `toml:"ping_interval"`
	// ReadTimeout is how long the connection may go without a message or a
	// pong before it is taken for dead and reconnected; it also bounds the
	// handshake and the subscribe write.
	ReadTimeout string `toml:"read_timeout"`
	// MaxMessageBytes caps one message; a larger one is dead-lettered
	// (its first MaxMessageBytes bytes are kept) and skipped.
	MaxMessageBytes int64 `toml:"max_message_bytes"`
	// ReconnectMax caps the wait between reconnect attempts, which grows
	// exponentially with full jitter.
	ReconnectMax string `toml:"reconnect_max"`
	// TLSCAFile is a PEM file of the CA certificates trusted for a wss://
	// URL, instead of the system's.
	TLSCAFile string `toml:"tls_ca_file"`
	// TLSInsecureSkipVerify disables verification of the server's TLS
	// certificate (wss:// only). For tests only: it is logged as a warning.
	TLSInsecureSkipVerify bool `toml:"tls_insecure_skip_verify"`
	// OAuth2, when set ([source.NAME.oauth2]), sends every handshake with
	// a bearer token from an OAuth2 token endpoint (OAuth2Spec); a
	// handshake answered 401 is tried once more with a new token.
	OAuth2 *OAuth2Spec `toml:"oauth2"`
}

func newWebSocketSpec() *WebSocketSpec {
	return &WebSocketSpec{
		MaxBatch:        1000,
		PingInterval:    "20s",
		ReadTimeout:     "60s",
		MaxMessageBytes: 1 << 20,
		ReconnectMax:    "30s",
	}
}

// wsHandshakeHeaders are set by the WebSocket handshake itself.
var wsHandshakeHeaders = []string{"Connection", "Upgrade", "Sec-Websocket-Key", "Sec-Websocket-Version", "Sec-Websocket-Extensions", "Sec-Websocket-Protocol"}

// Validate implements Spec.
func (s *WebSocketSpec) Validate() []FieldError {
	var errs []FieldError
	if s.URL == "" {
		errs = append(errs, FieldError{"url", "is required for kind websocket"})
	} else if u, err := url.Parse(strings.ReplaceAll(s.URL, "{cursor}", "c")); err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		errs = append(errs, FieldError{"url", "must be an absolute ws:// or wss:// URL"})
	} else if raw, err := url.Parse(s.URL); err != nil || raw.Host != u.Host {
		errs = append(errs, FieldError{"url", "may have {cursor} only in its path and query"})
	} else {
		errs = append(errs, validateClientTLS(s.TLSCAFile, s.TLSInsecureSkipVerify, u.Scheme == "wss", "a wss:// url")...)
	}
	for name, value := range s.Headers {
		canon := textproto.CanonicalMIMEHeaderKey(name)
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			errs = append(errs, FieldError{"headers", fmt.Sprintf("%q is not a valid header name", name)})
		}
		if canon == "Host" && strings.Contains(value, "{cursor}") {
			errs = append(errs, FieldError{"headers." + name, "cannot carry {cursor}: put it in url, another header or subscribe"})
		}
		for _, h := range wsHandshakeHeaders {
			if canon == h {
				errs = append(errs, FieldError{"headers." + name, "is set by the WebSocket handshake"})
			}
		}
	}
	errs = append(errs, s.validateCursor()...)
	if s.OAuth2 != nil {
		errs = append(errs, s.OAuth2.validate(s.Headers)...)
	}
	for _, p := range []struct{ key, val string }{{"id_field", s.IDField}, {"cursor_field", s.CursorField}, {"time_field", s.TimeField}, {"records_path", s.RecordsPath}} {
		if p.val != "" && !dottedPath(p.val) {
			errs = append(errs, FieldError{p.key, "must be a dotted path such as \"id\" or \"meta.id\""})
		}
	}
	if s.MaxBatch < 1 || s.MaxBatch > 100_000 {
		errs = append(errs, FieldError{"max_batch", "must be between 1 and 100000"})
	}
	ping, pingOK := positiveDuration(&errs, "ping_interval", s.PingInterval)
	read, readOK := positiveDuration(&errs, "read_timeout", s.ReadTimeout)
	if pingOK && readOK && ping >= read {
		errs = append(errs, FieldError{"ping_interval", fmt.Sprintf("must be shorter than read_timeout (%s), or a quiet upstream looks dead", s.ReadTimeout)})
	}
	positiveDuration(&errs, "reconnect_max", s.ReconnectMax)
	if s.MaxMessageBytes < 1 || s.MaxMessageBytes > 1<<30 {
		errs = append(errs, FieldError{"max_message_bytes", "must be between 1 and 1073741824"})
	}
	return errs
}

// sendsCursor reports whether a handshake or subscribe message carries the
// cursor, and names the first key that does.
func (s *WebSocketSpec) sendsCursor() (string, bool) {
	if strings.Contains(s.URL, "{cursor}") {
		return "url", true
	}
	for name, value := range s.Headers {
		if strings.Contains(value, "{cursor}") {
			return "headers." + name, true
		}
	}
	if strings.Contains(s.Subscribe, "{cursor}") {
		return "subscribe", true
	}
	return "", false
}

// validateCursor checks that a cursor kept is sent, and that one sent is
// kept, as http_poll's validateCursor does.
func (s *WebSocketSpec) validateCursor() []FieldError {
	key, sends := s.sendsCursor()
	switch {
	case s.CursorField != "" && !sends:
		return []FieldError{{"cursor_field", "is set but the cursor is sent nowhere, so every reconnect replays the feed from its start: put {cursor} in url, a header value or subscribe"}}
	case s.CursorField == "" && sends:
		return []FieldError{{key, "uses {cursor} but cursor_field is not set"}}
	case s.CursorField == "" && s.InitialCursor != "":
		return []FieldError{{"initial_cursor", "is only used when the source keeps a cursor: set cursor_field"}}
	}
	return nil
}

// positiveDuration parses a duration key, adding a FieldError to errs when
// it is not a positive duration.
func positiveDuration(errs *[]FieldError, key, v string) (time.Duration, bool) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		*errs = append(*errs, FieldError{key, fmt.Sprintf("must be a positive duration such as \"30s\", not %q", v)})
		return 0, false
	}
	return d, true
}

// Open implements Spec. It does not connect: the first Fetch does.
func (s *WebSocketSpec) Open(env Env) (Source, error) {
	if errs := s.Validate(); len(errs) > 0 {
		return nil, specErrors(env.Name, "websocket", errs)
	}
	u, err := url.Parse(s.URL)
	if err != nil {
		return nil, fmt.Errorf("source %q: websocket: url: %w", env.Name, err)
	}
	logger := env.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	w := &wsSource{
		url:          s.URL,
		initial:      s.InitialCursor,
		header:       make(http.Header, len(s.Headers)),
		subscribe:    s.Subscribe,
		parser:       wsParser{idField: s.IDField, cursorField: s.CursorField, timeField: s.TimeField, recordsPath: s.RecordsPath},
		maxBatch:     s.MaxBatch,
		maxMessage:   s.MaxMessageBytes,
		trace:        env.Trace,
		log:          logger,
		where:        fmt.Sprintf("source %q: websocket %s", env.Name, redactURL(u)),
		redacted:     redactURL(u),
		buf:          make(chan wsMessage, 4*s.MaxBatch),
		done:         make(chan struct{}),
		stateChanged: make(chan struct{}),
	}
	for _, d := range []struct {
		key, val string
		dst      *time.Duration
	}{{"ping_interval", s.PingInterval, &w.pingInterval}, {"read_timeout", s.ReadTimeout, &w.readTimeout}, {"reconnect_max", s.ReconnectMax, &w.reconnectMax}} {
		if *d.dst, err = time.ParseDuration(d.val); err != nil { // Validate accepted it: cannot happen
			return nil, fmt.Errorf("source %q: websocket: %s: %w", env.Name, d.key, err)
		}
	}
	for name, value := range s.Headers {
		if textproto.CanonicalMIMEHeaderKey(name) == "Host" {
			w.host = value
			continue
		}
		w.header.Set(name, value)
		w.cursorHeaders = w.cursorHeaders || strings.Contains(value, "{cursor}")
	}
	if env.Member != "" {
		w.header.Set(MemberHeader, env.Member)
	}
	w.transport = http.DefaultTransport.(*http.Transport).Clone()
	if w.transport.TLSClientConfig, err = clientTLSConfig(s.TLSCAFile, s.TLSInsecureSkipVerify, logger); err != nil {
		return nil, fmt.Errorf("source %q: websocket: %w", env.Name, err)
	}
	w.insecure = s.TLSInsecureSkipVerify
	w.client = &http.Client{Transport: w.transport, CheckRedirect: w.checkRedirect}
	if s.OAuth2 != nil {
		if w.auth, err = openOAuth2(s.OAuth2, env, w.transport, logger); err != nil {
			return nil, fmt.Errorf("source %q: websocket: %w", env.Name, err)
		}
	}
	return w, nil
}

// wsSource is an open websocket source. A reader goroutine (websocket_conn.go)
// owns the connection and fills buf; Fetch drains it.
type wsSource struct {
	// url is the url key, with its {cursor} templates: handshakeURL fills
	// them in.
	url, host string
	// header holds the expanded headers. Its values are secrets: they never
	// appear in errors, logs or traces. cursorHeaders reports that some of
	// them hold {cursor}.
	header        http.Header
	cursorHeaders bool
	// auth, when set, sends each handshake with an OAuth2 token.
	auth      *oauth2Token
	subscribe string
	// initial is initial_cursor, the cursor when Fetch is first given none.
	initial string
	// insecure is tls_insecure_skip_verify, warned about on every connect.
	insecure                                bool
	parser                                  wsParser
	maxBatch                                int
	maxMessage                              int64
	pingInterval, readTimeout, reconnectMax time.Duration
	// where starts every error: source "NAME": websocket URL, without the
	// query or user info, which may hold secrets. redacted is that URL.
	// sent is the URL of the newest handshake as traceURL shows it; only
	// the reader uses it.
	where, redacted, sent string
	client                *http.Client
	transport             *http.Transport
	trace                 func(TraceEvent)
	log                   *slog.Logger

	// buf holds the messages received and not yet handed out. Only the
	// reader sends to it; only Fetch receives from it.
	buf chan wsMessage
	// held is a message Fetch took from buf but could not hand out with
	// the batch it was building; the next Fetch starts with it. Only Fetch
	// uses it.
	held *wsMessage

	mu sync.Mutex
	// cursor is the newest cursor handed out, or given to Fetch (at first
	// initial_cursor): what the next handshake and subscribe message carry.
	cursor string
	// started and closed guard the reader's lifecycle; stop ends it and
	// done is closed when it has returned.
	started, closed bool
	stop            context.CancelFunc
	done            chan struct{}
	// up reports a subscribed connection. Otherwise downSince is when the
	// source last had one (or started) and lastErr why the last attempt
	// failed; permanent marks a handshake refused with a 4xx status.
	up        bool
	downSince time.Time
	lastErr   error
	permanent bool
	// wait is set when the last handshake was answered with Retry-After:
	// no handshake goes out before wait.Until, and until then Fetch
	// returns wait when nothing is buffered.
	wait *WaitError
	// stateChanged is closed, and replaced, whenever up changes.
	stateChanged chan struct{}
}

// wsMessage is one message received: its bytes, the records in it (Off
// relative to data), or why it is malformed.
type wsMessage struct {
	data    []byte
	at      time.Time
	records []Record
	bad     string
}

// Fetch implements Source: it waits until at least one message is buffered,
// or ctx ends or a second has passed (then the batch is empty, not an
// error), and hands out up to
// MaxBatch buffered messages as one batch whose Body is the JSON array of
// the messages, [m1,m2,...], byte for byte. A malformed message is a
// *MalformedError of its own fetch, after the good messages before it.
//
// A broken connection is not an error here: the reader reconnects and
// messages received before the break stay buffered. Only when the source
// has had no connection for longer than read_timeout and nothing is
// buffered does Fetch return an error, naming the last failure, so that a
// feed that is down shows in metrics and logs; a handshake refused with a
// 4xx status other than 408 and 429 is a *PermanentError. A handshake
// answered 429 or 503 with Retry-After is a *WaitError until the time it
// gave, as in http_poll: the reader sends no handshake before then.
//
// The cursor is the largest CursorField value of the batch when it is
// beyond the cursor handed out before; the next handshake and subscribe
// message carry it. cursor, the durable cursor, is what the first
// connection resumes from (initial_cursor when it is empty; a newer one
// handed out since wins).
func (w *wsSource) Fetch(ctx context.Context, cursor string) (*Batch, error) {
	if err := w.start(cursor); err != nil {
		return nil, err
	}
	first, err := w.next(ctx)
	if err != nil {
		return nil, err
	}
	if first == nil {
		return &Batch{FetchedAt: time.Now()}, nil
	}
	if first.bad != "" {
		return nil, &MalformedError{Body: first.data, FetchedAt: first.at, Reason: first.bad}
	}
	msgs := []*wsMessage{first}
	size := len(first.data)
take:
	for len(msgs) < w.maxBatch {
		select {
		case m := <-w.buf:
			if m.bad != "" {
				w.held = &m // hand out the good messages first
				break take
			}
			msgs = append(msgs, &m)
			size += len(m.data)
		default:
			break take // nothing more buffered
		}
	}
	b := w.assemble(msgs, size)
	w.mu.Lock()
	defer w.mu.Unlock()
	if largest := b.Cursor; largest != "" {
		if w.cursor != "" && CompareCursor(largest, w.cursor) <= 0 {
			b.Cursor = "" // resent or older records never move the cursor back
		} else {
			w.cursor = largest
		}
	}
	b.More = w.held != nil || len(w.buf) > 0
	return b, nil
}

// start notes the caller's cursor and starts the reader on the first call.
func (w *wsSource) start(cursor string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fmt.Errorf("%s: source is closed", w.where)
	}
	if cursor != "" && (w.cursor == "" || CompareCursor(cursor, w.cursor) > 0) {
		w.cursor = cursor
	}
	if !w.started {
		if w.cursor == "" {
			w.cursor = w.initial // nothing is durable yet
		}
		w.started = true
		w.downSince = time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		w.stop = cancel
		go w.run(ctx)
	}
	return nil
}

// wsIdleWait bounds how long a fetch waits for a first message. A quiet
// stream then costs one empty fetch a second, and a fetch in progress
// delays a drain (which waits for it) by a second at most.
const wsIdleWait = time.Second

// next returns the first message of a fetch: the held one or the next
// buffered one, waiting for it until ctx ends or wsIdleWait has passed
// (nil, nil) or the source has been down too long (an error).
func (w *wsSource) next(ctx context.Context) (*wsMessage, error) {
	if m := w.held; m != nil {
		w.held = nil
		return m, nil
	}
	ctx, cancel := context.WithTimeout(ctx, wsIdleWait)
	defer cancel()
	for {
		select {
		case m := <-w.buf:
			return &m, nil
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
		var m *wsMessage
		select {
		case got := <-w.buf:
			m = &got
		case <-ctx.Done():
		case <-changed:
		case <-expire:
		case <-w.done:
			err = fmt.Errorf("%s: source is closed", w.where)
		}
		if timer != nil {
			timer.Stop()
		}
		if m != nil || err != nil || ctx.Err() != nil {
			return m, err
		}
	}
}

// downState returns a channel closed when the connection state changes,
// and, while the source has no connection, when that outage will have
// lasted read_timeout, or the error to report when it already has or the
// upstream asked to wait.
func (w *wsSource) downState() (<-chan struct{}, time.Time, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.up {
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
	err := fmt.Errorf("%s: no connection for %s: %w", w.where, time.Since(w.downSince).Round(time.Millisecond), cause)
	if w.permanent {
		return nil, time.Time{}, &PermanentError{Err: err}
	}
	return nil, time.Time{}, err
}

// assemble builds the batch of msgs: Body is [m1,m2,...] and each record's
// offset is moved into it.
func (w *wsSource) assemble(msgs []*wsMessage, size int) *Batch {
	n := 0
	for _, m := range msgs {
		n += len(m.records)
	}
	body := make([]byte, 0, size+len(msgs)+1)
	b := &Batch{FetchedAt: msgs[len(msgs)-1].at, Records: make([]Record, 0, n)}
	body = append(body, '[')
	for i, m := range msgs {
		if i > 0 {
			body = append(body, ',')
		}
		off := len(body)
		body = append(body, m.data...)
		for _, r := range m.records {
			r.Off += off
			b.Records = append(b.Records, r)
			if r.Cursor != "" && (b.Cursor == "" || CompareCursor(r.Cursor, b.Cursor) > 0) {
				b.Cursor = r.Cursor
			}
		}
	}
	b.Body = append(body, ']')
	return b
}

// Close implements Source: it stops the reader, which closes the
// connection (with no close handshake), and waits for it.
func (w *wsSource) Close() error {
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

// checkRedirect follows up to 10 redirects of the handshake on the same
// host: the headers carry credentials.
func (w *wsSource) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Host != via[0].URL.Host {
		return fmt.Errorf("redirect to %s refused: only the url's host is followed", redactURL(req.URL))
	}
	return nil
}
