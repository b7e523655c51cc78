package sources

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// WebhookSpec configures kind "webhook": an upstream POSTs events to
// /ingest/NAME on the push listener, and each is answered only once it is
// durable. A body is one JSON object (one event) or a JSON array of
// objects (a batch, one event per element).
//
// An event's idempotency key is, in this order: the request's
// Idempotency-Key header (for a batch, the header value + "#" + the
// element's index); the event's IDField; the request header IDHeader (for
// a batch, + "#" + index); else the hex SHA-256 of the event's bytes.
//
// A signature scheme (Signature) may set IDField or IDHeader by default
// (KeyField, KeyHeader) and, when it signs a timestamp, refuses one outside
// SignatureTolerance in its own direction: Stripe past only (a future
// timestamp passes, as Stripe's libraries do), Slack and Standard Webhooks
// both ways; "hmac" with a {timestamp} in SignedContent both ways too.
// GitHub, Shopify and hmac_sha256 sign no timestamp.
type WebhookSpec struct {
	PushGuard
	// MaxBodyBytes caps a request body. Default 1 MiB.
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// IDField is the dotted path of the event's idempotency key in the
	// body, e.g. "id" or "data.event_id"; a string or a number. With
	// signature = "stripe" it defaults to "id".
	IDField string `toml:"id_field"`
	// IDHeader is the request header holding the idempotency key when the
	// body has no IDField. With signature = "github" it defaults to
	// "X-GitHub-Delivery", with "standard" to "webhook-id", with "shopify"
	// to "X-Shopify-Webhook-Id".
	IDHeader string `toml:"id_header"`
	// RequiredFields are dotted paths every event must have (not null); an
	// event without one is answered 400 and nothing of the request is
	// stored.
	RequiredFields []string `toml:"required_fields"`
	// TimeField is the dotted path of the event's RFC 3339 timestamp, used
	// for lag; optional. A value that is not an RFC 3339 string is ignored.
	TimeField string `toml:"time_field"`
	// Token is the bearer token every request must send (Authorization:
	// Bearer TOKEN); use "${ENV}". At least 16 printable characters.
	Token string `toml:"token"`
	// TokenFile is a file holding the token (surrounding whitespace
	// trimmed), instead of Token.
	TokenFile string `toml:"token_file"`
	// Signature is the signature scheme every request must carry:
	// "github", "stripe", "slack", "standard" (Standard Webhooks, as Svix
	// sends), "shopify", "hmac" (described by SignatureHeader, Algorithm,
	// Encoding, Prefix and SignedContent) or "hmac_sha256" (an alias of
	// "hmac" with its defaults and an optional "sha256=" prefix); "" for
	// none.
	Signature string `toml:"signature"`
	// Secret is the signing secret of Signature; it or Secrets is required
	// with it. Use "${ENV}"; it is never logged. With "standard" it is
	// "whsec_" + the base64 of the key (the prefix is optional) and is
	// decoded; with the others its bytes are the key (Stripe's "whsec_..."
	// included).
	Secret string `toml:"secret"`
	// SignatureHeader is the request header holding the signature of
	// "hmac" and "hmac_sha256"; required with them, e.g. "X-Signature".
	SignatureHeader string `toml:"signature_header"`
	// SignatureTolerance is the replay window of the schemes that sign a
	// timestamp, each in its own direction: a Stripe timestamp older than
	// this is refused (a future one passes, as Stripe's libraries do); a
	// Slack or Standard Webhooks one further than this from now, either
	// way, is refused. Default "5m".
	SignatureTolerance string `toml:"signature_tolerance"`
	// Algorithm is the hash of signature = "hmac": "sha1", "sha256" or
	// "sha512". Default "sha256".
	Algorithm string `toml:"algorithm"`
	// Encoding is how signature = "hmac" writes the MAC: "hex" (either
	// case) or "base64" (standard alphabet, padded). Default "hex".
	Encoding string `toml:"encoding"`
	// Prefix is the text before the MAC in SignatureHeader with signature
	// = "hmac", e.g. "sha256="; a signature without it is refused.
	Prefix string `toml:"prefix"`
	// SignedContent is the template of the bytes signature = "hmac" signs:
	// literal text and the placeholders {body}, {timestamp} (the value of
	// TimestampHeader) and {id} (the value of IDHeader). It must include
	// {body}. Default "{body}".
	SignedContent string `toml:"signed_content"`
	// TimestampHeader is the request header holding the Unix time in
	// seconds that SignedContent's {timestamp} stands for; required when
	// it has one. A timestamp further than SignatureTolerance from now,
	// either way, is refused.
	TimestampHeader string `toml:"timestamp_header"`
	// Secrets are the signing secrets during a rotation, instead of
	// Secret: a signature matching any of them passes. Each is a string
	// or a table with value and an optional not_after (RFC 3339), after
	// which it no longer matches. A match is counted by the secret's
	// position in the list, never its value.
	Secrets []WebhookSecret `toml:"secrets"`
	// Challenge is the handshake the source answers instead of storing
	// it: "slack" (a POSTed url_verification is answered with its
	// challenge, after the signature check), "crc_sha256" (GET
	// /ingest/NAME?crc_token=T is answered with "sha256=" + the base64
	// HMAC-SHA256 of T with the first secret not past its not_after, as X
	// does) or "none". Default "slack" with signature = "slack", else
	// "none".
	Challenge string `toml:"challenge"`
	// QuarantineSize is how many refused deliveries of the source (bad or
	// missing signature or token, stale timestamp, wrong content type, a
	// body too large or invalid, refused by allow_cidrs or
	// require_client_cert) the queue database keeps, the oldest dropped
	// first; 0 keeps none. Default 100, at most 10000.
	QuarantineSize int `toml:"quarantine_size"`
	// QuarantineBodyBytes caps the body kept with a refused delivery: a
	// longer one is kept cut, and a body is never read further to fill it.
	// Default 4096, at most 65536.
	QuarantineBodyBytes int `toml:"quarantine_body_bytes"`
}

// The limits of WebhookSpec.QuarantineSize and QuarantineBodyBytes.
const (
	maxQuarantineSize      = 10000
	maxQuarantineBodyBytes = 64 << 10
)

// The signature schemes of WebhookSpec.Signature.
const (
	SignatureGitHub     = "github"
	SignatureStripe     = "stripe"
	SignatureSlack      = "slack"
	SignatureStandard   = "standard"
	SignatureShopify    = "shopify"
	SignatureHMAC       = "hmac"
	SignatureHMACSHA256 = "hmac_sha256"
)

// The handshakes of WebhookSpec.Challenge.
const (
	ChallengeSlack     = "slack"
	ChallengeCRCSHA256 = "crc_sha256"
	ChallengeNone      = "none"
)

func newWebhookSpec() *WebhookSpec {
	return &WebhookSpec{MaxBodyBytes: 1 << 20, SignatureTolerance: "5m", QuarantineSize: 100, QuarantineBodyBytes: 4096}
}

// Validate implements Spec.
func (s *WebhookSpec) Validate() []FieldError {
	errs, _ := s.validate(false)
	return errs
}

// ValidateOffline implements OfflineSpec: token_file is not read.
func (s *WebhookSpec) ValidateOffline() ([]FieldError, []string) { return s.validate(true) }

func (s *WebhookSpec) validate(offline bool) ([]FieldError, []string) {
	var unread []string
	errs := s.PushGuard.Validate()
	bad := func(key, msg string, args ...any) { errs = append(errs, FieldError{key, fmt.Sprintf(msg, args...)}) }
	if s.MaxBodyBytes < 1 || s.MaxBodyBytes > 64<<20 {
		bad("max_body_bytes", "must be between 1 and 67108864 (64 MiB)")
	}
	if s.QuarantineSize < 0 || s.QuarantineSize > maxQuarantineSize {
		bad("quarantine_size", "must be between 0 (keep none) and %d, not %d", maxQuarantineSize, s.QuarantineSize)
	}
	if s.QuarantineBodyBytes < 0 || s.QuarantineBodyBytes > maxQuarantineBodyBytes {
		bad("quarantine_body_bytes", "must be between 0 and %d (64 KiB), not %d", maxQuarantineBodyBytes, s.QuarantineBodyBytes)
	}
	for _, p := range []struct{ key, val string }{{"id_field", s.IDField}, {"time_field", s.TimeField}} {
		if p.val != "" && !dottedPath(p.val) {
			bad(p.key, "must be a dotted path such as \"id\" or \"meta.id\", not %q", p.val)
		}
	}
	for _, f := range s.RequiredFields {
		if !dottedPath(f) {
			bad("required_fields", "%q is not a dotted path such as \"id\" or \"meta.id\"", f)
		}
	}
	if s.IDHeader != "" && !headerName(s.IDHeader) {
		bad("id_header", "%q is not a valid header name", s.IDHeader)
	}
	if s.Token != "" && s.TokenFile != "" {
		bad("token_file", "set token or token_file, not both")
	} else if s.TokenFile != "" && offline {
		unread = append(unread, "token_file")
	} else if _, err := s.BearerToken(); err != nil {
		key := "token"
		if s.TokenFile != "" {
			key = "token_file"
		}
		bad(key, "%v", err)
	}
	positiveDuration(&errs, "signature_tolerance", s.SignatureTolerance)
	errs = append(errs, s.validateSignature()...)
	return errs, unread
}

// BearerToken returns the token requests must send: Token, or the content
// of TokenFile; "" when neither is set. Errors never quote the token.
func (s *WebhookSpec) BearerToken() (string, error) {
	token := s.Token
	if s.TokenFile != "" {
		data, err := os.ReadFile(s.TokenFile)
		if err != nil {
			return "", fmt.Errorf("read the token: %w", err)
		}
		if token = strings.TrimSpace(string(data)); token == "" {
			return "", fmt.Errorf("the file %q is empty", s.TokenFile)
		}
	}
	if token == "" {
		return "", nil
	}
	if msg := CheckToken(token); msg != "" {
		if s.TokenFile != "" {
			return "", fmt.Errorf("the token in %q %s", s.TokenFile, msg)
		}
		return "", fmt.Errorf("the token %s", msg)
	}
	return token, nil
}

// KeyField returns the body field holding an event's idempotency key:
// IDField, or "id" for Stripe; "" for none.
func (s *WebhookSpec) KeyField() string {
	if s.IDField == "" && s.Signature == SignatureStripe {
		return "id"
	}
	return s.IDField
}

// KeyHeader returns the request header holding the idempotency key when the
// body has none: IDHeader, or the scheme's delivery id (X-GitHub-Delivery
// for GitHub, webhook-id for Standard Webhooks, X-Shopify-Webhook-Id for
// Shopify); "" for none.
func (s *WebhookSpec) KeyHeader() string {
	if s.IDHeader != "" {
		return s.IDHeader
	}
	switch s.Signature {
	case SignatureGitHub:
		return "X-GitHub-Delivery"
	case SignatureStandard:
		return "webhook-id"
	case SignatureShopify:
		return "X-Shopify-Webhook-Id"
	}
	return ""
}

// Tolerance returns SignatureTolerance parsed (5 minutes if it does not
// parse, which Validate reports).
func (s *WebhookSpec) Tolerance() time.Duration {
	d, err := time.ParseDuration(s.SignatureTolerance)
	if err != nil || d <= 0 {
		return 5 * time.Minute
	}
	return d
}

// Open implements Spec: a webhook source has nothing to fetch.
func (s *WebhookSpec) Open(env Env) (Source, error) {
	if errs := s.Validate(); len(errs) > 0 {
		return nil, specErrors(env.Name, "webhook", errs)
	}
	return pushSource{name: env.Name, kind: "webhook"}, nil
}

// Authenticated implements PushSpec: a token, a signature or a verified
// client certificate (require_client_cert) proves the sender.
func (s *WebhookSpec) Authenticated() bool {
	return s.Token != "" || s.TokenFile != "" || s.Signature != "" || s.RequireClientCert
}

// dottedPath reports whether p is a dotted path such as "id" or "meta.id".
func dottedPath(p string) bool {
	return p != "" && !strings.HasPrefix(p, ".") && !strings.HasSuffix(p, ".") && !strings.Contains(p, "..")
}

// headerName reports whether h is a valid HTTP header name (RFC 9110
// token).
func headerName(h string) bool {
	if h == "" {
		return false
	}
	for i := range len(h) {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
