package sources

import (
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The placeholders of WebhookSpec.SignedContent.
const (
	PlaceholderBody      = "{body}"
	PlaceholderTimestamp = "{timestamp}"
	PlaceholderID        = "{id}"
)

// validateSignature returns the problems with the signature keys: the
// scheme, its secret and the keys of "hmac".
func (s *WebhookSpec) validateSignature() []FieldError {
	var errs []FieldError
	bad := func(key, msg string, args ...any) { errs = append(errs, FieldError{key, fmt.Sprintf(msg, args...)}) }
	switch s.Signature {
	case "", SignatureGitHub, SignatureStripe, SignatureSlack, SignatureStandard, SignatureShopify, SignatureHMAC, SignatureHMACSHA256:
	default:
		bad("signature", "must be \"github\", \"stripe\", \"slack\", \"standard\", \"shopify\", \"hmac\" or \"hmac_sha256\", not %q", s.Signature)
		return errs
	}
	s.validateSecrets(bad)
	switch s.Challenge {
	case "", ChallengeSlack, ChallengeNone:
	case ChallengeCRCSHA256:
		if s.Signature == "" {
			bad("challenge", "\"crc_sha256\" needs a signature: its answer is an HMAC with the first secret")
		}
	default:
		bad("challenge", "must be \"slack\", \"crc_sha256\" or \"none\", not %q", s.Challenge)
	}
	custom := s.Signature == SignatureHMAC || s.Signature == SignatureHMACSHA256
	switch {
	case custom && s.SignatureHeader == "":
		bad("signature_header", "is required with signature = %q (e.g. \"X-Signature\")", s.Signature)
	case !custom && s.SignatureHeader != "":
		bad("signature_header", "is only used with signature = \"hmac\" or \"hmac_sha256\"")
	case s.SignatureHeader != "" && !headerName(s.SignatureHeader):
		bad("signature_header", "%q is not a valid header name", s.SignatureHeader)
	}
	if s.Signature != SignatureHMAC {
		for _, k := range []struct{ key, val string }{{"algorithm", s.Algorithm}, {"encoding", s.Encoding}, {"prefix", s.Prefix},
			{"signed_content", s.SignedContent}, {"timestamp_header", s.TimestampHeader}} {
			if k.val != "" {
				bad(k.key, "is only used with signature = \"hmac\"")
			}
		}
		return errs
	}
	s.validateHMAC(bad)
	return errs
}

// validateSecrets reports through bad the problems with secret and
// secrets: one of them with a signature, neither without, each usable.
func (s *WebhookSpec) validateSecrets(bad func(key, msg string, args ...any)) {
	switch {
	case s.Secret != "" && s.Secrets != nil:
		bad("secrets", "set secret or secrets, not both")
	case s.Signature != "" && s.Secret == "" && s.Secrets == nil:
		bad("secret", "is required with signature = %q (e.g. \"${WEBHOOK_SECRET}\"; or secrets, to rotate it)", s.Signature)
	case s.Signature == "" && s.Secret != "":
		bad("secret", "is only used with a signature: set signature")
	case s.Signature == "" && s.Secrets != nil:
		bad("secrets", "is only used with a signature: set signature")
	case s.Secrets != nil && len(s.Secrets) == 0:
		bad("secrets", "must list at least one secret (e.g. [\"${NEW_SECRET}\", \"${OLD_SECRET}\"])")
	case s.Secrets != nil:
		for i, sec := range s.Secrets {
			if _, err := s.signingKey(sec); err != nil {
				bad("secrets."+strconv.Itoa(i), "%v", err)
			}
		}
	case s.Secret != "":
		if _, err := s.signingKey(WebhookSecret{Value: s.Secret}); err != nil {
			bad("secret", "%v", err)
		}
	}
}

// validateHMAC reports through bad the problems with the keys of
// signature = "hmac": algorithm, encoding, signed_content and the headers
// its placeholders need.
func (s *WebhookSpec) validateHMAC(bad func(key, msg string, args ...any)) {
	switch s.Algorithm {
	case "", "sha1", "sha256", "sha512":
	default:
		bad("algorithm", "must be \"sha1\", \"sha256\" or \"sha512\", not %q", s.Algorithm)
	}
	switch s.Encoding {
	case "", "hex", "base64":
	default:
		bad("encoding", "must be \"hex\" or \"base64\", not %q", s.Encoding)
	}
	parts, err := s.SignedContentParts()
	if err != nil {
		bad("signed_content", "%v", err)
		return
	}
	uses := map[string]bool{}
	for _, p := range parts {
		uses[p] = true
	}
	if !uses[PlaceholderBody] {
		bad("signed_content", "must include {body} (a signature over anything else proves nothing about the events)")
	}
	switch {
	case uses[PlaceholderTimestamp] && s.TimestampHeader == "":
		bad("timestamp_header", "is required when signed_content has {timestamp} (e.g. \"X-Timestamp\")")
	case !uses[PlaceholderTimestamp] && s.TimestampHeader != "":
		bad("timestamp_header", "is only used when signed_content has {timestamp}")
	case s.TimestampHeader != "" && !headerName(s.TimestampHeader):
		bad("timestamp_header", "%q is not a valid header name", s.TimestampHeader)
	}
	if uses[PlaceholderID] && s.IDHeader == "" {
		bad("id_header", "is required when signed_content has {id}: it names the header holding the id (e.g. \"X-Event-Id\")")
	}
}

// WebhookSecret is one secret of WebhookSpec.Secrets. In TOML it is a
// string (the value) or a table of value and an optional not_after.
type WebhookSecret struct {
	// Value is the secret, as WebhookSpec.Secret.
	Value string `toml:"value"`
	// NotAfter is the RFC 3339 time after which the secret no longer
	// matches; "" for never.
	NotAfter string `toml:"not_after"`
	// problem is what UnmarshalTOML found wrong, for Validate to report
	// at the secret's position.
	problem string
}

// UnmarshalTOML implements toml.Unmarshaler: v is a string or a table. A
// malformed secret is not an error here, so that Validate reports it with
// its position.
func (w *WebhookSecret) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case string:
		w.Value = v
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			var ok bool
			switch k {
			case "value":
				w.Value, ok = v[k].(string)
			case "not_after":
				switch t := v[k].(type) {
				case string:
					w.NotAfter, ok = t, true
				case time.Time:
					if strings.HasSuffix(t.Location().String(), "-local") {
						w.problem = "not_after needs a UTC offset, e.g. 2026-12-31T00:00:00Z"
						return nil
					}
					w.NotAfter, ok = t.Format(time.RFC3339Nano), true
				}
			default:
				w.problem = fmt.Sprintf("unknown key %q (a secret is a string, or a table of value and an optional not_after)", k)
				return nil
			}
			if !ok {
				w.problem = fmt.Sprintf("%s must be a string, not %T", k, v[k])
				return nil
			}
		}
	default:
		w.problem = fmt.Sprintf("must be a string, or a table of value and an optional not_after, not %T", v)
	}
	return nil
}

// SigningKey is one HMAC key of a webhook source.
type SigningKey struct {
	Key []byte
	// NotAfter is when the key stops matching; zero for never.
	NotAfter time.Time
}

// SigningKeys returns the HMAC keys of Signature, in the order of Secrets,
// or the one of Secret. Its error never quotes a secret.
func (s *WebhookSpec) SigningKeys() ([]SigningKey, error) {
	if s.Secrets == nil {
		key, err := s.signingKey(WebhookSecret{Value: s.Secret})
		if err != nil {
			return nil, err
		}
		return []SigningKey{key}, nil
	}
	keys := make([]SigningKey, len(s.Secrets))
	for i, sec := range s.Secrets {
		key, err := s.signingKey(sec)
		if err != nil {
			return nil, fmt.Errorf("secret %d: %w", i, err)
		}
		keys[i] = key
	}
	return keys, nil
}

// signingKey returns the key of sec: with "standard", its value
// base64-decoded after its optional "whsec_" prefix; else the value's
// bytes. Its error never quotes the secret.
func (s *WebhookSpec) signingKey(sec WebhookSecret) (SigningKey, error) {
	var k SigningKey
	switch {
	case sec.problem != "":
		return k, errors.New(sec.problem)
	case sec.Value == "":
		return k, errors.New("is empty")
	}
	if sec.NotAfter != "" {
		t, err := time.Parse(time.RFC3339, sec.NotAfter)
		if err != nil {
			return k, fmt.Errorf("not_after must be an RFC 3339 time such as \"2026-12-31T00:00:00Z\", not %q", sec.NotAfter)
		}
		k.NotAfter = t
	}
	if s.Signature != SignatureStandard {
		k.Key = []byte(sec.Value)
		return k, nil
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sec.Value, "whsec_"))
	if err != nil || len(key) == 0 {
		return k, errors.New(`must be "whsec_" + base64 with signature = "standard" (the base64 of the signing key, as the provider shows it)`)
	}
	k.Key = key
	return k, nil
}

// HandshakeChallenge returns the handshake the source answers:
// Challenge, "slack" by default with signature = "slack"; "" for none.
func (s *WebhookSpec) HandshakeChallenge() string {
	switch {
	case s.Challenge == ChallengeNone:
		return ""
	case s.Challenge == "" && s.Signature == SignatureSlack:
		return ChallengeSlack
	}
	return s.Challenge
}

// HMACAlgorithm returns the hash of "hmac" and "hmac_sha256": Algorithm,
// or "sha256".
func (s *WebhookSpec) HMACAlgorithm() string {
	if s.Algorithm == "" {
		return "sha256"
	}
	return s.Algorithm
}

// HMACEncoding returns the encoding of "hmac" and "hmac_sha256": Encoding,
// or "hex".
func (s *WebhookSpec) HMACEncoding() string {
	if s.Encoding == "" {
		return "hex"
	}
	return s.Encoding
}

// SignedContentParts splits SignedContent (default "{body}") into its
// literal texts and placeholders, in order; a placeholder is returned as
// written, e.g. "{body}". Its error names an unknown or unclosed
// placeholder.
func (s *WebhookSpec) SignedContentParts() ([]string, error) {
	t := s.SignedContent
	if t == "" {
		t = PlaceholderBody
	}
	var parts []string
	for t != "" {
		i := strings.IndexByte(t, '{')
		if i < 0 {
			parts = append(parts, t)
			break
		}
		if i > 0 {
			parts = append(parts, t[:i])
		}
		end := strings.IndexByte(t[i:], '}')
		if end < 0 {
			return nil, fmt.Errorf("unclosed placeholder %q (want {body}, {timestamp} or {id})", t[i:])
		}
		switch p := t[i : i+end+1]; p {
		case PlaceholderBody, PlaceholderTimestamp, PlaceholderID:
			parts = append(parts, p)
		default:
			return nil, fmt.Errorf("unknown placeholder %q (want {body}, {timestamp} or {id})", p)
		}
		t = t[i+end+1:]
	}
	return parts, nil
}
