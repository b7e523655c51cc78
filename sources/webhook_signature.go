package sources

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
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
	switch {
	case s.Signature != "" && s.Secret == "":
		bad("secret", "is required with signature = %q (e.g. \"${WEBHOOK_SECRET}\")", s.Signature)
	case s.Signature == "" && s.Secret != "":
		bad("secret", "is only used with a signature: set signature")
	default:
		if _, err := s.SigningKey(); err != nil {
			bad("secret", "%v", err)
		}
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
		return errs
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
	return errs
}

// SigningKey returns the HMAC key of Signature: with "standard", Secret
// base64-decoded after its optional "whsec_" prefix; else Secret's bytes.
// Its error never quotes the secret.
func (s *WebhookSpec) SigningKey() ([]byte, error) {
	if s.Signature != SignatureStandard {
		return []byte(s.Secret), nil
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s.Secret, "whsec_"))
	if err != nil || len(key) == 0 {
		return nil, errors.New(`must be "whsec_" + base64 with signature = "standard" (the base64 of the signing key, as the provider shows it)`)
	}
	return key, nil
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
