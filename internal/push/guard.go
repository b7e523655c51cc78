package push

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"golang.org/x/time/rate"

	"github.com/ingestorhq/ingestor/sources"
)

// guard refuses a request to a push source before the source's handler
// sees it, so before a webhook's body is read and before a ws_ingress
// handshake is upgraded: from outside allow_cidrs (403), without a
// verified client certificate when require_client_cert (403), without a
// token of the source's rate_limiter (429 with Retry-After). It checks in
// that order, so a request refused 403 takes no token.
type guard struct {
	source string
	// allow is nil for every address.
	allow       []netip.Prefix
	requireCert bool
	// limiter is nil without a rate_limiter; limiterName is its name.
	limiter     *rate.Limiter
	limiterName string
	metrics     *Metrics
	log         *slog.Logger
	// rejectLog lets a few refusals a minute be logged at warn; the
	// others are logged at debug, so a flood cannot flood the log.
	rejectLog *rate.Limiter
	// rejects records the 403s of a webhook source (nil for ws_ingress).
	rejects *rejections
}

// newGuard builds the guard of a source from its keys; nil when it checks
// nothing.
func newGuard(env handlerEnv, keys *sources.PushGuard, limiters *sources.RateLimiters) (*guard, error) {
	allow, err := keys.AllowedPrefixes()
	if err != nil {
		return nil, err
	}
	if allow == nil && !keys.RequireClientCert && keys.RateLimiter == "" {
		return nil, nil
	}
	g := &guard{source: env.source.Name, allow: allow, requireCert: keys.RequireClientCert, limiterName: keys.RateLimiter,
		metrics: env.metrics, log: env.log, rejectLog: rate.NewLimiter(rate.Every(6*time.Second), 10)}
	if g.log == nil {
		g.log = slog.Default()
	}
	if keys.RateLimiter != "" {
		if g.limiter = limiters.Get(keys.RateLimiter); g.limiter == nil {
			return nil, fmt.Errorf("rate_limiter: no [rate_limiters.%s] is defined", keys.RateLimiter)
		}
	}
	return g, nil
}

// admit reports whether r may go on to its handler; when not, it has
// answered r.
func (g *guard) admit(w http.ResponseWriter, r *http.Request) bool {
	if g.allow != nil && !g.allowed(r.RemoteAddr) {
		g.refuse(w, r, http.StatusForbidden, reasonCIDR, fmt.Sprintf("source %q does not take requests from %s (allow_cidrs)", g.source, peerHost(r.RemoteAddr)))
		return false
	}
	if g.requireCert && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
		g.refuse(w, r, http.StatusForbidden, reasonClientCert, fmt.Sprintf("source %q needs a client certificate (require_client_cert), verified against push.client_ca_file", g.source))
		return false
	}
	if g.limiter != nil {
		if wait, ok := take(g.limiter, time.Now()); !ok {
			w.Header().Set("Retry-After", retryAfter(wait))
			g.refuse(w, r, http.StatusTooManyRequests, "", fmt.Sprintf("source %q is over its rate_limiter %q, retry later", g.source, g.limiterName))
			return false
		}
	}
	return true
}

// allowed reports whether the TCP peer remote (host:port) is in allow. An
// IPv4 peer on a dual-stack listener may come as an IPv4-mapped IPv6
// address; it is matched as the IPv4 address it is.
func (g *guard) allowed(remote string) bool {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	addr := ap.Addr().Unmap().WithZone("")
	for _, p := range g.allow {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// peerHost returns the host of remote (host:port), or remote itself.
func peerHost(remote string) string {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr().Unmap().String()
	}
	return remote
}

// take takes a token from l at now. Without one it takes nothing and
// returns how long until one comes.
func take(l *rate.Limiter, now time.Time) (time.Duration, bool) {
	if l.AllowN(now, 1) {
		return 0, true
	}
	missing := 1 - l.TokensAt(now)
	return time.Duration(missing / float64(l.Limit()) * float64(time.Second)), false
}

// refuse answers code with reason as a webhook refusal is answered
// (X-Request-ID, {"error", "request_id"}), counts and logs it; a webhook
// source's refusal with a why (a quarantine reason, "" for none) is
// recorded, its body unread. The connection is closed after the answer:
// net/http would otherwise read what is left of the body first, to reuse
// the connection.
func (g *guard) refuse(w http.ResponseWriter, r *http.Request, code int, why, reason string) {
	reqID := requestID(r)
	if g.rejects != nil && why != "" {
		g.rejects.record(r, reqID, code, why, reason, nil, false)
	}
	w.Header().Set("X-Request-ID", reqID)
	w.Header().Set("Connection", "close")
	g.metrics.Requests.WithLabelValues(g.source, strconv.Itoa(code)).Inc()
	level := slog.LevelDebug
	if g.rejectLog.Allow() {
		level = slog.LevelWarn
	}
	g.log.Log(r.Context(), level, "push request refused", "request_id", reqID, "code", code,
		"reason", reason, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
	WriteJSON(w, code, rejection{Error: reason, RequestID: reqID})
}
