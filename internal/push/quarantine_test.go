package push

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/sources"
)

// quarantined waits until the quarantine of source holds an entry of the
// request reqID and returns it, body included.
func quarantined(t *testing.T, q *queue.Queue, source, reqID string) queue.Rejected {
	t.Helper()
	var id int64
	testsync.WaitFor(t, "request "+reqID+" of "+source+" in the quarantine", 10*time.Second, func() bool {
		list, err := q.QuarantineList(t.Context(), source, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list {
			if e.RequestID == reqID {
				id = e.ID
				return true
			}
		}
		return false
	})
	e, err := q.Quarantined(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestWebhookQuarantine refuses a delivery for each reason, over real TLS
// connections, and finds each in the quarantine with its reason, code,
// request id, method and path, its secret headers redacted (the secrets
// nowhere in the rows, their JSON or the log) and its body capped at
// quarantine_body_bytes, also for a body over max_body_bytes, which is
// not read further; valid requests are stored and not quarantined.
func TestWebhookQuarantine(t *testing.T) {
	const (
		token     = "0123456789abcdef-token"
		wrong     = "wrong-token-SECRET-0001"
		sigSecret = "github-SECRET-0002"
		apiKey    = "api-key-SECRET-0003"
		cookie    = "session=SECRET-0004"
		custom    = "custom-auth-SECRET-0005"
	)
	pki := testsync.NewPKI(t)
	in, q, _, _ := openInbox(t, 1_000_000)
	logs, m := &testsync.LockedBuffer{}, NewMetrics(nil)
	srcs := []config.Source{
		hook(t, "tok", func(s *sources.WebhookSpec) {
			s.Token, s.RequiredFields, s.MaxBodyBytes, s.QuarantineBodyBytes = token, []string{"type"}, 200, 64
		}),
		hook(t, "sig", func(s *sources.WebhookSpec) { s.Signature, s.Secret = "github", sigSecret }),
		hook(t, "slack", func(s *sources.WebhookSpec) { s.Signature, s.Secret = "slack", sigSecret }),
		hook(t, "far", func(s *sources.WebhookSpec) { s.AllowCIDRs = []string{"10.0.0.0/8"} }),
		hook(t, "mtls", func(s *sources.WebhookSpec) { s.RequireClientCert = true }),
		hook(t, "off", func(s *sources.WebhookSpec) { s.Token, s.QuarantineSize = token, 0 }),
	}
	srv := startServer(t, ServerOptions{Push: config.Push{Addr: "127.0.0.1:0", TLSCertFile: pki.ServerCertFile, TLSKeyFile: pki.ServerKeyFile,
		ClientCAFile: pki.CAFile}, Sources: srcs, Inbox: in, Metrics: m,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	base := "https://" + srv.Addr() + "/ingest/"
	tlsClient := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.CAs, Certificates: certs}}}
	}
	c, noCert := tlsClient(pki.Client), tlsClient()
	t.Cleanup(c.CloseIdleConnections)
	t.Cleanup(noCert.CloseIdleConnections)
	bearer := "Bearer " + token

	stale := time.Now().Add(-time.Hour)
	staleSig := signedHeaders(t, "slack", []byte(sigSecret), []byte(`{"id":"s"}`), stale)
	cases := []struct {
		reqID, source, reason string
		code                  int
		send                  func(reqID string) reply
		body                  string // the body kept
		truncated             bool
	}{
		{"r-missing-token", "tok", "missing_token", 401, func(id string) reply {
			return sendWith(t, c, "POST", base+"tok", strings.NewReader(`{"type":"x"}`), "X-Request-ID", id)
		}, "", true},
		{"r-bad-token", "tok", "bad_token", 403, func(id string) reply {
			return sendWith(t, c, "POST", base+"tok", strings.NewReader(`{"type":"x"}`), "X-Request-ID", id, "Authorization", "Bearer "+wrong,
				"X-Api-Key", apiKey, "Cookie", cookie, "X-Custom-Auth", custom)
		}, "", true},
		{"r-content-type", "tok", "content_type", 415, func(id string) reply {
			return sendWith(t, c, "POST", base+"tok", strings.NewReader(`{"type":"x"}`), "X-Request-ID", id, "Authorization", bearer, "Content-Type", "text/plain")
		}, "", true},
		{"r-invalid-json", "tok", "invalid_body", 400, func(id string) reply {
			return sendWith(t, c, "POST", base+"tok", strings.NewReader(`{"type":`), "X-Request-ID", id, "Authorization", bearer)
		}, `{"type":`, false},
		{"r-missing-field", "tok", "invalid_body", 400, func(id string) reply {
			return sendWith(t, c, "POST", base+"tok", strings.NewReader(`{"kind":"x","pad":"`+strings.Repeat("p", 100)+`"}`), "X-Request-ID", id, "Authorization", bearer)
		}, (`{"kind":"x","pad":"` + strings.Repeat("p", 100))[:64], true},
		{"r-too-large-declared", "tok", "too_large", 413, func(id string) reply {
			return sendWith(t, c, "POST", base+"tok", strings.NewReader(strings.Repeat("a", 500)), "X-Request-ID", id, "Authorization", bearer)
		}, "", true},
		{"r-too-large-chunked", "tok", "too_large", 413, func(id string) reply {
			return sendWith(t, c, "POST", base+"tok", io.MultiReader(strings.NewReader(strings.Repeat("b", 500))), "X-Request-ID", id, "Authorization", bearer)
		}, strings.Repeat("b", 64), true},
		{"r-method", "tok", "method", 405, func(id string) reply {
			return sendWith(t, c, "PUT", base+"tok", strings.NewReader(`{}`), "X-Request-ID", id, "Authorization", bearer)
		}, "", true},
		{"r-missing-sig", "sig", "missing_signature", 401, func(id string) reply {
			return sendWith(t, c, "POST", base+"sig", strings.NewReader(`{"id":"1"}`), "X-Request-ID", id)
		}, `{"id":"1"}`, false},
		{"r-bad-sig", "sig", "bad_signature", 401, func(id string) reply {
			return sendWith(t, c, "POST", base+"sig", strings.NewReader(`{"id":"1"}`), "X-Request-ID", id, "X-Hub-Signature-256", "sha256="+strings.Repeat("0", 64))
		}, `{"id":"1"}`, false},
		{"r-stale", "slack", "stale_timestamp", 401, func(id string) reply {
			return sendWith(t, c, "POST", base+"slack", strings.NewReader(`{"id":"s"}`), "X-Request-ID", id,
				"X-Slack-Request-Timestamp", staleSig.Get("X-Slack-Request-Timestamp"), "X-Slack-Signature", staleSig.Get("X-Slack-Signature"))
		}, `{"id":"s"}`, false},
		{"r-cidr", "far", "cidr", 403, func(id string) reply {
			return sendWith(t, c, "POST", base+"far", strings.NewReader(`{"id":"1"}`), "X-Request-ID", id)
		}, "", true},
		{"r-client-cert", "mtls", "client_cert", 403, func(id string) reply {
			return sendWith(t, noCert, "POST", base+"mtls", strings.NewReader(`{"id":"1"}`), "X-Request-ID", id)
		}, "", true},
	}
	for _, tc := range cases {
		r := tc.send(tc.reqID)
		if r.code != tc.code {
			t.Fatalf("%s: answered %d %s, want %d", tc.reqID, r.code, r.body, tc.code)
		}
		e := quarantined(t, q, tc.source, tc.reqID)
		path := "/ingest/" + tc.source
		if e.Reason != tc.reason || e.Code != tc.code || e.Method == "" || e.Path != path || e.Remote == "" || e.At.IsZero() || e.Detail == "" {
			t.Errorf("%s: quarantined %+v, want reason %s, code %d, path %s", tc.reqID, e, tc.reason, tc.code, path)
		}
		if string(e.Body) != tc.body || e.Truncated != tc.truncated {
			t.Errorf("%s: kept body %q (truncated %v), want %q (truncated %v)", tc.reqID, e.Body, e.Truncated, tc.body, tc.truncated)
		}
		if got := metricValue(t, m.rejected.WithLabelValues(tc.source, tc.reason)); got < 1 {
			t.Errorf("%s: ingestor_webhook_rejected_total{%s,%s} = %v", tc.reqID, tc.source, tc.reason, got)
		}
	}

	// The secrets are redacted, in the row and its JSON, and not logged.
	e := quarantined(t, q, "tok", "r-bad-token")
	for _, name := range []string{"Authorization", "X-Api-Key", "Cookie", "X-Custom-Auth"} {
		if v := e.Headers[name]; len(v) != 1 || v[0] != "[redacted]" {
			t.Errorf("header %s kept as %q, want [redacted]", name, v)
		}
	}
	if v := e.Headers["X-Request-Id"]; len(v) != 1 || v[0] != "r-bad-token" {
		t.Errorf("header X-Request-Id kept as %q, want it as sent", v)
	}
	sig := quarantined(t, q, "sig", "r-bad-sig")
	if v := sig.Headers["X-Hub-Signature-256"]; len(v) != 1 || v[0] != "[redacted]" {
		t.Errorf("signature header kept as %q", v)
	}
	all, err := q.QuarantineList(t.Context(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := json.Marshal(append(all, e, sig, quarantined(t, q, "slack", "r-stale")))
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{token, wrong, sigSecret, apiKey, cookie, custom, strings.Repeat("0", 64), staleSig.Get("X-Slack-Signature")} {
		if strings.Contains(string(rows), secret) || strings.Contains(logs.String(), secret) {
			t.Errorf("secret %q is in the quarantine's JSON or the log", secret)
		}
	}

	// Valid requests are stored and not quarantined; a source with
	// quarantine_size = 0 counts its refusals and keeps none.
	before := len(all)
	for i := range 5 {
		expect(t, sendWith(t, c, "POST", base+"tok", strings.NewReader(fmt.Sprintf(`{"type":"x","n":%d}`, i)), "X-Request-ID", "ok-"+strconv.Itoa(i),
			"Authorization", bearer, "Content-Type", "application/json"), http.StatusAccepted, `"status":"queued"`)
	}
	expect(t, sendWith(t, c, "POST", base+"off", strings.NewReader(`{}`), "X-Request-ID", "r-off"), http.StatusUnauthorized, "missing Authorization")
	expect(t, sendWith(t, c, "POST", base+"tok", strings.NewReader(`{`), "X-Request-ID", "r-last", "Authorization", bearer), http.StatusBadRequest, "")
	quarantined(t, q, "tok", "r-last")
	if all, err = q.QuarantineList(t.Context(), "", 1000); err != nil || len(all) != before+1 {
		t.Errorf("quarantine holds %d entries (err %v), want %d + r-last only", len(all), err, before)
	}
	if got := metricValue(t, m.rejected.WithLabelValues("off", "missing_token")); got != 1 {
		t.Errorf("rejected{off,missing_token} = %v, want 1", got)
	}
	if n := q.PendingEvents(); n != 5 {
		t.Errorf("%d events stored, want the 5 valid ones", n)
	}
}

// TestWebhookQuarantineFlood sends many more bad deliveries than
// quarantine_size: the source keeps its newest quarantine_size, the
// oldest dropped, while a source beside it keeps its own.
func TestWebhookQuarantineFlood(t *testing.T) {
	const size, sent = 7, 60
	h := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Signature, s.Secret, s.QuarantineSize = "github", "s3cret-flood", size })
	for i := range sent {
		expect(t, send(t, http.MethodPost, h.url, `{"n":`+strconv.Itoa(i)+`}`, "X-Request-ID", "flood-"+strconv.Itoa(i)), http.StatusUnauthorized, "bad signature")
	}
	quarantined(t, h.q, "hooks", "flood-"+strconv.Itoa(sent-1))
	list, err := h.q.QuarantineList(t.Context(), "hooks", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != size {
		t.Fatalf("the quarantine keeps %d entries, want quarantine_size %d", len(list), size)
	}
	for i, e := range list {
		if want := "flood-" + strconv.Itoa(sent-1-i); e.RequestID != want {
			t.Errorf("entry %d is %s, want %s (newest first, the oldest dropped)", i, e.RequestID, want)
		}
	}
	if got := metricValue(t, h.metrics.rejected.WithLabelValues("hooks", "missing_signature")); got != sent {
		t.Errorf("rejected{hooks,missing_signature} = %v, want %d", got, sent)
	}
}

// TestQuarantineDropsWhenFull: put never waits; with the buffer full a
// delivery is dropped and counted.
func TestQuarantineDropsWhenFull(t *testing.T) {
	m := NewMetrics(nil)
	// No writer runs: the buffer only fills.
	k := &quarantine{ch: make(chan queue.Rejected, 2), dropped: m.quarantineDropped}
	for range 5 {
		k.put(queue.Rejected{Source: "hooks"})
	}
	if got := metricValue(t, m.quarantineDropped.WithLabelValues("hooks")); got != 3 || len(k.ch) != 2 {
		t.Errorf("dropped %v with %d buffered, want 3 dropped and 2 buffered", got, len(k.ch))
	}
}
