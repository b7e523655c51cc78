package push

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/sources"
)

// bearer checks the bearer token of a request.
type bearer struct {
	// sum is the SHA-256 of the token: comparing digests takes the same
	// time whatever the length of the token sent.
	sum [sha256.Size]byte
}

// The outcomes of bearer.check.
const (
	authOK = iota
	authMissing
	authWrong
)

// check reports whether r carries the token: authMissing without an
// Authorization: Bearer header, authWrong with another token.
func (b *bearer) check(r *http.Request) int {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return authMissing
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if subtle.ConstantTimeCompare(sum[:], b.sum[:]) != 1 {
		return authWrong
	}
	return authOK
}

// verifier checks the signature of a request; its error says why a
// request is refused, in words for the sender, and never holds the secret.
type verifier func(h http.Header, body []byte, now time.Time) error

// newVerifier returns the verifier of spec's signature scheme, or nil when
// it has none.
func newVerifier(spec *sources.WebhookSpec) (verifier, error) {
	secret, err := spec.SigningKey()
	if err != nil {
		return nil, fmt.Errorf("secret: %w", err)
	}
	tolerance := spec.Tolerance()
	switch spec.Signature {
	case sources.SignatureGitHub:
		return func(h http.Header, body []byte, _ time.Time) error {
			return checkBodyMAC(h, "X-Hub-Signature-256", "sha256=", true, "hex", secret, body)
		}, nil
	case sources.SignatureHMACSHA256:
		name := spec.SignatureHeader
		return func(h http.Header, body []byte, _ time.Time) error {
			return checkBodyMAC(h, name, "sha256=", false, "hex", secret, body)
		}, nil
	case sources.SignatureShopify:
		return func(h http.Header, body []byte, _ time.Time) error {
			return checkBodyMAC(h, "X-Shopify-Hmac-SHA256", "", false, "base64", secret, body)
		}, nil
	case sources.SignatureStripe:
		return func(h http.Header, body []byte, now time.Time) error {
			return checkStripe(h.Get("Stripe-Signature"), secret, body, now, tolerance)
		}, nil
	case sources.SignatureSlack:
		return func(h http.Header, body []byte, now time.Time) error {
			return checkSlack(h, secret, body, now, tolerance)
		}, nil
	case sources.SignatureStandard:
		return func(h http.Header, body []byte, now time.Time) error {
			return checkStandard(h, secret, body, now, tolerance)
		}, nil
	}
	return nil, nil
}

// mac returns the HMAC-SHA256 of the parts with secret.
func mac(secret []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, secret)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

var errSignatureMismatch = errors.New("the signature does not match the body")

// checkBodyMAC checks that header name holds the HMAC-SHA256 of body in
// encoding ("hex", either case, or "base64", standard and padded), after
// prefix (which must be there when required).
func checkBodyMAC(h http.Header, name, prefix string, required bool, encoding string, secret, body []byte) error {
	v := h.Get(name)
	if v == "" {
		return fmt.Errorf("missing the %s header", name)
	}
	sig, ok := strings.CutPrefix(v, prefix)
	if !ok && required {
		return fmt.Errorf("the %s header does not start with %q", name, prefix)
	}
	decode := hex.DecodeString
	if encoding == "base64" {
		decode = base64.StdEncoding.DecodeString
	}
	got, err := decode(sig)
	if err != nil {
		return fmt.Errorf("the %s header is not %s", name, encoding)
	}
	if !hmac.Equal(got, mac(secret, body)) {
		return errSignatureMismatch
	}
	return nil
}

// checkStripe checks a Stripe-Signature header, "t=TS,v1=SIG[,v1=SIG...]":
// one v1 must be the HMAC-SHA256 of "TS.body", and TS no older than
// tolerance (Stripe's own libraries refuse only old timestamps).
func checkStripe(header string, secret, body []byte, now time.Time, tolerance time.Duration) error {
	if header == "" {
		return errors.New("missing the Stripe-Signature header")
	}
	var ts string
	var sigs [][]byte
	for item := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(item), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			if sig, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("the Stripe-Signature header has no valid timestamp t=")
	}
	if len(sigs) == 0 {
		return errors.New("the Stripe-Signature header has no v1 signature")
	}
	want := mac(secret, []byte(ts), []byte("."), body)
	match := false
	for _, sig := range sigs {
		match = hmac.Equal(sig, want) || match
	}
	if !match {
		return errSignatureMismatch
	}
	if age := now.Sub(time.Unix(t, 0)); age > tolerance {
		return fmt.Errorf("the signature timestamp is %s old, beyond the %s tolerance", age.Truncate(time.Second), tolerance)
	}
	return nil
}

// checkSlack checks X-Slack-Signature, "v0=" + the hex HMAC-SHA256 of
// "v0:TS:body" with TS the X-Slack-Request-Timestamp, which must be within
// tolerance of now either way.
func checkSlack(h http.Header, secret, body []byte, now time.Time, tolerance time.Duration) error {
	ts := h.Get("X-Slack-Request-Timestamp")
	if ts == "" {
		return errors.New("missing the X-Slack-Request-Timestamp header")
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("the X-Slack-Request-Timestamp header is not a Unix time")
	}
	v := h.Get("X-Slack-Signature")
	if v == "" {
		return errors.New("missing the X-Slack-Signature header")
	}
	sig, ok := strings.CutPrefix(v, "v0=")
	if !ok {
		return errors.New(`the X-Slack-Signature header does not start with "v0="`)
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return errors.New("the X-Slack-Signature header is not hex")
	}
	if !hmac.Equal(got, mac(secret, []byte("v0:"+ts+":"), body)) {
		return errSignatureMismatch
	}
	return checkSkew(t, now, tolerance)
}

// checkSkew refuses a signed Unix time t further than tolerance from now,
// either way.
func checkSkew(t int64, now time.Time, tolerance time.Duration) error {
	if skew := now.Sub(time.Unix(t, 0)).Abs(); skew > tolerance {
		return fmt.Errorf("the request timestamp is %s away from now, beyond the %s tolerance", skew.Truncate(time.Second), tolerance)
	}
	return nil
}

// checkStandard checks a Standard Webhooks signature: webhook-signature is
// a space-separated list of "VERSION,SIG" entries, one "v1" of which must
// be the base64 HMAC-SHA256 of "ID.TS.body" (ID the webhook-id, TS the
// webhook-timestamp); other versions are ignored. TS must be within
// tolerance of now either way.
func checkStandard(h http.Header, key, body []byte, now time.Time, tolerance time.Duration) error {
	id := h.Get("webhook-id")
	if id == "" {
		return errors.New("missing the webhook-id header")
	}
	ts := h.Get("webhook-timestamp")
	if ts == "" {
		return errors.New("missing the webhook-timestamp header")
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("the webhook-timestamp header is not a Unix time")
	}
	v := h.Get("webhook-signature")
	if v == "" {
		return errors.New("missing the webhook-signature header")
	}
	want := mac(key, []byte(id+"."+ts+"."), body)
	found, match := false, false
	for _, entry := range strings.Fields(v) {
		version, sig, _ := strings.Cut(entry, ",")
		got, err := base64.StdEncoding.DecodeString(sig)
		if version != "v1" || err != nil || len(got) == 0 {
			continue
		}
		found = true
		match = hmac.Equal(got, want) || match
	}
	if !found {
		return errors.New(`the webhook-signature header has no valid v1 signature ("v1," + base64)`)
	}
	if !match {
		return errSignatureMismatch
	}
	return checkSkew(t, now, tolerance)
}
