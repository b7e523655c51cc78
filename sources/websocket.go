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
	errs, _ := s.validate(false)
	return errs
}

// ValidateOffline implements OfflineSpec: tls_ca_file is not read.
func (s *WebSocketSpec) ValidateOffline() ([]FieldError, []string) { return s.validate(true) }

func (s *WebSocketSpec) validate(offline bool) ([]FieldError, []string) {
	var errs []FieldError
	var unread []string
	if s.URL == "" {
		errs = append(errs, FieldError{"url", "is required for kind websocket"})
	} else if u, err := url.Parse(strings.ReplaceAll(s.URL, "{cursor}", "c")); err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		errs = append(errs, FieldError{"url", "must be an absolute ws:// or wss:// URL"})
	} else if raw, err := url.Parse(s.URL); err != nil || raw.Host != u.Host {
		errs = append(errs, FieldError{"url", "may have {cursor} only in its path and query"})
	} else {
		tlsErrs, files := validateClientTLS(s.TLSCAFile, s.TLSInsecureSkipVerify, u.Scheme == "wss", "a wss:// url", offline)
		errs, unread = append(errs, tlsErrs...), files
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
	return errs, unread
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
		streamCore: newStreamCore[wsMessage](fmt.Sprintf("source %q: websocket %s", env.Name, redactURL(u)),
			"connection", "WS", 4*s.MaxBatch, env.Trace),
		url:        s.URL,
		initial:    s.InitialCursor,
		header:     make(http.Header, len(s.Headers)),
		subscribe:  s.Subscribe,
		parser:     wsParser{idField: s.IDField, cursorField: s.CursorField, timeField: s.TimeField, recordsPath: s.RecordsPath},
		maxBatch:   s.MaxBatch,
		maxMessage: s.MaxMessageBytes,
		log:        logger,
		redacted:   redactURL(u),
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
	if err = w.openClient(env, "websocket", s.TLSCAFile, s.TLSInsecureSkipVerify, s.OAuth2, logger); err != nil {
		return nil, err
	}
	return w, nil
}

// wsSource is an open websocket source. A reader goroutine (websocket_conn.go)
// owns the connection and fills buf with the messages received; Fetch
// drains it. streamCore (stream.go) holds the client, the buffer, the
// connection's state and the reader's lifecycle, as for sse.
type wsSource struct {
	streamCore[wsMessage]

	// url is the url key, with its {cursor} templates: handshake fills
	// them in.
	url, host string
	// header holds the expanded headers. Its values are secrets: they never
	// appear in errors, logs or traces. cursorHeaders reports that some of
	// them hold {cursor}.
	header        http.Header
	cursorHeaders bool
	subscribe     string
	// initial is initial_cursor, the cursor when Fetch is first given none.
	initial                    string
	parser                     wsParser
	maxBatch                   int
	maxMessage                 int64
	pingInterval, reconnectMax time.Duration
	// redacted is the url without the query or user info, which may hold
	// secrets, as where shows it. Each handshake sets streamCore's sent
	// to its own URL as traceURL shows it.
	redacted string
	log      *slog.Logger

	// cursor, guarded by mu, is the newest cursor handed out, or given to
	// Fetch (at first initial_cursor): what the next handshake and
	// subscribe message carry.
	cursor string
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
	b := w.assemble(w.take(first, w.maxBatch, func(m *wsMessage) bool { return m.bad != "" }))
	w.mu.Lock()
	defer w.mu.Unlock()
	if largest := b.Cursor; largest != "" {
		if w.cursor != "" && CompareCursor(largest, w.cursor) <= 0 {
			b.Cursor = "" // resent or older records never move the cursor back
		} else {
			w.cursor = largest
		}
	}
	b.More = w.more()
	return b, nil
}

// start notes the caller's cursor and starts the reader on the first call.
func (w *wsSource) start(cursor string) error {
	return w.streamCore.start(func(first bool) {
		if cursor != "" && (w.cursor == "" || CompareCursor(cursor, w.cursor) > 0) {
			w.cursor = cursor
		}
		if first && w.cursor == "" {
			w.cursor = w.initial // nothing is durable yet
		}
	}, w.run)
}

// assemble builds the batch of msgs: Body is [m1,m2,...] and each record's
// offset is moved into it.
func (w *wsSource) assemble(msgs []*wsMessage) *Batch {
	size, n := 0, 0
	for _, m := range msgs {
		size += len(m.data)
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
