package sources

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
)

// PushSpec is the Spec of a push kind (webhook, ws_ingress): the upstream
// sends to the daemon's push listener ([push] addr), so no SourceActor
// polls it and it keeps no cursor. Package internal/push serves it.
type PushSpec interface {
	Spec
	// Authenticated reports whether every request to the source must
	// prove its sender (a bearer token, a signature or a verified client
	// certificate). A push listener beyond loopback serves only
	// authenticated sources.
	Authenticated() bool
}

// pushSource is what Open returns for a push kind: it has nothing to
// fetch, so a caller that polls it (check-source) gets a clear error.
type pushSource struct{ name, kind string }

func (s pushSource) Fetch(context.Context, string) (*Batch, error) {
	return nil, &PermanentError{Err: fmt.Errorf("source %q is kind %q: its upstream pushes to the push listener, there is nothing to poll", s.name, s.kind)}
}

func (pushSource) Close() error { return nil }

// MinTokenLen is the shortest bearer token accepted (a push source's
// token, the admin token), so that a placeholder such as "changeme" is not
// mistaken for protection.
const MinTokenLen = 16

// CheckToken returns what is wrong with a bearer token, or "". It never
// quotes the token.
func CheckToken(token string) string {
	if len(token) < MinTokenLen {
		return fmt.Sprintf("must be at least %d characters (e.g. the output of `openssl rand -hex 32`)", MinTokenLen)
	}
	for i := range len(token) {
		if c := token[i]; c <= ' ' || c > '~' {
			return "must be printable ASCII without spaces (it is sent in an HTTP header)"
		}
	}
	return ""
}

// PushGuard holds the keys that every push kind takes to refuse a request
// before its handler sees it: before a webhook's body is read, before a
// ws_ingress handshake is upgraded. WebhookSpec and WSIngressSpec embed
// it, so its keys are written in the source block itself. See docs/push.md,
// "Hardening".
type PushGuard struct {
	// AllowCIDRs are the networks requests may come from, such as
	// ["192.30.252.0/22", "2001:db8::/32"] (a bare address is that one
	// host); a request from elsewhere is answered 403. The address
	// checked is the TCP peer's: X-Forwarded-For is not trusted, so behind
	// a proxy every request comes from the proxy. Empty: every address.
	AllowCIDRs []string `toml:"allow_cidrs"`
	// RequireClientCert refuses (403) a request without a client
	// certificate verified against [push] client_ca_file, which must be
	// set.
	RequireClientCert bool `toml:"require_client_cert"`
	// RateLimiter names a [rate_limiters.NAME] token bucket that each
	// request to the source (each handshake for ws_ingress) takes a token
	// from; without one it is answered 429 with Retry-After and nothing
	// is stored. "" for no limit.
	RateLimiter string `toml:"rate_limiter"`
}

// Validate checks the guard's keys; it is part of its kind's Validate.
// Whether rate_limiter names a defined limiter and require_client_cert
// has a [push] client_ca_file is checked by the config package, which
// sees the whole file.
func (g *PushGuard) Validate() []FieldError {
	var bad []string
	for _, c := range g.AllowCIDRs {
		if _, err := ParseCIDR(c); err != nil {
			bad = append(bad, err.Error())
		}
	}
	if bad == nil {
		return nil
	}
	// One error for the key: config keeps one error a key.
	return []FieldError{{"allow_cidrs", strings.Join(bad, "; ")}}
}

// LimiterName returns the [rate_limiters.NAME] the source takes its
// requests from, or "".
func (g *PushGuard) LimiterName() string { return g.RateLimiter }

// ClientCertRequired reports whether requests need a verified client
// certificate.
func (g *PushGuard) ClientCertRequired() bool { return g.RequireClientCert }

// AllowedPrefixes returns AllowCIDRs parsed; nil for every address.
func (g *PushGuard) AllowedPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range g.AllowCIDRs {
		p, err := ParseCIDR(c)
		if err != nil {
			return nil, fmt.Errorf("allow_cidrs: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}

// ParseCIDR parses an entry of allow_cidrs: a CIDR such as
// "192.30.252.0/22" or "2001:db8::/32" without bits set past its prefix
// length, or a bare address (one host).
func ParseCIDR(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR such as \"192.30.252.0/22\" or \"2001:db8::/32\", nor an address", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR such as \"192.30.252.0/22\" or \"2001:db8::/32\"", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%q has bits set past its /%d: did you mean %q?", s, p.Bits(), p.Masked().String())
	}
	if p.Addr().Is4In6() {
		// An IPv4-mapped prefix matches the IPv4 peers it stands for (its
		// bits past 96 are set, so it is at least a /96).
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p, nil
}
