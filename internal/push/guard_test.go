package push

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math"
	"net"
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

// guardRig is a push listener on a real inbox serving the sources it was
// started with.
type guardRig struct {
	base    string // http(s)://ADDR/ingest/
	q       *queue.Queue
	metrics *Metrics
}

// startGuarded starts a push listener on loopback with TLS and client CAs
// as tls sets them (nil: plain HTTP), the named limiters and srcs.
func startGuarded(t *testing.T, tlsFiles func(*config.Push), limiters *sources.RateLimiters, srcs ...config.Source) *guardRig {
	t.Helper()
	in, q, _, _ := openInbox(t, 1_000_000)
	p := config.Push{Addr: "127.0.0.1:0"}
	scheme := "http"
	if tlsFiles != nil {
		tlsFiles(&p)
		scheme = "https"
	}
	m := NewMetrics(nil)
	srv := startServer(t, ServerOptions{Push: p, Sources: srcs, Inbox: in, Metrics: m, Limiters: limiters})
	return &guardRig{base: scheme + "://" + srv.Addr() + "/ingest/", q: q, metrics: m}
}

// hook is an enabled webhook source called name with the spec set adjusts.
func hook(t *testing.T, name string, set func(*sources.WebhookSpec)) config.Source {
	return config.Source{Name: name, Kind: "webhook", Enabled: true, Spec: webhookSpec(t, set)}
}

// refusals is how many requests of source were answered code.
func (g *guardRig) refusals(t *testing.T, source string, code int) float64 {
	return metricValue(t, g.metrics.Requests.WithLabelValues(source, strconv.Itoa(code)))
}

// TestGuardAllowCIDRs: a loopback client is served by a source allowing
// 127.0.0.0/8 and refused 403 by one allowing only 10.0.0.0/8 and an IPv6
// network, before the body is read: a request whose body never finishes
// gets its 403 at once.
func TestGuardAllowCIDRs(t *testing.T) {
	g := startGuarded(t, nil, nil,
		hook(t, "inside", func(s *sources.WebhookSpec) { s.AllowCIDRs = []string{"127.0.0.0/8"} }),
		hook(t, "outside", func(s *sources.WebhookSpec) { s.AllowCIDRs = []string{"10.0.0.0/8", "2001:db8::/32"} }))

	expect(t, send(t, http.MethodPost, g.base+"inside", `{"id":"a"}`), http.StatusAccepted, `"idempotency_key"`)
	r := send(t, http.MethodPost, g.base+"outside", `{"id":"b"}`)
	expect(t, r, http.StatusForbidden, `"error":"source \"outside\" does not take requests from 127.0.0.1 (allow_cidrs)"`)
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("403 Content-Type %q, want application/json", ct)
	}

	// A body that never finishes: the webhook would wait 30 s for it and
	// answer 408; the guard answers before reading it.
	addr := strings.TrimPrefix(strings.TrimSuffix(g.base, "/ingest/"), "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := fmt.Fprint(conn, "POST /ingest/outside HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":"); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer while the body is still coming: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "allow_cidrs") {
		t.Errorf("unfinished body answered %d %s, want 403", resp.StatusCode, body)
	}
	if n := g.q.PendingEvents(); n != 1 {
		t.Errorf("%d events stored, want only the allowed one", n)
	}
	if n := g.refusals(t, "outside", http.StatusForbidden); n != 2 {
		t.Errorf("ingestor_push_requests_total{source=outside,code=403} = %v, want 2", n)
	}
}

// TestGuardAllowed matches remote addresses, IPv4, IPv6 and IPv4-mapped,
// against allow_cidrs.
func TestGuardAllowed(t *testing.T) {
	spec := webhookSpec(t, func(s *sources.WebhookSpec) { s.AllowCIDRs = []string{"10.0.0.0/8", "2001:db8::/32", "192.0.2.7"} })
	gd, err := newGuard(handlerEnv{source: config.Source{Name: "g"}, metrics: NewMetrics(nil)}, &spec.PushGuard, nil)
	if err != nil {
		t.Fatal(err)
	}
	for remote, want := range map[string]bool{
		"10.1.2.3:5000":          true,
		"[::ffff:10.1.2.3]:5000": true,
		"[2001:db8:ff::1]:443":   true,
		"[fe80::1%eth0]:443":     false,
		"192.0.2.7:1":            true,
		"192.0.2.8:1":            false,
		"[2001:db9::1]:443":      false,
		"127.0.0.1:80":           false,
		"not an address":         false,
	} {
		if got := gd.allowed(remote); got != want {
			t.Errorf("allowed(%q) = %v, want %v", remote, got, want)
		}
	}
}

// TestGuardClientCert: with push.client_ca_file, a source with
// require_client_cert serves a client presenting a certificate of that CA
// (202) and refuses one without (403); a source without it serves both;
// a certificate of another CA fails the TLS handshake.
func TestGuardClientCert(t *testing.T) {
	pki := testsync.NewPKI(t)
	g := startGuarded(t, func(p *config.Push) {
		p.TLSCertFile, p.TLSKeyFile, p.ClientCAFile = pki.ServerCertFile, pki.ServerKeyFile, pki.CAFile
	}, nil,
		hook(t, "mtls", func(s *sources.WebhookSpec) { s.RequireClientCert = true }),
		hook(t, "open", nil))
	client := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.CAs, Certificates: certs}}}
	}
	withCert, without := client(pki.Client), client()
	other := testsync.NewPKI(t)
	stranger := client(other.Issue(t, "stranger", x509.ExtKeyUsageClientAuth))

	expect(t, post(t, withCert, g.base+"mtls", `{"id":"1"}`), http.StatusAccepted, `"status":"queued"`)
	expect(t, post(t, without, g.base+"mtls", `{"id":"2"}`), http.StatusForbidden, `needs a client certificate`)
	expect(t, post(t, without, g.base+"open", `{"id":"3"}`), http.StatusAccepted, `"status":"queued"`)
	expect(t, post(t, withCert, g.base+"open", `{"id":"4"}`), http.StatusAccepted, `"status":"queued"`)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, g.base+"open", strings.NewReader(`{"id":"5"}`))
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := stranger.Do(req); err == nil {
		_ = resp.Body.Close()
		t.Errorf("a certificate of another CA was answered %d, want a failed TLS handshake", resp.StatusCode)
	}
	if n := g.q.PendingEvents(); n != 3 {
		t.Errorf("%d events stored, want 3", n)
	}
}

// post POSTs body to url with c and reads the answer.
func post(t *testing.T, c *http.Client, url, body string) reply {
	t.Helper()
	return sendWith(t, c, http.MethodPost, url, strings.NewReader(body))
}

// TestGuardRateLimit: with a limiter of 5/s and a burst of 5, the first 5
// requests pass, the next is answered 429 with Retry-After: 1 and nothing
// stored, and after waiting that long a request passes again.
func TestGuardRateLimit(t *testing.T) {
	limiters := sources.NewRateLimiters()
	limiters.Add("hooks", sources.Rate{Limit: 5, Text: "5/s"}, 5)
	g := startGuarded(t, nil, limiters, hook(t, "limited", func(s *sources.WebhookSpec) { s.RateLimiter = "hooks" }))

	start := time.Now()
	passed := 0
	var r reply
	for {
		r = send(t, http.MethodPost, g.base+"limited", fmt.Sprintf(`{"n":%d}`, passed))
		if r.code != http.StatusAccepted {
			break
		}
		if passed++; passed > 100 {
			t.Fatal("100 requests passed a limiter of 5/s with a burst of 5")
		}
	}
	elapsed := time.Since(start)
	expect(t, r, http.StatusTooManyRequests, `rate_limiter \"hooks\"`)
	// The burst passes at once; on a slow machine a token may come back
	// while they are answered (one each 200 ms), never more.
	if most := 5 + int(math.Ceil(elapsed.Seconds()*5)); passed < 5 || passed > most {
		t.Errorf("%d requests passed in %v, want 5 to %d", passed, elapsed, most)
	}
	t.Logf("%d requests passed in %v before the 429", passed, elapsed)
	if ra := r.header.Get("Retry-After"); ra != "1" {
		t.Fatalf("Retry-After %q, want 1 (a token comes within 200 ms, rounded up)", ra)
	}
	if n := g.q.PendingEvents(); n != int64(passed) {
		t.Errorf("%d events stored, want the %d that passed", n, passed)
	}
	if n := g.refusals(t, "limited", http.StatusTooManyRequests); n != 1 {
		t.Errorf("ingestor_push_requests_total{code=429} = %v, want 1", n)
	}
	time.Sleep(time.Second) // the Retry-After the daemon asked for
	expect(t, send(t, http.MethodPost, g.base+"limited", `{"n":"after"}`), http.StatusAccepted, `"status":"queued"`)
}

// TestGuardWSIngressHandshake: the guard refuses a ws_ingress handshake
// before the upgrade: 403 from outside allow_cidrs, 429 over the limiter.
func TestGuardWSIngressHandshake(t *testing.T) {
	limiters := sources.NewRateLimiters()
	limiters.Add("once", sources.Rate{Limit: 1.0 / 3600, Text: "1/h"}, 1)
	ws := func(name string, set func(*sources.WSIngressSpec)) config.Source {
		s, _ := sources.NewSpec("ws_ingress")
		spec := s.(*sources.WSIngressSpec)
		spec.Token = sharedToken
		set(spec)
		if errs := spec.Validate(); len(errs) > 0 {
			t.Fatalf("invalid test spec: %v", errs)
		}
		return config.Source{Name: name, Kind: "ws_ingress", Enabled: true, Spec: spec}
	}
	g := startGuarded(t, nil, limiters,
		ws("fenced", func(s *sources.WSIngressSpec) { s.AllowCIDRs = []string{"10.0.0.0/8"} }),
		ws("limited", func(s *sources.WSIngressSpec) { s.RateLimiter = "once" }))
	wsURL := "ws" + strings.TrimPrefix(g.base, "http")

	if _, err := dialWS(t, wsURL+"fenced/ws", sharedToken); err == nil || !strings.Contains(err.Error(), "answered 403") {
		t.Errorf("handshake from outside allow_cidrs: %v, want 403", err)
	}
	conn, err := dialWS(t, wsURL+"limited/ws", sharedToken)
	if err != nil {
		t.Fatalf("first handshake: %v", err)
	}
	defer func() { _ = conn.CloseNow() }()
	if _, err := dialWS(t, wsURL+"limited/ws", sharedToken); err == nil || !strings.Contains(err.Error(), "answered 429") {
		t.Errorf("second handshake within the limiter's hour: %v, want 429", err)
	}
	if a, b := g.refusals(t, "fenced", http.StatusForbidden), g.refusals(t, "limited", http.StatusTooManyRequests); a != 1 || b != 1 {
		t.Errorf("refusals counted: 403 %v, 429 %v; want 1 and 1", a, b)
	}
}

// TestGuardStartRefuses: Start refuses what validate would have: a source
// requiring client certificates on a listener without client_ca_file, and
// a rate_limiter that is not defined.
func TestGuardStartRefuses(t *testing.T) {
	in, _, _, _ := openInbox(t, 100)
	for _, tc := range []struct {
		src  config.Source
		want string
	}{
		{hook(t, "mtls", func(s *sources.WebhookSpec) { s.RequireClientCert = true }), `source "mtls": require_client_cert needs push.client_ca_file`},
		{hook(t, "limited", func(s *sources.WebhookSpec) { s.RateLimiter = "nope" }), `source "limited": rate_limiter: no [rate_limiters.nope] is defined`},
	} {
		srv, err := Start(ServerOptions{Push: config.Push{Addr: "127.0.0.1:0"}, Inbox: in, Sources: []config.Source{tc.src}})
		if err == nil {
			if serr := srv.Shutdown(context.Background()); serr != nil {
				t.Error(serr)
			}
			t.Errorf("%s: started", tc.src.Name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.src.Name, err, tc.want)
		}
	}
}
