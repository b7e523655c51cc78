package push

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/sources"
)

// hookServer is a push listener serving one webhook source, "hooks", on a
// real inbox (real queue, real file raw store).
type hookServer struct {
	url     string // http://ADDR/ingest/hooks
	in      *Inbox
	q       *queue.Queue
	raw     rawstore.Store
	frames  *frameLog
	logs    *testsync.LockedBuffer
	metrics *Metrics
}

// startHooks starts a push listener on loopback for a webhook source whose
// startServer starts a push listener with o and shuts it down when the
// test ends.
func startServer(t *testing.T, o ServerOptions) *Server {
	t.Helper()
	srv, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Not t.Context(): it is cancelled before the cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return srv
}

// spec set adjusts; maxPending is publish.max_pending_events.
func startHooks(t *testing.T, maxPending int64, set func(*sources.WebhookSpec)) *hookServer {
	t.Helper()
	in, q, raw, frames := openInbox(t, maxPending)
	spec := webhookSpec(t, set)
	logs, metrics := &testsync.LockedBuffer{}, NewMetrics(nil)
	srv := startServer(t, ServerOptions{Push: config.Push{Addr: "127.0.0.1:0"},
		Sources: []config.Source{{Name: "hooks", Kind: "webhook", Enabled: true, Spec: spec}},
		Inbox:   in, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), Metrics: metrics})
	return &hookServer{url: "http://" + srv.Addr() + "/ingest/hooks", in: in, q: q, raw: raw, frames: frames, logs: logs, metrics: metrics}
}

// webhookSpec returns a valid webhook spec: the defaults adjusted by set.
func webhookSpec(t *testing.T, set func(*sources.WebhookSpec)) *sources.WebhookSpec {
	t.Helper()
	s, _ := sources.NewSpec("webhook")
	spec := s.(*sources.WebhookSpec)
	if set != nil {
		set(spec)
	}
	if errs := spec.Validate(); len(errs) > 0 {
		t.Fatalf("invalid test spec: %v", errs)
	}
	return spec
}

// reply is an answer read whole.
type reply struct {
	code   int
	header http.Header
	body   string
}

// event decodes a one-event answer.
func (r reply) event(t *testing.T) eventAnswer {
	t.Helper()
	var a eventAnswer
	if err := json.Unmarshal([]byte(r.body), &a); err != nil {
		t.Fatalf("answer %d %q: %v", r.code, r.body, err)
	}
	return a
}

// send sends a request and reads its answer; headers are name, value
// pairs.
func send(t *testing.T, method, url, body string, headers ...string) reply {
	t.Helper()
	return sendWith(t, http.DefaultClient, method, url, strings.NewReader(body), headers...)
}

// sendWith sends a request with c; headers are name, value pairs. A body
// of type io.Reader other than *strings.Reader is sent chunked.
func sendWith(t *testing.T, c *http.Client, method, url string, body io.Reader, headers ...string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

func expect(t *testing.T, r reply, code int, inBody string) {
	t.Helper()
	if r.code != code || !strings.Contains(r.body, inBody) {
		t.Fatalf("answer %d %s, want %d with %q", r.code, r.body, code, inBody)
	}
	if r.header.Get("X-Request-ID") == "" || !strings.Contains(r.body, `"request_id":"`+r.header.Get("X-Request-ID")+`"`) {
		t.Errorf("answer %d %s: X-Request-ID %q missing or not in the body", r.code, r.body, r.header.Get("X-Request-ID"))
	}
}

// TestWebhookAnswers walks every answer of POST /ingest/NAME on a source
// with a token and a required field.
func TestWebhookAnswers(t *testing.T) {
	const token = "0123456789abcdef-token"
	h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) {
		s.Token, s.IDField, s.RequiredFields, s.TimeField, s.MaxBodyBytes = token, "id", []string{"type"}, "at", 100
	})
	auth := "Bearer " + token
	post := func(body string, headers ...string) reply {
		return send(t, http.MethodPost, h.url, body, append([]string{"Authorization", auth, "Content-Type", "application/json"}, headers...)...)
	}

	r := post(`{"id":"e1","type":"push","at":"2026-01-02T03:04:05Z"}`, "X-Request-ID", "req-1")
	expect(t, r, http.StatusAccepted, `"idempotency_key":"e1","status":"queued","duplicate":false`)
	first := r.event(t)
	if first.ID < 1 || first.RequestID != "req-1" || r.header.Get("X-Request-ID") != "req-1" || first.CreatedAt.IsZero() {
		t.Errorf("new event answer %+v (X-Request-ID %q), want an id, the request id taken and times", first, r.header.Get("X-Request-ID"))
	}
	r = post(`{"type":"push","id":"e1"}`)
	expect(t, r, http.StatusOK, `"duplicate":true`)
	if dup := r.event(t); dup.ID != first.ID || dup.Received != 2 || dup.RequestID == "req-1" {
		t.Errorf("duplicate answer %+v, want id %d, 2 arrivals and a new request id", dup, first.ID)
	}
	if got := h.frames.events(); got != 1 {
		t.Errorf("%d events handed to the sender, want 1", got)
	}

	expect(t, post(`{"id":"e2","type":`), http.StatusBadRequest, "invalid JSON")
	expect(t, post(`{"id":"e2"}`), http.StatusBadRequest, `the required field \"type\" is missing`)
	expect(t, post(`{"id":"e2","type":null}`), http.StatusBadRequest, `the required field \"type\" is missing`)
	expect(t, post(`"e2"`), http.StatusBadRequest, "the body is a JSON string, want an object")
	expect(t, post(``), http.StatusBadRequest, "empty body")
	expect(t, post(`[]`), http.StatusBadRequest, "the array holds no events")
	// JSON is UTF-8: bytes that are not, even inside a string, are refused
	// (they used to be stored and sent on as they came).
	expect(t, post("{\"id\":\"e2\",\"type\":\"\xff\xfe\"}"), http.StatusBadRequest, "not valid UTF-8 (byte 19)")
	expect(t, post("{\"id\":\"e2\",\"type\":\"\xc0\xaf\"}"), http.StatusBadRequest, "not valid UTF-8 (byte 19)")
	expect(t, post(`{"id":"e2","type":"x","pad":"`+strings.Repeat("a", 100)+`"}`), http.StatusRequestEntityTooLarge, "max_body_bytes (100 bytes)")
	expect(t, post(`{}`, "Content-Type", "text/plain"), http.StatusUnsupportedMediaType, "Content-Type")
	expect(t, post(`{"id":"e3","type":"x"}`, "Content-Type", "application/cloudevents+json; charset=utf-8"), http.StatusAccepted, `"e3"`)
	expect(t, send(t, http.MethodPost, h.url, `{"id":"e2","type":"x"}`), http.StatusUnauthorized, "missing Authorization")
	expect(t, send(t, http.MethodPost, h.url, `{"id":"e2","type":"x"}`, "Authorization", "Bearer wrong-token-0123456789"), http.StatusForbidden, "wrong bearer token")
	r = send(t, http.MethodPut, h.url, `{}`, "Authorization", auth)
	expect(t, r, http.StatusMethodNotAllowed, "POST")
	if r.header.Get("Allow") != http.MethodPost {
		t.Errorf("405 Allow = %q", r.header.Get("Allow"))
	}
	expect(t, send(t, http.MethodPost, h.url+"/elsewhere", `{}`, "Authorization", auth), http.StatusNotFound, "not found")

	// A body sent slowly but within the read bound, and a chunked one.
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(`{"id":"e4",`))
		_, _ = pw.Write([]byte(`"type":"x"}`))
		_ = pw.Close()
	}()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, h.url, pr)
	req.Header.Set("Authorization", auth)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Errorf("chunked body answered %d", resp.StatusCode)
	}

	// Nothing refused was stored; the body and the token are not logged.
	for _, key := range []string{"e2"} {
		if _, ok, _ := h.q.EventByKey(t.Context(), "hooks", key); ok {
			t.Errorf("refused event %s is in the ledger", key)
		}
	}
	if logs := h.logs.String(); strings.Contains(logs, token) || strings.Contains(logs, `"type"`) || !strings.Contains(logs, "request_id=req-1") {
		t.Errorf("logs hold the token or a body, or not the request id:\n%s", logs)
	}
}

// TestWebhookBusyAndClosed answers 429 with Retry-After while the queue is
// at max_pending_events, a retry of a stored event too (a refusal reads
// nothing), then 503 with Retry-After once the inbox closed.
func TestWebhookBusyAndClosed(t *testing.T) {
	h := startHooks(t, 1, nil)
	expect(t, send(t, http.MethodPost, h.url, `{"n":1}`), http.StatusAccepted, `"status":"queued"`)
	r := send(t, http.MethodPost, h.url, `{"n":2}`)
	expect(t, r, http.StatusTooManyRequests, "max_pending_events")
	if r.header.Get("Retry-After") != "1" {
		t.Errorf("429 Retry-After = %q, want 1", r.header.Get("Retry-After"))
	}
	// A retry of a stored event is refused too: a refusal costs no ledger
	// read, so that refusals never compete with the group commit for the
	// ledger's read pool under overload. Let in later, it is told its
	// status.
	expect(t, send(t, http.MethodPost, h.url, `{"n":1}`), http.StatusTooManyRequests, "max_pending_events")
	h.in.Close()
	r = send(t, http.MethodPost, h.url, `{"n":3}`)
	expect(t, r, http.StatusServiceUnavailable, "stopping")
	if r.header.Get("Retry-After") != "5" {
		t.Errorf("503 Retry-After = %q, want 5", r.header.Get("Retry-After"))
	}
}

// TestWebhookKeyPrecedence checks the order: Idempotency-Key, id_field,
// id_header, SHA-256 of the event's bytes; in a batch a header key is
// suffixed with "#" and the element's index.
func TestWebhookKeyPrecedence(t *testing.T) {
	h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.IDField, s.IDHeader = "meta.id", "X-Delivery" })
	key := func(body string, headers ...string) string {
		t.Helper()
		r := send(t, http.MethodPost, h.url, body, headers...)
		if r.code != http.StatusAccepted && r.code != http.StatusOK {
			t.Fatalf("answer %d %s", r.code, r.body)
		}
		return r.event(t).IdempotencyKey
	}
	if k := key(`{"meta":{"id":"f1"}}`, "Idempotency-Key", "idem-1", "X-Delivery", "d1"); k != "idem-1" {
		t.Errorf("with Idempotency-Key: key %q", k)
	}
	if k := key(`{"meta":{"id":42}}`, "X-Delivery", "d1"); k != "42" {
		t.Errorf("with id_field: key %q", k)
	}
	if k := key(`{"meta":{}}`, "X-Delivery", "d1"); k != "d1" {
		t.Errorf("with id_header: key %q", k)
	}
	body := ` {"x": 1} `
	if k := key(body); k != sha256Hex(`{"x": 1}`) {
		t.Errorf("without any: key %q, want the SHA-256 of the event's bytes", k)
	}
	expect(t, send(t, http.MethodPost, h.url, `{}`, "Idempotency-Key", strings.Repeat("k", 256)), http.StatusBadRequest, "Idempotency-Key header must be 1 to 255")

	// A batch: per-element keys, answered per event, 202 while one is new.
	r := send(t, http.MethodPost, h.url, `[{"meta":{"id":"b1"}},{"n":2}]`, "X-Delivery", "d9")
	var batch batchAnswer
	if err := json.Unmarshal([]byte(r.body), &batch); err != nil || r.code != http.StatusAccepted || len(batch.Events) != 2 {
		t.Fatalf("batch answer %d %s (%v)", r.code, r.body, err)
	}
	if batch.Events[0].IdempotencyKey != "b1" || batch.Events[1].IdempotencyKey != "d9#1" || batch.RequestID == "" {
		t.Errorf("batch keys %+v, want b1 and d9#1", batch)
	}
	r = send(t, http.MethodPost, h.url, `[{"a":1},{"a":2}]`, "Idempotency-Key", "idem-b")
	if err := json.Unmarshal([]byte(r.body), &batch); err != nil || batch.Events[0].IdempotencyKey != "idem-b#0" || batch.Events[1].IdempotencyKey != "idem-b#1" {
		t.Errorf("batch with Idempotency-Key: %s", r.body)
	}
	r = send(t, http.MethodPost, h.url, `[{"meta":{"id":"b1"}},{"n":2}]`, "X-Delivery", "d9")
	if r.code != http.StatusOK || strings.Count(r.body, `"duplicate":true`) != 2 {
		t.Errorf("repeated batch answered %d %s, want 200 with two duplicates", r.code, r.body)
	}
	expect(t, send(t, http.MethodPost, h.url, `[{"a":1},2]`), http.StatusBadRequest, "event 1 is not a JSON object")
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestWebhookStatusLookup reads an event's status by id and by key.
func TestWebhookStatusLookup(t *testing.T) {
	h := startHooks(t, 1_000_000, nil)
	r := send(t, http.MethodPost, h.url, `{"x":1}`, "Idempotency-Key", "look-1")
	id := r.event(t).ID
	r = send(t, http.MethodGet, fmt.Sprintf("%s/events/%d", h.url, id), "")
	expect(t, r, http.StatusOK, `"idempotency_key":"look-1","status":"queued"`)
	if a := r.event(t); a.ID != id || a.Received != 1 {
		t.Errorf("status by id %+v", a)
	}
	expect(t, send(t, http.MethodGet, h.url+"/events?idempotency_key=look-1", ""), http.StatusOK, fmt.Sprintf(`"id":%d`, id))
	expect(t, send(t, http.MethodGet, h.url+"/events?idempotency_key=nope", ""), http.StatusNotFound, "no such event")
	expect(t, send(t, http.MethodGet, h.url+"/events/999", ""), http.StatusNotFound, "no such event")
	expect(t, send(t, http.MethodGet, h.url+"/events/abc", ""), http.StatusBadRequest, "positive integer")
	expect(t, send(t, http.MethodGet, h.url+"/events", ""), http.StatusBadRequest, "idempotency_key=KEY")
	expect(t, send(t, http.MethodPost, h.url+"/events/1", ""), http.StatusMethodNotAllowed, "GET")

	// Acked once its frame is acked.
	h.frames.mu.Lock()
	f := h.frames.frames[0]
	h.frames.mu.Unlock()
	if _, err := h.q.Ack(t.Context(), []int64{f.ID}, nil); err != nil {
		t.Fatal(err)
	}
	expect(t, send(t, http.MethodGet, fmt.Sprintf("%s/events/%d", h.url, id), ""), http.StatusOK, `"status":"acked"`)
}

// TestWebhookStatusAuth: with a token, status look-ups need it; without
// one, they are served only on a loopback listener.
func TestWebhookStatusAuth(t *testing.T) {
	const token = "status-token-0123456789"
	h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Token = token })
	expect(t, send(t, http.MethodGet, h.url+"/events/1", ""), http.StatusUnauthorized, "missing Authorization")
	expect(t, send(t, http.MethodGet, h.url+"/events/1", "", "Authorization", "Bearer nope-nope-nope-nope"), http.StatusForbidden, "wrong bearer token")
	expect(t, send(t, http.MethodGet, h.url+"/events/1", "", "Authorization", "Bearer "+token), http.StatusNotFound, "no such event")

	// The same handler on a listener beyond loopback, without a token.
	in, _, _, _ := openInbox(t, 100)
	wh, err := newWebhook(handlerEnv{source: config.Source{Name: "open"}, inbox: in, log: slog.New(slog.DiscardHandler),
		metrics: NewMetrics(nil), loopback: false}, webhookSpec(t, func(s *sources.WebhookSpec) { s.Signature, s.Secret = "github", "s3cret" }))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ingest/{name}/{rest...}", wh)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	expect(t, send(t, http.MethodGet, ts.URL+"/ingest/open/events/1", ""), http.StatusForbidden, "need the source's bearer token")
}

// TestWebhookRequestID takes a sane X-Request-ID and replaces another.
func TestWebhookRequestID(t *testing.T) {
	h := startHooks(t, 1_000_000, nil)
	for _, tc := range []struct{ sent, want string }{
		{"abc-123", "abc-123"},
		{strings.Repeat("r", 128), strings.Repeat("r", 128)},
		{strings.Repeat("r", 129), ""},
		{"has space", ""},
		{"", ""},
	} {
		r := send(t, http.MethodPost, h.url, `{"a":1}`, "X-Request-ID", tc.sent)
		got := r.header.Get("X-Request-ID")
		if tc.want != "" && got != tc.want || tc.want == "" && (got == "" || got == tc.sent) {
			t.Errorf("sent X-Request-ID %q: answered %q", tc.sent, got)
		}
		if a := r.event(t); a.RequestID != got {
			t.Errorf("body request_id %q, header %q", a.RequestID, got)
		}
	}
}

// pyHMAC returns the hex HMAC-SHA256 of msg with secret, computed by
// Python's hmac module, independently of the code under test.
func pyHMAC(t *testing.T, secret string, msg []byte) string {
	t.Helper()
	return hex.EncodeToString(pyMAC(t, []byte(secret), msg))
}

// pyMAC returns the HMAC-SHA256 of msg with key, computed by Python's hmac
// module.
func pyMAC(t *testing.T, key, msg []byte) []byte {
	t.Helper()
	return pyMACWith(t, "sha256", key, msg)
}

// pyMACWith returns the HMAC of msg with key and the hash alg ("sha1",
// "sha256" or "sha512"), computed by Python's hmac module.
func pyMACWith(t *testing.T, alg string, key, msg []byte) []byte {
	t.Helper()
	cmd := exec.Command(testsync.Python3(t), "-c",
		"import hmac,hashlib,os,sys; print(hmac.new(bytes.fromhex(os.environ['K']), sys.stdin.buffer.read(), os.environ['A']).hexdigest())")
	cmd.Env = append(os.Environ(), "K="+hex.EncodeToString(key), "A="+alg)
	cmd.Stdin = bytes.NewReader(msg)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python hmac: %v", err)
	}
	sum, err := hex.DecodeString(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("python hmac: %q: %v", out, err)
	}
	return sum
}

// TestWebhookSignatures: each preset accepts a real example and refuses a
// missing signature, a tampered body and (where signed) an expired
// timestamp, with 401.
func TestWebhookSignatures(t *testing.T) {
	const secret = "It's a Secret to Everybody"
	body := `{"id":"evt_1","type":"ping"}`
	tampered := `{"id":"evt_1","type":"pong"}`
	now := time.Now().Unix()

	t.Run("github", func(t *testing.T) {
		h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Signature, s.Secret = "github", secret })
		// GitHub's documented example.
		const doc = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
		if got := "sha256=" + pyHMAC(t, secret, []byte("Hello, World!")); got != doc {
			t.Fatalf("python computes %s, GitHub documents %s", got, doc)
		}
		expect(t, send(t, http.MethodPost, h.url, "Hello, World!", "X-Hub-Signature-256", doc), http.StatusBadRequest, "invalid JSON")
		sig := "sha256=" + pyHMAC(t, secret, []byte(body))
		r := send(t, http.MethodPost, h.url, body, "X-Hub-Signature-256", sig, "X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
		expect(t, r, http.StatusAccepted, `"idempotency_key":"72d3162e-cc78-11e3-81ab-4c9367dc0958"`)
		expect(t, send(t, http.MethodPost, h.url, tampered, "X-Hub-Signature-256", sig), http.StatusUnauthorized, "does not match")
		expect(t, send(t, http.MethodPost, h.url, body), http.StatusUnauthorized, "missing the X-Hub-Signature-256 header")
		expect(t, send(t, http.MethodPost, h.url, body, "X-Hub-Signature-256", strings.TrimPrefix(sig, "sha256=")), http.StatusUnauthorized, `does not start with \"sha256=\"`)
	})
	t.Run("stripe", func(t *testing.T) {
		h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Signature, s.Secret = "stripe", secret })
		header := func(ts int64, b string) string {
			return fmt.Sprintf("t=%d,v1=%s,v0=deadbeef", ts, pyHMAC(t, secret, fmt.Appendf(nil, "%d.%s", ts, b)))
		}
		// Several v1 (during a secret roll): one matching is enough.
		sig := fmt.Sprintf("t=%d,v1=%s,v1=%s", now, strings.Repeat("ab", 32), pyHMAC(t, secret, fmt.Appendf(nil, "%d.%s", now, body)))
		expect(t, send(t, http.MethodPost, h.url, body, "Stripe-Signature", sig), http.StatusAccepted, `"idempotency_key":"evt_1"`)
		expect(t, send(t, http.MethodPost, h.url, tampered, "Stripe-Signature", header(now, body)), http.StatusUnauthorized, "does not match")
		expect(t, send(t, http.MethodPost, h.url, body, "Stripe-Signature", header(now-600, body)), http.StatusUnauthorized, "beyond the 5m0s tolerance")
		expect(t, send(t, http.MethodPost, h.url, body), http.StatusUnauthorized, "missing the Stripe-Signature header")
		// Stripe refuses only old timestamps.
		expect(t, send(t, http.MethodPost, h.url, body, "Stripe-Signature", header(now+600, body)), http.StatusOK, `"duplicate":true`)
	})
	t.Run("slack", func(t *testing.T) {
		h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Signature, s.Secret = "slack", secret })
		sign := func(ts int64, b string) (string, string) {
			return fmt.Sprint(ts), "v0=" + pyHMAC(t, secret, fmt.Appendf(nil, "v0:%d:%s", ts, b))
		}
		ts, sig := sign(now, body)
		expect(t, send(t, http.MethodPost, h.url, body, "X-Slack-Request-Timestamp", ts, "X-Slack-Signature", sig), http.StatusAccepted, `"status":"queued"`)
		expect(t, send(t, http.MethodPost, h.url, tampered, "X-Slack-Request-Timestamp", ts, "X-Slack-Signature", sig), http.StatusUnauthorized, "does not match")
		for _, skew := range []int64{-600, 600} {
			ts, sig := sign(now+skew, body)
			expect(t, send(t, http.MethodPost, h.url, body, "X-Slack-Request-Timestamp", ts, "X-Slack-Signature", sig), http.StatusUnauthorized, "beyond the 5m0s tolerance")
		}
		expect(t, send(t, http.MethodPost, h.url, body, "X-Slack-Signature", sig), http.StatusUnauthorized, "missing the X-Slack-Request-Timestamp header")
	})
	t.Run("standard", func(t *testing.T) {
		// The key of the Standard Webhooks vector (TestStandardPublishedVector
		// checks the vector itself), base64-decoded by the test.
		h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Signature, s.Secret = "standard", standardVector.secret })
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(standardVector.secret, "whsec_"))
		if err != nil {
			t.Fatal(err)
		}
		sign := func(id string, ts int64, b string) []string {
			sig := "v1," + base64.StdEncoding.EncodeToString(pyMAC(t, key, fmt.Appendf(nil, "%s.%d.%s", id, ts, b)))
			return []string{"webhook-id", id, "webhook-timestamp", fmt.Sprint(ts), "webhook-signature", sig}
		}
		expect(t, send(t, http.MethodPost, h.url, body, sign("msg_1", now, body)...), http.StatusAccepted, `"idempotency_key":"msg_1"`)
		// Any v1 entry of the list may match; other versions are ignored.
		good := sign("msg_2", now, body)
		good[5] = "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4= v2,abc " + good[5]
		expect(t, send(t, http.MethodPost, h.url, body, good...), http.StatusAccepted, `"idempotency_key":"msg_2"`)
		bad := sign("msg_3", now, body)
		bad[5] = "v1,"
		expect(t, send(t, http.MethodPost, h.url, body, bad...), http.StatusUnauthorized, "has no valid v1 signature")
		expect(t, send(t, http.MethodPost, h.url, body, sign("msg_3", now, body)[:4]...), http.StatusUnauthorized, "missing the webhook-signature header")
		tamperedSig := sign("msg_3", now, body)
		expect(t, send(t, http.MethodPost, h.url, tampered, tamperedSig...), http.StatusUnauthorized, "does not match")
		for _, skew := range []int64{-600, 600} {
			expect(t, send(t, http.MethodPost, h.url, body, sign("msg_3", now+skew, body)...), http.StatusUnauthorized, "beyond the 5m0s tolerance")
		}
		if _, ok, _ := h.q.EventByKey(t.Context(), "hooks", "msg_3"); ok {
			t.Error("a refused delivery is in the ledger")
		}
	})
	t.Run("shopify", func(t *testing.T) {
		h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Signature, s.Secret = "shopify", secret })
		sig := base64.StdEncoding.EncodeToString(pyMAC(t, []byte(secret), []byte(body)))
		r := send(t, http.MethodPost, h.url, body, "X-Shopify-Hmac-SHA256", sig, "X-Shopify-Webhook-Id", "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043")
		expect(t, r, http.StatusAccepted, `"idempotency_key":"b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"`)
		expect(t, send(t, http.MethodPost, h.url, tampered, "X-Shopify-Hmac-SHA256", sig), http.StatusUnauthorized, "does not match")
		expect(t, send(t, http.MethodPost, h.url, body), http.StatusUnauthorized, "missing the X-Shopify-Hmac-SHA256 header")
		expect(t, send(t, http.MethodPost, h.url, body, "X-Shopify-Hmac-SHA256", "sha256="+sig), http.StatusUnauthorized, "not base64")
		// The hex digest is valid base64, of other bytes.
		expect(t, send(t, http.MethodPost, h.url, body, "X-Shopify-Hmac-SHA256", pyHMAC(t, secret, []byte(body))), http.StatusUnauthorized, "does not match")
	})
	t.Run("hmac_sha256", func(t *testing.T) {
		h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) {
			s.Signature, s.Secret, s.SignatureHeader = "hmac_sha256", secret, "X-Signature"
		})
		sig := pyHMAC(t, secret, []byte(body))
		expect(t, send(t, http.MethodPost, h.url, body, "X-Signature", sig), http.StatusAccepted, `"status":"queued"`)
		expect(t, send(t, http.MethodPost, h.url, body, "X-Signature", "sha256="+strings.ToUpper(sig)), http.StatusOK, `"duplicate":true`)
		expect(t, send(t, http.MethodPost, h.url, tampered, "X-Signature", sig), http.StatusUnauthorized, "does not match")
		expect(t, send(t, http.MethodPost, h.url, body, "X-Signature", "zz"), http.StatusUnauthorized, "not hex")
		if logs := h.logs.String(); strings.Contains(logs, secret) {
			t.Errorf("the secret is in the logs:\n%s", logs)
		}
	})
	t.Run("hmac", func(t *testing.T) {
		h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) {
			s.Signature, s.Secret, s.SignatureHeader, s.Algorithm, s.Encoding, s.Prefix = "hmac", secret, "X-Signature", "sha512", "base64", "sha512="
			s.SignedContent, s.TimestampHeader, s.IDHeader = "{id}.{timestamp}.{body}", "X-Timestamp", "X-Event-Id"
		})
		sign := func(id string, ts int64, b string) []string {
			sig := base64.StdEncoding.EncodeToString(pyMACWith(t, "sha512", []byte(secret), fmt.Appendf(nil, "%s.%d.%s", id, ts, b)))
			return []string{"X-Signature", "sha512=" + sig, "X-Timestamp", fmt.Sprint(ts), "X-Event-Id", id}
		}
		expect(t, send(t, http.MethodPost, h.url, body, sign("ev-1", now, body)...), http.StatusAccepted, `"idempotency_key":"ev-1"`)
		expect(t, send(t, http.MethodPost, h.url, tampered, sign("ev-2", now, body)...), http.StatusUnauthorized, "does not match")
		for _, skew := range []int64{-600, 600} {
			expect(t, send(t, http.MethodPost, h.url, body, sign("ev-2", now+skew, body)...), http.StatusUnauthorized, "beyond the 5m0s tolerance")
		}
		noPrefix := sign("ev-2", now, body)
		noPrefix[1] = strings.TrimPrefix(noPrefix[1], "sha512=")
		expect(t, send(t, http.MethodPost, h.url, body, noPrefix...), http.StatusUnauthorized, `does not start with \"sha512=\"`)
		expect(t, send(t, http.MethodPost, h.url, body, sign("ev-2", now, body)[:4]...), http.StatusUnauthorized, "missing the X-Event-Id header")
		if _, ok, _ := h.q.EventByKey(t.Context(), "hooks", "ev-2"); ok {
			t.Error("a refused delivery is in the ledger")
		}
	})
}

// TestWebhookSlowBodyIsCutOff: a sender that stops sending its body is
// answered 408 once the read bound passes, and nothing is stored.
func TestWebhookSlowBodyIsCutOff(t *testing.T) {
	in, q, _, _ := openInbox(t, 100)
	h, err := newWebhook(handlerEnv{source: config.Source{Name: "slow"}, inbox: in, log: slog.New(slog.DiscardHandler),
		metrics: NewMetrics(nil), loopback: true}, webhookSpec(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	h.readTimeout = 200 * time.Millisecond
	mux := http.NewServeMux()
	mux.Handle("/ingest/{name}", h)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	// A stalled body is cut off, also on a request refused unread (net/http
	// reads what is left of a body before it answers).
	for _, tc := range []struct {
		contentType string
		code        int
		inBody      string
	}{
		{"application/json", http.StatusRequestTimeout, "not read within 200ms"},
		{"text/plain", http.StatusUnsupportedMediaType, "Content-Type"},
	} {
		conn, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		if _, err := fmt.Fprintf(conn, "POST /ingest/slow HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: 100\r\n\r\n{\"id\":", tc.contentType); err != nil {
			t.Fatal(err)
		}
		if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: no answer to a stalled body: %v", tc.contentType, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.inBody) {
			t.Errorf("%s: stalled body answered %d %s, want %d", tc.contentType, resp.StatusCode, body, tc.code)
		}
	}
	if q.PendingEvents() != 0 {
		t.Errorf("%d events stored from a stalled body", q.PendingEvents())
	}
}

// TestWebhookSecretRotation: during a rotation a request signed with the
// new or the old secret passes, one signed with a secret past its
// not_after is refused, the matches counter moves by position, and no
// secret is ever answered or logged.
func TestWebhookSecretRotation(t *testing.T) {
	secrets := []string{"new-secret-0123", "old-secret-4567", "gone-secret-89ab"}
	h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) {
		s.Signature = "github"
		s.Secrets = []sources.WebhookSecret{{Value: secrets[0]},
			{Value: secrets[1], NotAfter: time.Now().Add(time.Hour).Format(time.RFC3339)},
			{Value: secrets[2], NotAfter: "2026-01-01T00:00:00Z"}}
	})
	matches := func(pos string) float64 {
		return metricValue(t, h.metrics.signatureMatches.WithLabelValues("hooks", pos))
	}
	post := func(secret, id string) reply {
		body := `{"n":"` + id + `"}`
		return send(t, http.MethodPost, h.url, body, "X-Hub-Signature-256", "sha256="+pyHMAC(t, secret, []byte(body)), "X-GitHub-Delivery", id)
	}
	var answers []string
	for i, tc := range []struct {
		secret string
		code   int
		want   [3]float64
	}{
		{secrets[0], http.StatusAccepted, [3]float64{1, 0, 0}},
		{secrets[1], http.StatusAccepted, [3]float64{1, 1, 0}},
		{secrets[1], http.StatusAccepted, [3]float64{1, 2, 0}},
		{secrets[2], http.StatusUnauthorized, [3]float64{1, 2, 0}},
		{"never-configured", http.StatusUnauthorized, [3]float64{1, 2, 0}},
	} {
		r := post(tc.secret, fmt.Sprint("d", i))
		answers = append(answers, r.body)
		if r.code != tc.code {
			t.Errorf("signed with secret %q: answered %d %s, want %d", tc.secret, r.code, r.body, tc.code)
		}
		if got := [3]float64{matches("0"), matches("1"), matches("2")}; got != tc.want {
			t.Errorf("after a request signed with %q: matches by position %v, want %v", tc.secret, got, tc.want)
		}
	}
	logs := h.logs.String()
	for _, secret := range secrets {
		for _, text := range append(answers, logs) {
			if strings.Contains(text, secret) {
				t.Errorf("secret %q is in an answer or the log:\n%s", secret, text)
			}
		}
	}
	if !strings.Contains(logs, "does not match") {
		t.Errorf("the refusals are not logged:\n%s", logs)
	}
}

// storedNothing fails the test if the source stored anything: a ledger
// row, a frame or a raw object.
func (h *hookServer) storedNothing(t *testing.T) {
	t.Helper()
	var objects []string
	if err := h.raw.List(t.Context(), "", func(key string) error { objects = append(objects, key); return nil }); err != nil {
		t.Fatal(err)
	}
	if n := h.q.PendingEvents(); n != 0 || h.frames.events() != 0 || len(objects) != 0 {
		t.Errorf("stored %d events, %d in frames, raw objects %v; want nothing", n, h.frames.events(), objects)
	}
}

// TestWebhookSlackChallenge: Slack's url_verification is answered with its
// challenge after the signature check and not stored; a bad signature on
// it is refused; challenge = "none" stores it as an event.
func TestWebhookSlackChallenge(t *testing.T) {
	const secret = "8f742231b10e8888abcd99yyyzzz85a5"
	// The example of Slack's Events API url_verification page.
	const challenge = `{"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"}`
	sign := func(body string) []string {
		ts := fmt.Sprint(time.Now().Unix())
		return []string{"Content-Type", "application/json", "X-Slack-Request-Timestamp", ts,
			"X-Slack-Signature", "v0=" + pyHMAC(t, secret, []byte("v0:"+ts+":"+body))}
	}
	h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Signature, s.Secret = "slack", secret })
	r := send(t, http.MethodPost, h.url, challenge, sign(challenge)...)
	if want := `{"challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}`; r.code != http.StatusOK ||
		strings.TrimSpace(r.body) != want || r.header.Get("Content-Type") != "application/json" {
		t.Errorf("url_verification answered %d %q (Content-Type %q), want 200 %s as application/json", r.code, r.body, r.header.Get("Content-Type"), want)
	}
	bad := sign(challenge)
	bad[5] = "v0=" + strings.Repeat("00", 32)
	expect(t, send(t, http.MethodPost, h.url, challenge, bad...), http.StatusUnauthorized, "does not match")
	noChallenge := `{"type":"url_verification"}`
	expect(t, send(t, http.MethodPost, h.url, noChallenge, sign(noChallenge)...), http.StatusBadRequest, "url_verification without a challenge")
	h.storedNothing(t)
	// An event that only mentions url_verification is an event.
	event := `{"type":"event_callback","event":{"text":"url_verification"}}`
	expect(t, send(t, http.MethodPost, h.url, event, sign(event)...), http.StatusAccepted, `"status":"queued"`)

	off := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Signature, s.Secret, s.Challenge = "slack", secret, "none" })
	expect(t, send(t, http.MethodPost, off.url, challenge, sign(challenge)...), http.StatusAccepted, `"status":"queued"`)
}

// TestWebhookCRCChallenge: with challenge = "crc_sha256", GET
// ?crc_token=T is answered with "sha256=" + the base64 HMAC-SHA256 of T
// with the first secret still valid, and stores nothing.
func TestWebhookCRCChallenge(t *testing.T) {
	secrets := []string{"old-consumer-secret", "consumer-secret-0123", "next-consumer-secret"}
	h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) {
		s.Signature, s.SignatureHeader, s.Encoding, s.Prefix, s.Challenge = "hmac", "X-Twitter-Webhooks-Signature", "base64", "sha256=", "crc_sha256"
		s.Secrets = []sources.WebhookSecret{{Value: secrets[0], NotAfter: "2026-01-01T00:00:00Z"}, {Value: secrets[1]}, {Value: secrets[2]}}
	})
	const token = "d4b3c2a1-crc_token+/="
	r := send(t, http.MethodGet, h.url+"?crc_token="+url.QueryEscape(token), "")
	want := `{"response_token":"sha256=` + base64.StdEncoding.EncodeToString(pyMAC(t, []byte(secrets[1]), []byte(token))) + `"}`
	if r.code != http.StatusOK || strings.TrimSpace(r.body) != want || r.header.Get("Content-Type") != "application/json" {
		t.Errorf("CRC answered %d %q (Content-Type %q), want 200 %s", r.code, r.body, r.header.Get("Content-Type"), want)
	}
	// A token that could be a JSON body would make the answer a valid
	// signature of it: refused.
	expect(t, send(t, http.MethodGet, h.url+"?crc_token="+url.QueryEscape(`{"id":"forged"}`), ""), http.StatusBadRequest, "crc_token")
	expect(t, send(t, http.MethodGet, h.url+"?crc_token=", ""), http.StatusBadRequest, "crc_token")
	r = send(t, http.MethodGet, h.url, "")
	expect(t, r, http.StatusMethodNotAllowed, "crc_token")
	if r.header.Get("Allow") != "GET, POST" {
		t.Errorf("405 Allow = %q, want GET, POST", r.header.Get("Allow"))
	}
	h.storedNothing(t)

	// The X-style signature of a POST still works with the same secrets.
	body := `{"for_user_id":"2244994945","tweet_create_events":[]}`
	sig := "sha256=" + base64.StdEncoding.EncodeToString(pyMAC(t, []byte(secrets[2]), []byte(body)))
	expect(t, send(t, http.MethodPost, h.url, body, "X-Twitter-Webhooks-Signature", sig), http.StatusAccepted, `"status":"queued"`)

	// Without challenge = "crc_sha256", a GET is a 405.
	plain := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Signature, s.Secret = "github", secrets[1] })
	expect(t, send(t, http.MethodGet, plain.url+"?crc_token=abc", ""), http.StatusMethodNotAllowed, "POST")
	plain.storedNothing(t)
}
