package push

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/sources"
)

// headers returns an http.Header of name, value pairs.
func headers(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// verifierOf returns the verifier of a valid spec with the scheme and
// secret given.
func verifierOf(t *testing.T, scheme, secret string) verifier {
	t.Helper()
	v, err := newVerifier(webhookSpec(t, func(s *sources.WebhookSpec) { s.Signature, s.Secret = scheme, secret }))
	if err != nil || v == nil {
		t.Fatalf("no verifier for %q: %v", scheme, err)
	}
	return v
}

// TestGitHubPublishedVector checks the example of GitHub's "Validating
// webhook deliveries" page.
func TestGitHubPublishedVector(t *testing.T) {
	verify := verifierOf(t, "github", "It's a Secret to Everybody")
	const doc = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	if _, err := verify(headers("X-Hub-Signature-256", doc), []byte("Hello, World!"), time.Now()); err != nil {
		t.Errorf("GitHub's documented example refused: %v", err)
	}
	if _, err := verify(headers("X-Hub-Signature-256", doc), []byte("Hello, World?"), time.Now()); err != errSignatureMismatch {
		t.Errorf("a tampered body: %v, want %v", err, errSignatureMismatch)
	}
}

// slackVector is the worked example of Slack's "Verifying requests from
// Slack" page: a slash command's form-encoded body.
var slackVector = struct {
	secret, ts, sig string
	body            []byte
}{
	secret: "8f742231b10e8888abcd99yyyzzz85a5",
	ts:     "1531420618",
	sig:    "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
	body: []byte("token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V" +
		"&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=" +
		"&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN" +
		"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"),
}

// TestSlackPublishedVector checks Slack's worked example at its own time,
// and its tolerance both ways.
func TestSlackPublishedVector(t *testing.T) {
	v := slackVector
	h := headers("X-Slack-Request-Timestamp", v.ts, "X-Slack-Signature", v.sig)
	at := time.Unix(1531420618, 0)
	for _, tc := range []struct {
		now time.Time
		ok  bool
	}{
		{at, true},
		{at.Add(5 * time.Minute), true},
		{at.Add(-5 * time.Minute), true},
		{at.Add(5*time.Minute + time.Second), false},
		{at.Add(-5*time.Minute - time.Second), false},
	} {
		_, err := checkSlack(h, keyring{{Key: []byte(v.secret)}}, v.body, tc.now, 5*time.Minute)
		if (err == nil) != tc.ok {
			t.Errorf("at %+ds from the timestamp: %v, want ok %v", tc.now.Unix()-at.Unix(), err, tc.ok)
		}
	}
	if _, err := checkSlack(h, keyring{{Key: []byte(v.secret)}}, append(v.body, '&'), at, 5*time.Minute); err != errSignatureMismatch {
		t.Errorf("a tampered body: %v, want %v", err, errSignatureMismatch)
	}
}

// standardVector is the vector of the Standard Webhooks Go library's
// TestWebhookSign.
var standardVector = struct {
	secret, id, ts, sig string
	body                []byte
}{
	secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
	id:     "msg_p5jXN8AQM9LWM0D4loKWxJek",
	ts:     "1614265330",
	sig:    "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
	body:   []byte(`{"test": 2432232314}`),
}

// TestStandardPublishedVector checks the Standard Webhooks vector, its
// tolerance both ways, a list of signatures and malformed entries.
func TestStandardPublishedVector(t *testing.T) {
	v := standardVector
	at := time.Unix(1614265330, 0)
	sig := func(s string) http.Header {
		return headers("webhook-id", v.id, "webhook-timestamp", v.ts, "webhook-signature", s)
	}
	for _, secret := range []string{v.secret, v.secret[len("whsec_"):]} {
		verify := verifierOf(t, "standard", secret)
		for _, tc := range []struct {
			name string
			now  time.Time
			ok   bool
		}{
			{"at the timestamp", at, true},
			{"5m after", at.Add(5 * time.Minute), true},
			{"5m before", at.Add(-5 * time.Minute), true},
			{"5m1s after", at.Add(5*time.Minute + time.Second), false},
			{"5m1s before", at.Add(-5*time.Minute - time.Second), false},
		} {
			if _, err := verify(sig(v.sig), v.body, tc.now); (err == nil) != tc.ok {
				t.Errorf("secret %q, now %s: %v, want ok %v", secret, tc.name, err, tc.ok)
			}
		}
	}
	verify := verifierOf(t, "standard", v.secret)
	wrong := "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4="
	for _, tc := range []struct {
		header string
		err    string // "" for none
	}{
		{wrong + " " + v.sig, ""},
		{"v1a,xyz v2," + v.sig[3:] + "  " + v.sig, ""},
		{wrong, errSignatureMismatch.Error()},
		{"v1,", "has no valid v1 signature"},
		{"v1, v1,!!!", "has no valid v1 signature"},
		{"v2," + v.sig[3:], "has no valid v1 signature"},
		{"", "missing the webhook-signature header"},
	} {
		_, err := verify(sig(tc.header), v.body, at)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("webhook-signature %q: %v, want %q", tc.header, err, tc.err)
		}
	}
	if _, err := verify(sig(v.sig), append(v.body, ' '), at); err != errSignatureMismatch {
		t.Errorf("a tampered body: %v, want %v", err, errSignatureMismatch)
	}
	for _, tc := range []struct {
		h   http.Header
		err string
	}{
		{headers("webhook-timestamp", v.ts, "webhook-signature", v.sig), "missing the webhook-id header"},
		{headers("webhook-id", v.id, "webhook-signature", v.sig), "missing the webhook-timestamp header"},
		{headers("webhook-id", v.id, "webhook-timestamp", "soon", "webhook-signature", v.sig), "webhook-timestamp header is not a Unix time"},
	} {
		if _, err := verify(tc.h, v.body, at); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("headers %v: %v, want %q", tc.h, err, tc.err)
		}
	}
}

// TestStripeTolerancePastOnly: a Stripe timestamp older than the tolerance
// is refused, a future one passes, as Stripe's libraries do.
func TestStripeTolerancePastOnly(t *testing.T) {
	secret, body := []byte("whsec_test"), []byte(`{"id":"evt_1"}`)
	at := time.Unix(1700000000, 0)
	header := fmt.Sprintf("t=%d,v1=%x", at.Unix(), pyMAC(t, secret, fmt.Appendf(nil, "%d.%s", at.Unix(), body)))
	for _, tc := range []struct {
		name string
		now  time.Time
		ok   bool
	}{
		{"5m after", at.Add(5 * time.Minute), true},
		{"5m1s after", at.Add(5*time.Minute + time.Second), false},
		{"1h before", at.Add(-time.Hour), true},
	} {
		if _, err := checkStripe(header, keyring{{Key: secret}}, body, tc.now, 5*time.Minute); (err == nil) != tc.ok {
			t.Errorf("now %s the timestamp: %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestHMACScheme checks signature = "hmac" against published vectors (RFC
// 2202 for SHA-1, GitHub's example for SHA-256, RFC 4231 for SHA-512) and
// against Python's hmac module for each algorithm and encoding.
func TestHMACScheme(t *testing.T) {
	hmacVerifier := func(set func(*sources.WebhookSpec)) verifier {
		t.Helper()
		v, err := newVerifier(webhookSpec(t, func(s *sources.WebhookSpec) {
			s.Signature, s.SignatureHeader = "hmac", "X-Sig"
			set(s)
		}))
		if err != nil || v == nil {
			t.Fatalf("no hmac verifier: %v", err)
		}
		return v
	}
	now := time.Now()
	for _, tc := range []struct{ alg, secret, body, sig string }{
		{"sha1", "Jefe", "what do ya want for nothing?", "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"},
		{"", "It's a Secret to Everybody", "Hello, World!", "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"},
		{"sha512", "Jefe", "what do ya want for nothing?",
			"164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"},
	} {
		verify := hmacVerifier(func(s *sources.WebhookSpec) { s.Secret, s.Algorithm = tc.secret, tc.alg })
		if _, err := verify(headers("X-Sig", tc.sig), []byte(tc.body), now); err != nil {
			t.Errorf("algorithm %q: the published vector is refused: %v", tc.alg, err)
		}
		if _, err := verify(headers("X-Sig", tc.sig), []byte(tc.body+" "), now); err != errSignatureMismatch {
			t.Errorf("algorithm %q: a tampered body: %v, want %v", tc.alg, err, errSignatureMismatch)
		}
	}

	const secret = "hmac-secret-0123"
	body := []byte(`{"id":"evt_1"}`)
	for _, alg := range []string{"sha1", "sha256", "sha512"} {
		sum := pyMACWith(t, alg, []byte(secret), body)
		other := pyMACWith(t, map[string]string{"sha1": "sha256", "sha256": "sha512", "sha512": "sha1"}[alg], []byte(secret), body)
		for _, enc := range []string{"hex", "base64"} {
			encode := hex.EncodeToString
			if enc == "base64" {
				encode = base64.StdEncoding.EncodeToString
			}
			verify := hmacVerifier(func(s *sources.WebhookSpec) { s.Secret, s.Algorithm, s.Encoding = secret, alg, enc })
			for _, tc := range []struct {
				name, sig string
				body      []byte
				err       string // "" for none
			}{
				{"python's", encode(sum), body, ""},
				{"a tampered body", encode(sum), append(body, ' '), errSignatureMismatch.Error()},
				{"another algorithm", encode(other), body, errSignatureMismatch.Error()},
				// A hex digest is valid base64, of other bytes.
				{"the other encoding", map[string]string{"hex": base64.StdEncoding.EncodeToString(sum), "base64": hex.EncodeToString(sum)}[enc], body,
					map[string]string{"hex": "not hex", "base64": errSignatureMismatch.Error()}[enc]},
				{"none", "", body, "missing the X-Sig header"},
			} {
				_, err := verify(headers("X-Sig", tc.sig), tc.body, now)
				if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
					t.Errorf("%s %s, %s signature: %v, want %q", alg, enc, tc.name, err, tc.err)
				}
			}
		}
	}

	// A prefix, when set, is required; hmac_sha256 keeps "sha256=" optional.
	hexSum := hex.EncodeToString(pyMACWith(t, "sha256", []byte(secret), body))
	verify := hmacVerifier(func(s *sources.WebhookSpec) { s.Secret, s.Prefix = secret, "sha256=" })
	if _, err := verify(headers("X-Sig", "sha256="+hexSum), body, now); err != nil {
		t.Errorf("with its prefix: %v", err)
	}
	if _, err := verify(headers("X-Sig", hexSum), body, now); err == nil || !strings.Contains(err.Error(), `does not start with "sha256="`) {
		t.Errorf("without its prefix: %v, want refused", err)
	}
	alias := hmacVerifier(func(s *sources.WebhookSpec) { s.Signature, s.Secret = "hmac_sha256", secret })
	for _, sig := range []string{hexSum, "sha256=" + hexSum, strings.ToUpper(hexSum)} {
		if _, err := alias(headers("X-Sig", sig), body, now); err != nil {
			t.Errorf("hmac_sha256 with %q: %v", sig, err)
		}
	}

	// signed_content over {id}, {timestamp} and {body}; the timestamp
	// within signature_tolerance either way.
	verify = hmacVerifier(func(s *sources.WebhookSpec) {
		s.Secret, s.Algorithm, s.Encoding, s.Prefix = secret, "sha512", "base64", "v1="
		s.SignedContent, s.TimestampHeader, s.IDHeader = "v1:{id}:{timestamp}:{body}", "X-Ts", "X-Id"
	})
	at := time.Unix(1700000000, 0)
	sig := "v1=" + base64.StdEncoding.EncodeToString(pyMACWith(t, "sha512", []byte(secret), fmt.Appendf(nil, "v1:msg_1:%d:%s", at.Unix(), body)))
	signed := headers("X-Sig", sig, "X-Ts", fmt.Sprint(at.Unix()), "X-Id", "msg_1")
	for _, tc := range []struct {
		name string
		h    http.Header
		now  time.Time
		body []byte
		err  string
	}{
		{"at the timestamp", signed, at, body, ""},
		{"5m after", signed, at.Add(5 * time.Minute), body, ""},
		{"5m before", signed, at.Add(-5 * time.Minute), body, ""},
		{"5m1s after", signed, at.Add(5*time.Minute + time.Second), body, "beyond the 5m0s tolerance"},
		{"5m1s before", signed, at.Add(-5*time.Minute - time.Second), body, "beyond the 5m0s tolerance"},
		{"a tampered body", signed, at, append(body, ' '), errSignatureMismatch.Error()},
		{"another id", headers("X-Sig", sig, "X-Ts", fmt.Sprint(at.Unix()), "X-Id", "msg_2"), at, body, errSignatureMismatch.Error()},
		{"another timestamp", headers("X-Sig", sig, "X-Ts", fmt.Sprint(at.Unix()+1), "X-Id", "msg_1"), at, body, errSignatureMismatch.Error()},
		{"no timestamp", headers("X-Sig", sig, "X-Id", "msg_1"), at, body, "missing the X-Ts header"},
		{"a timestamp not a number", headers("X-Sig", sig, "X-Ts", "soon", "X-Id", "msg_1"), at, body, "the X-Ts header is not a Unix time"},
		{"no id", headers("X-Sig", sig, "X-Ts", fmt.Sprint(at.Unix())), at, body, "missing the X-Id header"},
	} {
		_, err := verify(tc.h, tc.body, tc.now)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("signed content, %s: %v, want %q", tc.name, err, tc.err)
		}
	}
}

// signedHeaders returns the headers of a request signed with key (the raw
// HMAC key) under scheme at now, the MAC computed by Python's hmac module;
// hmac's signature_header is X-Sig.
func signedHeaders(t *testing.T, scheme string, key, body []byte, now time.Time) http.Header {
	t.Helper()
	ts := fmt.Sprint(now.Unix())
	switch scheme {
	case "github":
		return headers("X-Hub-Signature-256", "sha256="+hex.EncodeToString(pyMAC(t, key, body)))
	case "shopify":
		return headers("X-Shopify-Hmac-SHA256", base64.StdEncoding.EncodeToString(pyMAC(t, key, body)))
	case "hmac":
		return headers("X-Sig", hex.EncodeToString(pyMAC(t, key, body)))
	case "stripe":
		return headers("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(pyMAC(t, key, []byte(ts+"."+string(body)))))
	case "slack":
		return headers("X-Slack-Request-Timestamp", ts, "X-Slack-Signature", "v0="+hex.EncodeToString(pyMAC(t, key, []byte("v0:"+ts+":"+string(body)))))
	case "standard":
		return headers("webhook-id", "msg_1", "webhook-timestamp", ts,
			"webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(pyMAC(t, key, []byte("msg_1."+ts+"."+string(body)))))
	}
	t.Fatalf("no signer for %q", scheme)
	return nil
}

// TestSecretRotation: with secrets, every scheme passes a request signed
// with any of them, tells which position matched, and refuses one signed
// with a secret past its not_after or with none of them.
func TestSecretRotation(t *testing.T) {
	now := time.Now()
	body := []byte(`{"id":"evt_1"}`)
	keys := [][]byte{[]byte("new-secret-0123"), []byte("old-secret-4567"), []byte("gone-secret-89ab"), []byte("never-configured")}
	for _, scheme := range []string{"github", "stripe", "slack", "standard", "shopify", "hmac"} {
		secret := func(k []byte) string {
			if scheme == "standard" {
				return "whsec_" + base64.StdEncoding.EncodeToString(k)
			}
			return string(k)
		}
		v, err := newVerifier(webhookSpec(t, func(s *sources.WebhookSpec) {
			s.Signature = scheme
			if scheme == "hmac" {
				s.SignatureHeader = "X-Sig"
			}
			s.Secrets = []sources.WebhookSecret{{Value: secret(keys[0])},
				{Value: secret(keys[1]), NotAfter: now.Add(time.Hour).Format(time.RFC3339)},
				{Value: secret(keys[2]), NotAfter: now.Add(-time.Second).Format(time.RFC3339)}}
		}))
		if err != nil || v == nil {
			t.Fatalf("%s: no verifier: %v", scheme, err)
		}
		for i, want := range []int{0, 1, -1, -1} {
			m, err := v(signedHeaders(t, scheme, keys[i], body, now), body, now)
			var signedAt int64 // the signed time of the verdict
			if scheme == "stripe" || scheme == "slack" || scheme == "standard" {
				signedAt = now.Unix()
			}
			switch {
			case want >= 0 && (err != nil || m.secret != want || m.signedAt != signedAt):
				t.Errorf("%s, signed with secret %d: %+v, %v; want position %d signed at %d", scheme, i, m, err, want, signedAt)
			case want < 0 && err != errSignatureMismatch:
				t.Errorf("%s, signed with secret %d (past its not_after, or not configured): %v, want %v", scheme, i, err, errSignatureMismatch)
			}
		}
	}
}
