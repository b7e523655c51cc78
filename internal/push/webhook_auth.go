package push

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
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

// verifier checks the signature of a request and returns what matched;
// its error says why a request is refused, in words for the sender, and
// never holds a secret.
type verifier func(h http.Header, body []byte, now time.Time) (match, error)

// match is what a signature check found: the position of the secret that
// matched, and the Unix time in seconds the signature signs (0 when the
// scheme signs none).
type match struct {
	secret   int
	signedAt int64
}

// noMatch is the match of a refused signature.
var noMatch = match{secret: -1}

// newVerifier returns the verifier of spec's signature scheme, or nil when
// it has none.
func newVerifier(spec *sources.WebhookSpec) (verifier, error) {
	if spec.Signature == "" {
		return nil, nil
	}
	signing, err := spec.SigningKeys()
	if err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	keys, tolerance := keyring(signing), spec.Tolerance()
	var c *macCheck
	switch spec.Signature {
	case sources.SignatureGitHub:
		c = &macCheck{header: "X-Hub-Signature-256", prefix: "sha256=", encoding: "hex", hash: sha256.New}
	case sources.SignatureShopify:
		c = &macCheck{header: "X-Shopify-Hmac-SHA256", encoding: "base64", hash: sha256.New}
	case sources.SignatureHMAC, sources.SignatureHMACSHA256:
		if c, err = newMACCheck(spec); err != nil {
			return nil, err
		}
	case sources.SignatureStripe:
		return func(h http.Header, body []byte, now time.Time) (match, error) {
			return checkStripe(h.Get("Stripe-Signature"), keys, body, now, tolerance)
		}, nil
	case sources.SignatureSlack:
		return func(h http.Header, body []byte, now time.Time) (match, error) {
			return checkSlack(h, keys, body, now, tolerance)
		}, nil
	case sources.SignatureStandard:
		return func(h http.Header, body []byte, now time.Time) (match, error) {
			return checkStandard(h, keys, body, now, tolerance)
		}, nil
	default:
		return nil, fmt.Errorf("unknown signature scheme %q", spec.Signature)
	}
	return func(h http.Header, body []byte, now time.Time) (match, error) { return c.check(h, keys, body, now) }, nil
}

// keyring is a source's signing keys, in the order of its secrets.
type keyring []sources.SigningKey

// match returns the position of the first key, not past its not_after at
// now, whose HMAC (with newHash) of the content equals one of sigs; -1
// when none does. Every such key is compared with every signature, each in
// constant time.
func (k keyring) match(now time.Time, newHash func() hash.Hash, sigs [][]byte, content ...[]byte) int {
	pos := -1
	for i, key := range k {
		if !key.NotAfter.IsZero() && now.After(key.NotAfter) {
			continue
		}
		sum := hmacOf(newHash, key.Key, content...)
		for _, sig := range sigs {
			if hmac.Equal(sig, sum) && pos < 0 {
				pos = i
			}
		}
	}
	return pos
}

// hmacOf returns the HMAC (with newHash) of the content with key.
func hmacOf(newHash func() hash.Hash, key []byte, content ...[]byte) []byte {
	m := hmac.New(newHash, key)
	for _, p := range content {
		m.Write(p)
	}
	return m.Sum(nil)
}

var errSignatureMismatch = errors.New("the signature does not match the body")

// missingHeader is the error of a signature check for a header it needs
// and did not get.
type missingHeader string

func (e missingHeader) Error() string { return "missing the " + string(e) + " header" }

// staleError is the error of a signature check whose signed timestamp is
// beyond its tolerance.
type staleError string

func (e staleError) Error() string { return string(e) }

// signatureReason is the quarantine reason of a signature check's error:
// missing_signature, stale_timestamp or bad_signature.
func signatureReason(err error) string {
	var missing missingHeader
	var stale staleError
	switch {
	case errors.As(err, &missing):
		return reasonMissingSignature
	case errors.As(err, &stale):
		return reasonStaleTimestamp
	}
	return reasonBadSignature
}

// macCheck is a signature in one header over a template of the request:
// github, shopify, hmac and hmac_sha256.
type macCheck struct {
	// header holds the signature: prefix, then the MAC in encoding ("hex",
	// either case, or "base64", standard and padded).
	header, prefix, encoding string
	// prefixOptional lets the signature come without prefix.
	prefixOptional bool
	hash           func() hash.Hash
	// content is the signed content's parts (nil: the body alone), as
	// sources.WebhookSpec.SignedContentParts returns them; tsHeader and
	// idHeader hold the values of {timestamp} and {id}.
	content            []string
	tsHeader, idHeader string
	tolerance          time.Duration
}

// newMACCheck returns the check of signature = "hmac" or "hmac_sha256".
func newMACCheck(spec *sources.WebhookSpec) (*macCheck, error) {
	parts, err := spec.SignedContentParts()
	if err != nil {
		return nil, fmt.Errorf("signed_content: %w", err)
	}
	c := &macCheck{header: spec.SignatureHeader, prefix: spec.Prefix, encoding: spec.HMACEncoding(), content: parts,
		tsHeader: spec.TimestampHeader, idHeader: spec.KeyHeader(), tolerance: spec.Tolerance()}
	if spec.Signature == sources.SignatureHMACSHA256 {
		c.prefix, c.prefixOptional = "sha256=", true
	}
	switch spec.HMACAlgorithm() {
	case "sha1":
		c.hash = sha1.New
	case "sha256":
		c.hash = sha256.New
	case "sha512":
		c.hash = sha512.New
	default:
		return nil, fmt.Errorf("algorithm: unknown hash %q", spec.HMACAlgorithm())
	}
	return c, nil
}

// check checks the signature of a request with keys: the MAC of the
// signed content, and the signed timestamp within tolerance of now either
// way. It returns the position of the key that matched.
func (c *macCheck) check(h http.Header, keys keyring, body []byte, now time.Time) (match, error) {
	v := h.Get(c.header)
	if v == "" {
		return noMatch, missingHeader(c.header)
	}
	sig, ok := strings.CutPrefix(v, c.prefix)
	if !ok && !c.prefixOptional {
		return noMatch, fmt.Errorf("the %s header does not start with %q", c.header, c.prefix)
	}
	decode := hex.DecodeString
	if c.encoding == "base64" {
		decode = base64.StdEncoding.DecodeString
	}
	got, err := decode(sig)
	if err != nil {
		return noMatch, fmt.Errorf("the %s header is not %s", c.header, c.encoding)
	}
	content := [][]byte{body}
	var ts int64
	if c.content != nil {
		content = content[:0]
		for _, p := range c.content {
			switch p {
			case sources.PlaceholderBody:
				content = append(content, body)
			case sources.PlaceholderTimestamp:
				v := h.Get(c.tsHeader)
				if v == "" {
					return noMatch, missingHeader(c.tsHeader)
				}
				if ts, err = strconv.ParseInt(v, 10, 64); err != nil {
					return noMatch, fmt.Errorf("the %s header is not a Unix time", c.tsHeader)
				}
				content = append(content, []byte(v))
			case sources.PlaceholderID:
				v := h.Get(c.idHeader)
				if v == "" {
					return noMatch, missingHeader(c.idHeader)
				}
				content = append(content, []byte(v))
			default:
				content = append(content, []byte(p))
			}
		}
	}
	pos := keys.match(now, c.hash, [][]byte{got}, content...)
	if pos < 0 {
		return noMatch, errSignatureMismatch
	}
	if c.tsHeader != "" {
		if err := checkSkew(ts, now, c.tolerance); err != nil {
			return noMatch, err
		}
	}
	return match{secret: pos, signedAt: ts}, nil
}

// checkStripe checks a Stripe-Signature header, "t=TS,v1=SIG[,v1=SIG...]":
// one v1 must be the HMAC-SHA256 of "TS.body", and TS no older than
// tolerance (Stripe's own libraries refuse only old timestamps).
func checkStripe(header string, keys keyring, body []byte, now time.Time, tolerance time.Duration) (match, error) {
	if header == "" {
		return noMatch, missingHeader("Stripe-Signature")
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
		return noMatch, errors.New("the Stripe-Signature header has no valid timestamp t=")
	}
	if len(sigs) == 0 {
		return noMatch, errors.New("the Stripe-Signature header has no v1 signature")
	}
	pos := keys.match(now, sha256.New, sigs, []byte(ts), []byte("."), body)
	if pos < 0 {
		return noMatch, errSignatureMismatch
	}
	if age := now.Sub(time.Unix(t, 0)); age > tolerance {
		return noMatch, staleError(fmt.Sprintf("the signature timestamp is %s old, beyond the %s tolerance", age.Truncate(time.Second), tolerance))
	}
	return match{secret: pos, signedAt: t}, nil
}

// checkSlack checks X-Slack-Signature, "v0=" + the hex HMAC-SHA256 of
// "v0:TS:body" with TS the X-Slack-Request-Timestamp, which must be within
// tolerance of now either way.
func checkSlack(h http.Header, keys keyring, body []byte, now time.Time, tolerance time.Duration) (match, error) {
	ts := h.Get("X-Slack-Request-Timestamp")
	if ts == "" {
		return noMatch, missingHeader("X-Slack-Request-Timestamp")
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return noMatch, errors.New("the X-Slack-Request-Timestamp header is not a Unix time")
	}
	v := h.Get("X-Slack-Signature")
	if v == "" {
		return noMatch, missingHeader("X-Slack-Signature")
	}
	sig, ok := strings.CutPrefix(v, "v0=")
	if !ok {
		return noMatch, errors.New(`the X-Slack-Signature header does not start with "v0="`)
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return noMatch, errors.New("the X-Slack-Signature header is not hex")
	}
	pos := keys.match(now, sha256.New, [][]byte{got}, []byte("v0:"+ts+":"), body)
	if pos < 0 {
		return noMatch, errSignatureMismatch
	}
	if err := checkSkew(t, now, tolerance); err != nil {
		return noMatch, err
	}
	return match{secret: pos, signedAt: t}, nil
}

// checkSkew refuses a signed Unix time t further than tolerance from now,
// either way.
func checkSkew(t int64, now time.Time, tolerance time.Duration) error {
	if skew := now.Sub(time.Unix(t, 0)).Abs(); skew > tolerance {
		return staleError(fmt.Sprintf("the request timestamp is %s away from now, beyond the %s tolerance", skew.Truncate(time.Second), tolerance))
	}
	return nil
}

// checkStandard checks a Standard Webhooks signature: webhook-signature is
// a space-separated list of "VERSION,SIG" entries, one "v1" of which must
// be the base64 HMAC-SHA256 of "ID.TS.body" (ID the webhook-id, TS the
// webhook-timestamp); other versions are ignored. TS must be within
// tolerance of now either way.
func checkStandard(h http.Header, keys keyring, body []byte, now time.Time, tolerance time.Duration) (match, error) {
	id := h.Get("webhook-id")
	if id == "" {
		return noMatch, missingHeader("webhook-id")
	}
	ts := h.Get("webhook-timestamp")
	if ts == "" {
		return noMatch, missingHeader("webhook-timestamp")
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return noMatch, errors.New("the webhook-timestamp header is not a Unix time")
	}
	v := h.Get("webhook-signature")
	if v == "" {
		return noMatch, missingHeader("webhook-signature")
	}
	var sigs [][]byte
	for _, entry := range strings.Fields(v) {
		version, sig, _ := strings.Cut(entry, ",")
		got, err := base64.StdEncoding.DecodeString(sig)
		if version != "v1" || err != nil || len(got) == 0 {
			continue
		}
		sigs = append(sigs, got)
	}
	if len(sigs) == 0 {
		return noMatch, errors.New(`the webhook-signature header has no valid v1 signature ("v1," + base64)`)
	}
	pos := keys.match(now, sha256.New, sigs, []byte(id+"."+ts+"."), body)
	if pos < 0 {
		return noMatch, errSignatureMismatch
	}
	if err := checkSkew(t, now, tolerance); err != nil {
		return noMatch, err
	}
	return match{secret: pos, signedAt: t}, nil
}
