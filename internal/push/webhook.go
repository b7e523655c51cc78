package push

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/wire"
	"github.com/ingestorhq/ingestor/sources"
)

// webhook serves a kind "webhook" source: POST /ingest/NAME takes events,
// GET /ingest/NAME/events/{id} and GET /ingest/NAME/events?idempotency_key=K
// answer where one stands. webhook_body.go decodes bodies, webhook_auth.go
// checks tokens and signatures.
type webhook struct {
	env       handlerEnv
	name      string
	maxBody   int64
	rules     bodyRules
	keyHeader string
	// token is nil when the source has no bearer token.
	token *bearer
	// verify is nil when the source has no signature scheme; matches
	// counts its matches by the position of the secret.
	verify  verifier
	matches []prometheus.Counter
	// scheme is the signature scheme, named in each event's verdict.
	scheme string
	// challenge is the handshake answered (sources.Challenge*, "" for
	// none); crcKeys are the keys of "crc_sha256".
	challenge string
	crcKeys   keyring
	// rejectLog lets a few rejections a minute be logged at info (warn
	// for authentication failures); the others are logged at debug, so a
	// misbehaving sender cannot flood the log.
	rejectLog *rate.Limiter
	// readTimeout bounds the time to read a body: bodyReadTimeout.
	readTimeout time.Duration
	// rejects records the refused deliveries (quarantine.go).
	rejects *rejections
	// answered counts the requests answered 200 (every event a duplicate)
	// and 202 (stored), the series of ingestor_push_requests_total every
	// stored request counts on, looked up once.
	answered [2]prometheus.Counter
}

const (
	// bodyReadTimeout bounds the time to read one request body: the
	// listener itself bounds only the headers.
	bodyReadTimeout = 30 * time.Second
	// maxKeyHeader is the longest Idempotency-Key (or id_header) value
	// accepted, and maxRequestID the longest X-Request-ID taken as given.
	maxKeyHeader = 255
	maxRequestID = 128
	// unavailableRetryAfter is the Retry-After of a 503.
	unavailableRetryAfter = 5 * time.Second
)

func newWebhook(env handlerEnv, spec *sources.WebhookSpec) (*webhook, error) {
	h := &webhook{env: env, name: env.source.Name, maxBody: spec.MaxBodyBytes, keyHeader: spec.KeyHeader(),
		rules:     bodyRules{idField: spec.KeyField(), timeField: spec.TimeField, required: spec.RequiredFields},
		rejectLog: rate.NewLimiter(rate.Every(6*time.Second), 10), readTimeout: bodyReadTimeout, rejects: newRejections(env, spec)}
	for i, code := range []string{"200", "202"} {
		h.answered[i] = env.metrics.Requests.WithLabelValues(h.name, code)
	}
	verify, err := newVerifier(spec)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	h.verify, h.scheme = verify, spec.Signature
	if verify != nil {
		n := max(len(spec.Secrets), 1)
		for i := range n {
			h.matches = append(h.matches, env.metrics.signatureMatches.WithLabelValues(h.name, strconv.Itoa(i)))
		}
	}
	if h.challenge = spec.HandshakeChallenge(); h.challenge == sources.ChallengeCRCSHA256 {
		keys, err := spec.SigningKeys()
		if err != nil {
			return nil, fmt.Errorf("webhook: secrets: %w", err)
		}
		h.crcKeys = keys
	}
	token, err := spec.BearerToken()
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	if token != "" {
		h.token = &bearer{sum: sha256.Sum256([]byte(token))}
	}
	return h, nil
}

// Close implements handler: a webhook keeps no connection of its own.
func (h *webhook) Close() {}

// eventAnswer is the JSON of one event in an answer.
type eventAnswer struct {
	// ID is the event's seq in the ledger.
	ID             int64     `json:"id"`
	IdempotencyKey string    `json:"idempotency_key"`
	Status         string    `json:"status"`
	Duplicate      bool      `json:"duplicate"`
	Deliveries     int       `json:"deliveries"`
	Received       int       `json:"received"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	LastError      string    `json:"last_error,omitempty"`
	RequestID      string    `json:"request_id,omitempty"`
}

// appendJSON appends a's JSON, the same bytes json.Marshal makes (one
// webhook answer per request: encoding/json's reflection was the largest
// cost of the handler itself).
func (a *eventAnswer) appendJSON(b []byte) []byte {
	b = strconv.AppendInt(append(b, `{"id":`...), a.ID, 10)
	b = wire.AppendString(append(b, `,"idempotency_key":`...), a.IdempotencyKey)
	b = wire.AppendString(append(b, `,"status":`...), a.Status)
	b = strconv.AppendBool(append(b, `,"duplicate":`...), a.Duplicate)
	b = strconv.AppendInt(append(b, `,"deliveries":`...), int64(a.Deliveries), 10)
	b = strconv.AppendInt(append(b, `,"received":`...), int64(a.Received), 10)
	b = append(a.CreatedAt.AppendFormat(append(b, `,"created_at":"`...), time.RFC3339Nano), '"')
	b = append(a.UpdatedAt.AppendFormat(append(b, `,"updated_at":"`...), time.RFC3339Nano), '"')
	if a.LastError != "" {
		b = wire.AppendString(append(b, `,"last_error":`...), a.LastError)
	}
	if a.RequestID != "" {
		b = wire.AppendString(append(b, `,"request_id":`...), a.RequestID)
	}
	return append(b, '}')
}

// statusAnswer is the JSON answer of a status look-up: the event and, for
// an event of a signed source, how its signature was verified.
type statusAnswer struct {
	eventAnswer
	Verification *verification `json:"verification,omitempty"`
}

// verification is an event's signature verdict (queue.Verdict): the
// scheme, the position of the secret that matched, the time the signature
// signs (absent when the scheme signs none) and when it was received.
type verification struct {
	Scheme     string    `json:"scheme"`
	Secret     int       `json:"secret"`
	SignedAt   time.Time `json:"signed_at,omitzero"`
	ReceivedAt time.Time `json:"received_at"`
}

// batchAnswer is the JSON answer to a batch.
type batchAnswer struct {
	Events    []eventAnswer `json:"events"`
	RequestID string        `json:"request_id"`
}

// rejection is the JSON of an error answer.
type rejection struct {
	Error     string `json:"error"`
	RequestID string `json:"request_id"`
}

// answerOf is the answer for an event whose ledger status is st.
func answerOf(st queue.EventStatus, duplicate bool) eventAnswer {
	return eventAnswer{ID: st.Seq, IdempotencyKey: st.Key, Status: st.Status, Duplicate: duplicate,
		Deliveries: st.Deliveries, Received: st.Received, CreatedAt: st.CreatedAt.UTC(), UpdatedAt: st.UpdatedAt.UTC(),
		LastError: st.LastError}
}

// ServeHTTP implements http.Handler.
func (h *webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reqID := requestID(r)
	w.Header().Set("X-Request-ID", reqID)
	rest := r.PathValue("rest")
	switch {
	case rest == "" && r.Method == http.MethodGet && h.challenge == sources.ChallengeCRCSHA256:
		h.crc(w, r, reqID)
	case rest == "":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			h.refuse(w, r, reqID, http.StatusMethodNotAllowed, reasonMethod, "POST events to /ingest/"+h.name, nil, false)
			return
		}
		h.ingest(w, r, reqID)
	case rest == "events" || strings.HasPrefix(rest, "events/") && !strings.Contains(rest[len("events/"):], "/"):
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			h.reject(w, r, reqID, http.StatusMethodNotAllowed, "look events up with GET")
			return
		}
		h.status(w, r, reqID, strings.TrimPrefix(rest, "events"))
	default:
		h.reject(w, r, reqID, http.StatusNotFound, "not found: POST to /ingest/"+h.name+", GET /ingest/"+h.name+"/events/{id}")
	}
}

// ingest answers a POST: authenticate, read, verify, decode, commit.
func (h *webhook) ingest(w http.ResponseWriter, r *http.Request, reqID string) {
	// The body must arrive within readTimeout, also when it is refused
	// unread: net/http reads what is left of it before answering.
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(h.readTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		h.env.log.Debug("webhook: set the body read deadline", "err", err)
	}
	if !h.authorized(w, r, reqID, true) {
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !jsonMediaType(ct) {
		h.refuse(w, r, reqID, http.StatusUnsupportedMediaType, reasonContentType, "Content-Type must be application/json (or application/*+json)", nil, false)
		return
	}
	body, code, err := h.readBody(w, r, rc)
	if err != nil {
		why := reasonInvalidBody
		switch code {
		case http.StatusRequestEntityTooLarge:
			why = reasonTooLarge
		case http.StatusRequestTimeout:
			why = reasonBodyTimeout
		}
		h.refuse(w, r, reqID, code, why, err.Error(), body, false)
		return
	}
	verdict, ok := h.admitted(w, r, reqID, body)
	if !ok {
		return
	}
	found, batch, err := h.rules.decode(body)
	if err != nil {
		h.refuse(w, r, reqID, http.StatusBadRequest, reasonInvalidBody, err.Error(), body, true)
		return
	}
	events, err := h.keys(r, body, found, batch)
	if err != nil {
		h.refuse(w, r, reqID, http.StatusBadRequest, reasonInvalidKey, err.Error(), body, true)
		return
	}
	sc := trace.SpanContextFromContext(r.Context()) // the request's span, when traced
	for i := range events {
		events[i].Verdict, events[i].Trace = verdict, sc
	}
	outs, err := h.env.inbox.Commit(r.Context(), h.name, body, events)
	if err != nil {
		h.commitFailed(w, r, reqID, err)
		return
	}
	code = http.StatusOK
	answers := make([]eventAnswer, len(outs))
	for i, o := range outs {
		answers[i] = answerOf(o.EventStatus, !o.New)
		if o.New {
			code = http.StatusAccepted
		}
	}
	h.answered[b2i(code == http.StatusAccepted)].Inc()
	if h.env.log.Enabled(r.Context(), slog.LevelDebug) {
		for _, a := range answers {
			h.env.log.Debug("webhook event stored", "request_id", reqID, "id", a.ID, "key", a.IdempotencyKey, "duplicate", a.Duplicate)
		}
	}
	if batch {
		WriteJSON(w, code, batchAnswer{Events: answers, RequestID: reqID})
		return
	}
	answers[0].RequestID = reqID
	writeJSONBytes(w, code, answers[0].appendJSON(make([]byte, 0, 256)))
}

// admitted checks the signature, if the source has a scheme, answering 401
// when it is missing or wrong, and counts the secret that matched; then it
// answers a Slack url_verification (webhook_challenge.go). It reports
// whether the request goes on to be stored, and the verdict its events
// are stored with (nil without a scheme).
func (h *webhook) admitted(w http.ResponseWriter, r *http.Request, reqID string, body []byte) (*queue.Verdict, bool) {
	var verdict *queue.Verdict
	if h.verify != nil {
		now := time.Now()
		m, err := h.verify(r.Header, body, now)
		if err != nil {
			h.refuse(w, r, reqID, http.StatusUnauthorized, signatureReason(err), "bad signature: "+err.Error(), body, true)
			return nil, false
		}
		h.matches[m.secret].Inc()
		verdict = &queue.Verdict{Scheme: h.scheme, Secret: m.secret, ReceivedAt: now.UTC()}
		if m.signedAt != 0 {
			verdict.SignedAt = time.Unix(m.signedAt, 0).UTC()
		}
	}
	return verdict, h.challenge != sources.ChallengeSlack || !h.slackChallenge(w, r, reqID, body)
}

// authorized checks the bearer token, if the source has one, answering 401
// or 403 when it is missing or wrong; a refused delivery (not a status
// look-up) is recorded.
func (h *webhook) authorized(w http.ResponseWriter, r *http.Request, reqID string, delivery bool) bool {
	if h.token == nil {
		return true
	}
	code, why, msg := 0, "", ""
	switch h.token.check(r) {
	case authMissing:
		w.Header().Set("WWW-Authenticate", `Bearer realm="ingestor"`)
		code, why, msg = http.StatusUnauthorized, reasonMissingToken, "missing Authorization: Bearer token"
	case authWrong:
		code, why, msg = http.StatusForbidden, reasonBadToken, "wrong bearer token"
	default:
		return true
	}
	if delivery {
		h.refuse(w, r, reqID, code, why, msg, nil, false)
	} else {
		h.reject(w, r, reqID, code, msg)
	}
	return false
}

// readBody reads the request body, up to max_body_bytes, and then lifts the
// read deadline ingest set. On error, code is the status to answer, body
// what was read of a body over max_body_bytes (for the quarantine), and
// the deadline stays: the connection is closed after the answer.
func (h *webhook) readBody(w http.ResponseWriter, r *http.Request, rc *http.ResponseController) (body []byte, code int, err error) {
	tooLarge := func() error { return fmt.Errorf("the body is over max_body_bytes (%d bytes)", h.maxBody) }
	if r.ContentLength > h.maxBody {
		return nil, http.StatusRequestEntityTooLarge, tooLarge()
	}
	size := int64(512)
	if r.ContentLength > 0 {
		size = r.ContentLength + 1 // room to see the end without growing
	}
	body, err = readAll(http.MaxBytesReader(w, r.Body, h.maxBody), make([]byte, 0, size))
	var maxErr *http.MaxBytesError
	switch {
	case err == nil:
		if derr := rc.SetReadDeadline(time.Time{}); derr != nil && !errors.Is(derr, http.ErrNotSupported) {
			h.env.log.Debug("webhook: lift the body read deadline", "err", derr)
		}
		return body, 0, nil
	case errors.As(err, &maxErr):
		return body, http.StatusRequestEntityTooLarge, tooLarge()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, http.StatusRequestTimeout, fmt.Errorf("the body was not read within %s", h.readTimeout)
	default:
		return nil, http.StatusBadRequest, fmt.Errorf("read the body: %w", err)
	}
}

// readAll appends what r holds to buf until EOF, growing buf only when it
// is full: a body of known length is read into a buffer of that length
// plus one byte, allocated once (bytes.Buffer.ReadFrom wants 512 bytes of
// room for every read, and so grew the buffer of every small body).
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// keys gives each event found its idempotency key: the Idempotency-Key
// header, else the event's id field, else the key header, else the hex
// SHA-256 of the event's bytes. A header names a whole request, so in a
// batch each event's key is the header value + "#" + its index.
func (h *webhook) keys(r *http.Request, body []byte, found []bodyEvent, batch bool) ([]Event, error) {
	idem, err := keyHeaderValue(r, "Idempotency-Key")
	if err != nil {
		return nil, err
	}
	var fromHeader string
	if h.keyHeader != "" {
		if fromHeader, err = keyHeaderValue(r, h.keyHeader); err != nil {
			return nil, err
		}
	}
	events := make([]Event, len(found))
	for i, f := range found {
		e := Event{Time: f.Time, Off: f.Off, Len: f.Len}
		switch {
		case idem != "":
			e.Key = perEvent(idem, i, batch)
		case f.ID != "":
			e.Key = f.ID
		case fromHeader != "":
			e.Key = perEvent(fromHeader, i, batch)
		default:
			sum := sha256.Sum256(body[f.Off : f.Off+f.Len])
			e.Key = hex.EncodeToString(sum[:])
		}
		events[i] = e
	}
	return events, nil
}

// perEvent returns a request-wide key for event i.
func perEvent(key string, i int, batch bool) string {
	if !batch {
		return key
	}
	return key + "#" + strconv.Itoa(i)
}

// keyHeaderValue returns header name, "" when absent, or an error when it
// is not 1 to 255 printable ASCII characters.
func keyHeaderValue(r *http.Request, name string) (string, error) {
	v := r.Header.Get(name)
	if v == "" {
		return "", nil
	}
	if len(v) > maxKeyHeader || !printable(v, true) {
		return "", fmt.Errorf("the %s header must be 1 to %d printable ASCII characters", name, maxKeyHeader)
	}
	return v, nil
}

// commitFailed answers a commit that stored nothing: 429 when the inbox is
// busy, else (disk space low, stopping, a failed write) 503; all with
// Retry-After.
func (h *webhook) commitFailed(w http.ResponseWriter, r *http.Request, reqID string, err error) {
	var busy *BusyError
	switch {
	case errors.As(err, &busy) && busy.Unavailable:
		w.Header().Set("Retry-After", retryAfter(busy.RetryAfter))
		h.reject(w, r, reqID, http.StatusServiceUnavailable, "cannot store events now, retry later: "+busy.Reason)
	case errors.As(err, &busy):
		w.Header().Set("Retry-After", retryAfter(busy.RetryAfter))
		h.reject(w, r, reqID, http.StatusTooManyRequests, "busy, retry later: "+busy.Reason)
	case errors.Is(err, ErrClosed):
		w.Header().Set("Retry-After", retryAfter(unavailableRetryAfter))
		h.reject(w, r, reqID, http.StatusServiceUnavailable, "the daemon is stopping, retry later")
	default:
		w.Header().Set("Retry-After", retryAfter(unavailableRetryAfter))
		h.reject(w, r, reqID, http.StatusServiceUnavailable, "the event could not be made durable, retry later")
	}
}

// retryAfter renders d as whole seconds, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// status answers GET /ingest/NAME/events/{id} (sel "/ID") and
// GET /ingest/NAME/events?idempotency_key=K (sel "").
func (h *webhook) status(w http.ResponseWriter, r *http.Request, reqID, sel string) {
	if h.token == nil && !h.env.loopback {
		h.reject(w, r, reqID, http.StatusForbidden, "status look-ups on a listener beyond loopback need the source's bearer token: set token or token_file")
		return
	}
	if !h.authorized(w, r, reqID, false) {
		return
	}
	var (
		st  queue.EventStatus
		ok  bool
		err error
	)
	if sel == "" {
		key := r.URL.Query().Get("idempotency_key")
		if key == "" {
			h.reject(w, r, reqID, http.StatusBadRequest, "GET /ingest/"+h.name+"/events needs ?idempotency_key=KEY")
			return
		}
		st, ok, err = h.env.inbox.EventByKey(r.Context(), h.name, key)
	} else {
		seq, perr := strconv.ParseInt(sel[1:], 10, 64)
		if perr != nil || seq < 1 {
			h.reject(w, r, reqID, http.StatusBadRequest, "the event id must be a positive integer")
			return
		}
		st, ok, err = h.env.inbox.EventBySeq(r.Context(), h.name, seq)
	}
	switch {
	case err != nil:
		h.env.log.Error("webhook: status look-up failed", "request_id", reqID, "err", err)
		w.Header().Set("Retry-After", retryAfter(unavailableRetryAfter))
		h.reject(w, r, reqID, http.StatusServiceUnavailable, "the ledger could not be read, retry later")
	case !ok:
		h.reject(w, r, reqID, http.StatusNotFound, "no such event (never received, or forgotten after publish.dedupe_window)")
	default:
		h.env.metrics.Requests.WithLabelValues(h.name, "200").Inc()
		a := statusAnswer{eventAnswer: answerOf(st, false)}
		a.RequestID = reqID
		if v := st.Verdict; v != nil {
			a.Verification = &verification{Scheme: v.Scheme, Secret: v.Secret, SignedAt: v.SignedAt, ReceivedAt: v.ReceivedAt}
		}
		WriteJSON(w, http.StatusOK, a)
	}
}

// refuse answers a refused delivery as reject does, and records it: why
// is its reason, body what was read of its body (nil: none) and whole
// whether that is all of it.
func (h *webhook) refuse(w http.ResponseWriter, r *http.Request, reqID string, code int, why, reason string, body []byte, whole bool) {
	h.rejects.record(r, reqID, code, why, reason, body, whole)
	h.reject(w, r, reqID, code, reason)
}

// reject answers code with reason, counts it and logs it: a few a minute
// at info (warn for authentication failures), the rest at debug. Neither
// the body nor a secret is ever logged.
func (h *webhook) reject(w http.ResponseWriter, r *http.Request, reqID string, code int, reason string) {
	h.env.metrics.Requests.WithLabelValues(h.name, strconv.Itoa(code)).Inc()
	level := slog.LevelDebug
	if h.rejectLog.Allow() {
		level = slog.LevelInfo
		if code == http.StatusUnauthorized || code == http.StatusForbidden {
			level = slog.LevelWarn
		}
	}
	h.env.log.Log(r.Context(), level, "webhook request refused", "request_id", reqID, "code", code,
		"reason", reason, "method", r.Method, "remote", r.RemoteAddr)
	WriteJSON(w, code, rejection{Error: reason, RequestID: reqID})
}

// requestID returns the request's X-Request-ID when it is 1 to 128
// printable ASCII characters, else a new one (newRequestID).
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-ID"); id != "" && len(id) <= maxRequestID && printable(id, false) {
		return id
	}
	return newRequestID()
}

// requestIDPrefix and requestIDs make the ids of requests that came
// without one: 26 base32 characters like crypto/rand.Text's, the first
// 16 random for each run of the daemon (80 bits), the last 10 a counter.
// An id only has to be unique, to find a request's log lines, and reading
// 128 random bits for each request was a tenth of the webhook handler's
// own CPU.
var (
	requestIDPrefix = rand.Text()[:16]
	requestIDs      atomic.Uint64
)

// newRequestID returns a request id never returned before in this run.
func newRequestID() string {
	const digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567" // crypto/rand.Text's
	var b [26]byte
	copy(b[:], requestIDPrefix)
	n := requestIDs.Add(1)
	for i := len(b) - 1; i >= 16; i-- {
		b[i] = digits[n&31]
		n >>= 5
	}
	return string(b[:])
}

// printable reports whether s is printable ASCII; spaces are allowed
// when space is true.
func printable(s string, space bool) bool {
	for i := range len(s) {
		c := s[i]
		if c < ' ' || c > '~' || c == ' ' && !space {
			return false
		}
	}
	return true
}

// jsonMediaType reports whether a Content-Type names JSON:
// application/json or application/*+json.
func jsonMediaType(ct string) bool {
	if ct == "application/json" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	sub, ok := strings.CutPrefix(mt, "application/")
	return ok && (sub == "json" || strings.HasSuffix(sub, "+json"))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
