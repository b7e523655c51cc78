package push

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/sources"
)

// statusOf looks an event up by id and by idempotency key and returns the
// answer's verification object, or nil when it has none; both look-ups
// must answer the same.
func statusOf(t *testing.T, h *hookServer, id int64, key string) map[string]any {
	t.Helper()
	var got []map[string]any
	for _, url := range []string{h.url + "/events/" + strconv.FormatInt(id, 10), h.url + "/events?idempotency_key=" + key} {
		r := send(t, http.MethodGet, url, "")
		expect(t, r, http.StatusOK, `"idempotency_key":"`+key+`"`)
		var a map[string]any
		if err := json.Unmarshal([]byte(r.body), &a); err != nil {
			t.Fatal(err)
		}
		v, _ := a["verification"].(map[string]any)
		if _, ok := a["verification"]; ok && v == nil {
			t.Fatalf("GET %s: verification %v is not an object", url, a["verification"])
		}
		got = append(got, v)
	}
	if (got[0] == nil) != (got[1] == nil) || got[0] != nil && got[0]["received_at"] != got[1]["received_at"] {
		t.Fatalf("the look-ups by id and by key differ: %v and %v", got[0], got[1])
	}
	return got[0]
}

// TestWebhookVerdictInStatus: an event of a signed source answers, in its
// status look-up, the scheme, the position of the secret that matched, the
// signed time (Slack signs one, GitHub none) and when it was received; an
// event of an unsigned source answers no verification.
func TestWebhookVerdictInStatus(t *testing.T) {
	secrets := []string{"new-secret-0123", "old-secret-4567"}
	slack := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) {
		s.Signature, s.Secrets = "slack", []sources.WebhookSecret{{Value: secrets[0]}, {Value: secrets[1]}}
	})
	signedAt := time.Now().Add(-time.Minute).Truncate(time.Second)
	body := []byte(`{"id":"ev-slack"}`)
	sig := signedHeaders(t, "slack", []byte(secrets[1]), body, signedAt)
	before := time.Now()
	r := send(t, http.MethodPost, slack.url, string(body), "Idempotency-Key", "ev-slack",
		"X-Slack-Request-Timestamp", sig.Get("X-Slack-Request-Timestamp"), "X-Slack-Signature", sig.Get("X-Slack-Signature"))
	expect(t, r, http.StatusAccepted, `"status":"queued"`)
	if strings.Contains(r.body, "verification") {
		t.Errorf("the ingest answer %s holds the verification; only the look-up does", r.body)
	}
	v := statusOf(t, slack, r.event(t).ID, "ev-slack")
	at, _ := v["received_at"].(string)
	received, err := time.Parse(time.RFC3339Nano, at)
	if v["scheme"] != "slack" || v["secret"] != 1.0 || v["signed_at"] != signedAt.UTC().Format(time.RFC3339) ||
		err != nil || received.Before(before.Add(-time.Second)) || received.After(time.Now()) {
		t.Errorf("verification %v, want slack, secret 1, signed at %s, received about now (%v)", v, signedAt.UTC().Format(time.RFC3339), err)
	}

	github := startHooks(t, 1_000_000, func(s *sources.WebhookSpec) { s.Signature, s.Secret = "github", secrets[0] })
	r = send(t, http.MethodPost, github.url, `{"n":1}`, "X-Hub-Signature-256", "sha256="+pyHMAC(t, secrets[0], []byte(`{"n":1}`)), "X-GitHub-Delivery", "d-1")
	expect(t, r, http.StatusAccepted, `"status":"queued"`)
	v = statusOf(t, github, r.event(t).ID, "d-1")
	if _, signed := v["signed_at"]; v["scheme"] != "github" || v["secret"] != 0.0 || signed || v["received_at"] == nil {
		t.Errorf("github verification %v, want github, secret 0, no signed_at, a received_at", v)
	}

	plain := startHooks(t, 1_000_000, nil)
	r = send(t, http.MethodPost, plain.url, `{"n":1}`, "Idempotency-Key", "p-1")
	expect(t, r, http.StatusAccepted, `"status":"queued"`)
	if v := statusOf(t, plain, r.event(t).ID, "p-1"); v != nil {
		t.Errorf("an unsigned source's event answers verification %v, want none", v)
	}
}
