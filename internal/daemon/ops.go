package daemon

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ingestorhq/ingestor/internal/httpstop"
	"github.com/ingestorhq/ingestor/internal/unixsock"
)

// opsLimits bound every connection of the ops HTTP servers, so that a
// client that sends its headers or body slowly, or never reads the
// response, cannot hold a connection (and its goroutine) open for good.
type opsLimits struct {
	readHeader, read, write, idle time.Duration
	maxHeaderBytes                int
}

// defaultOpsLimits leave room for a large dead-letter payload (up to
// 64 MiB read from S3 and written back) while cutting slow clients off.
var defaultOpsLimits = opsLimits{
	readHeader:     5 * time.Second,
	read:           30 * time.Second,
	write:          2 * time.Minute,
	idle:           2 * time.Minute,
	maxHeaderBytes: 16 << 10,
}

// opsServer is one listener of the ops endpoints and its server.
type opsServer struct {
	srv *http.Server
	ln  net.Listener
}

// startHTTP serves /metrics, /healthz, /readyz, /status and the status
// page (/) on daemon.http_addr, and the admin endpoints there too, or on
// daemon.admin_addr when it is set.
func (d *Daemon) startHTTP(limits opsLimits) error {
	dc := d.cfg.Daemon
	ops := http.NewServeMux()
	ops.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{}))
	ops.HandleFunc("GET /status", d.handleStatus)
	ops.HandleFunc("GET /{$}", d.handlePage)
	ops.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	ops.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !d.ready.Load() {
			http.Error(w, "not ready\n", http.StatusServiceUnavailable)
			return
		}
		if why, low := d.disk.Low(); low {
			// Sources are paused and push sources refuse work: a load
			// balancer should send pushes to another member meanwhile.
			http.Error(w, "not ready: disk space low: "+why+"\n", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	admin := ops
	if dc.AdminAddr != "" {
		admin = http.NewServeMux()
	}
	d.registerAdmin(admin, newAdminGuard(dc.AdminToken))

	if dc.HTTPAddr != "" {
		ln, err := net.Listen("tcp", dc.HTTPAddr)
		if err != nil {
			return fmt.Errorf("http listen %s: %w", dc.HTTPAddr, err)
		}
		d.httpSrv = d.serve(ln, ops, limits)
	}
	if dc.AdminAddr != "" {
		ln, err := listenAdmin(dc.AdminAddr)
		if err != nil {
			return err
		}
		d.adminSrv = d.serve(ln, admin, limits)
	}
	return nil
}

// adminKey names the config key of the admin listener.
func adminKey(adminAddr string) string {
	if adminAddr != "" {
		return "admin_addr"
	}
	return "http_addr"
}

// listenAdmin listens on admin_addr: host:port, or unix:PATH for a Unix
// socket that only the daemon's user may connect to. A socket file left by
// a daemon that died is replaced; one that answers is in use.
func listenAdmin(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("admin listen %s: %w", addr, err)
		}
		return ln, nil
	}
	ln, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("admin %w", err)
	}
	return ln, nil
}

// serve runs an ops server with limits on ln.
func (d *Daemon) serve(ln net.Listener, h http.Handler, limits opsLimits) *opsServer {
	s := &opsServer{ln: ln, srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: limits.readHeader,
		ReadTimeout:       limits.read,
		WriteTimeout:      limits.write,
		IdleTimeout:       limits.idle,
		MaxHeaderBytes:    limits.maxHeaderBytes,
	}}
	conns := httpstop.Track(s.srv)
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("http server", "addr", ln.Addr().String(), "err", err)
		}
	}()
	d.stops.add("http listener "+ln.Addr().String(), func() error { return httpstop.ShutdownWithin(s.srv, conns, 2*time.Second) })
	return s
}

// adminGuard checks every admin request before its handler runs:
//
//   - with a token configured, the request must carry it as
//     "Authorization: Bearer TOKEN" (401 otherwise);
//   - without one (allowed only on loopback or a Unix socket), the Host
//     header must be an IP address or "localhost" (403 otherwise), so that
//     a web page cannot reach the endpoints through a DNS name rebound to
//     127.0.0.1;
//   - a request that changes state (POST) must not come from another
//     origin: Sec-Fetch-Site other than same-origin or none, or an Origin
//     whose host differs from Host, gets 403 (http.CrossOriginProtection).
//     A same-origin request is allowed: the only page the ops listener
//     serves is the status page, which sends no POST and, by its
//     Content-Security-Policy, runs no script but its own, so only a
//     client that already reaches the listener directly (and, when
//     configured, holds the token) can send one;
//   - its body must be declared as Content-Type: application/json (415
//     otherwise), which a browser cannot send cross-site without a CORS
//     preflight that the daemon never answers.
type adminGuard struct {
	// tokenSum is the SHA-256 of the token, or nil when there is none.
	// Comparing sums keeps the comparison constant-time whatever the
	// length of the presented token.
	tokenSum []byte
	csrf     *http.CrossOriginProtection
}

func newAdminGuard(token string) *adminGuard {
	g := &adminGuard{csrf: http.NewCrossOriginProtection()}
	if token != "" {
		sum := sha256.Sum256([]byte(token))
		g.tokenSum = sum[:]
	}
	return g
}

// check returns the status and reason refusing r, or 0 when r may proceed.
func (g *adminGuard) check(r *http.Request) (int, error) {
	if g.tokenSum != nil {
		presented, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(presented))
		if !ok || subtle.ConstantTimeCompare(sum[:], g.tokenSum) != 1 {
			return http.StatusUnauthorized, errors.New("missing or wrong admin token (Authorization: Bearer TOKEN, see daemon.admin_token)")
		}
	} else if !localHost(r.Host) {
		return http.StatusForbidden, fmt.Errorf("host %q: without daemon.admin_token the admin endpoints answer only requests addressed to an IP address or localhost", r.Host)
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return 0, nil
	}
	if err := g.csrf.Check(r); err != nil {
		return http.StatusForbidden, fmt.Errorf("cross-origin request refused: %w", err)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return http.StatusUnsupportedMediaType, fmt.Errorf("content type %q: want application/json", r.Header.Get("Content-Type"))
	}
	return 0, nil
}

// localHost reports whether the Host header hostport names an IP address
// or localhost rather than some other DNS name.
func localHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.EqualFold(host, "localhost") || net.ParseIP(host) != nil
}
