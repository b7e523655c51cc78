package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/testconfig"
)

const testToken = "0123456789abcdef0123456789abcdef"

// adminRequest sends method path (with body, if any) to base with the
// given headers and returns the status and body.
func adminRequest(t *testing.T, client *http.Client, method, url, body string, header map[string]string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := resp.Body.Close(); err != nil {
			t.Error(err)
		}
	}()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// deadLetterOne puts one malformed payload on h's dead-letter list and
// returns its id.
func deadLetterOne(t *testing.T, h *harness) int64 {
	t.Helper()
	if err := h.d.Queue().DeadLetter(t.Context(), "feed", "not json", "feed/bad", ""); err != nil {
		t.Fatal(err)
	}
	dls, err := h.d.Queue().DeadLetters(t.Context(), 10)
	if err != nil || len(dls) == 0 {
		t.Fatalf("dead letters = %v, %v", dls, err)
	}
	return dls[len(dls)-1].ID
}

// TestAdminRefusesBrowserRequests checks the default, tokenless loopback
// admin endpoints: a state-changing request must be declared JSON and not
// come from another origin, and no request may arrive through a DNS name
// (DNS rebinding), while the CLI's plain requests still pass.
func TestAdminRefusesBrowserRequests(t *testing.T) {
	h := startDaemon(t, "", "", "")
	deadLetterOne(t, h)
	base := "http://" + h.d.HTTPAddr()
	c := http.DefaultClient
	const drop = `{"source":"nothing-here"}`
	json := map[string]string{"Content-Type": "application/json"}
	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   string
		header map[string]string
		want   int
	}{
		{"no content type", "POST", "/dlq/drop", drop, nil, http.StatusUnsupportedMediaType},
		{"form content type", "POST", "/dlq/replay", drop, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType},
		{"text/plain", "POST", "/dlq/drop", drop, map[string]string{"Content-Type": "text/plain"}, http.StatusUnsupportedMediaType},
		{"cross-site origin", "POST", "/dlq/drop", drop, map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example"}, http.StatusForbidden},
		{"cross-site fetch", "POST", "/dlq/replay", drop, map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"same-site fetch", "POST", "/dlq/drop", drop, map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, http.StatusForbidden},
		{"rebound DNS name", "GET", "/dlq", "", map[string]string{"Host": "evil.example:" + portOf(t, h.d.HTTPAddr())}, http.StatusForbidden},
		{"reload, cross-site fetch", "POST", "/-/reload", "", map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"reload, form", "POST", "/-/reload", "", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType},
		{"rebound DNS name, POST", "POST", "/dlq/drop", drop, map[string]string{"Content-Type": "application/json", "Host": "evil.example"}, http.StatusForbidden},
		// Allowed: what ingestor dlq and curl send, and a same-origin request.
		{"json", "POST", "/dlq/drop", drop, json, http.StatusOK},
		{"json with charset", "POST", "/dlq/drop", drop, map[string]string{"Content-Type": "application/json; charset=utf-8"}, http.StatusOK},
		{"same origin", "POST", "/dlq/drop", drop, map[string]string{"Content-Type": "application/json", "Origin": base, "Sec-Fetch-Site": "same-origin"}, http.StatusOK},
		{"localhost", "GET", "/dlq", "", map[string]string{"Host": "localhost"}, http.StatusOK},
		{"list", "GET", "/dlq", "", nil, http.StatusOK},
	} {
		if got, body := adminRequest(t, c, tc.method, base+tc.path, tc.body, tc.header); got != tc.want {
			t.Errorf("%s: %s %s = %d, want %d: %s", tc.name, tc.method, tc.path, got, tc.want, body)
		}
	}
	if n, err := h.d.Queue().CountDeadLetters(t.Context(), queue.DLQFilter{}); err != nil || n != 1 {
		t.Errorf("dead letters after the refused requests = %d, %v; want 1", n, err)
	}
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// TestAdminToken configures a token: every admin endpoint, reads
// included, needs it, while /metrics and the health checks do not.
func TestAdminToken(t *testing.T) {
	h := startDaemonWith(t, fmt.Sprintf("admin_token = %q", testToken), "", "", "", Options{})
	id := deadLetterOne(t, h)
	base := "http://" + h.d.HTTPAddr()
	c := http.DefaultClient
	auth := func(v string) map[string]string {
		return map[string]string{"Authorization": v, "Content-Type": "application/json"}
	}
	show := "/dlq/" + strconv.FormatInt(id, 10)
	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		want                     int
	}{
		{"list without token", "GET", "/dlq", "", nil, http.StatusUnauthorized},
		{"payload without token", "GET", show, "", nil, http.StatusUnauthorized},
		{"replay without token", "POST", "/dlq/replay", `{"all":true}`, auth(""), http.StatusUnauthorized},
		{"drop without token", "POST", "/dlq/drop", `{"all":true}`, auth(""), http.StatusUnauthorized},
		{"payload, wrong token", "GET", show, "", auth("Bearer " + strings.ToUpper(testToken)), http.StatusUnauthorized},
		{"drop, wrong token", "POST", "/dlq/drop", `{"all":true}`, auth("Bearer " + testToken + "0"), http.StatusUnauthorized},
		{"drop, token prefix", "POST", "/dlq/drop", `{"all":true}`, auth("Bearer " + testToken[:20]), http.StatusUnauthorized},
		{"token without Bearer", "GET", "/dlq", "", auth(testToken), http.StatusUnauthorized},
		{"basic auth", "GET", "/dlq", "", auth("Basic " + testToken), http.StatusUnauthorized},
		{"token, cross-site", "POST", "/dlq/drop", `{"all":true}`,
			map[string]string{"Authorization": "Bearer " + testToken, "Content-Type": "application/json", "Origin": "https://evil.example"}, http.StatusForbidden},
		{"token, not JSON", "POST", "/dlq/drop", `{"all":true}`, map[string]string{"Authorization": "Bearer " + testToken}, http.StatusUnsupportedMediaType},
		{"quarantine without token", "GET", "/quarantine", "", nil, http.StatusUnauthorized},
		{"quarantined delivery without token", "GET", "/quarantine/1", "", nil, http.StatusUnauthorized},
		{"quarantine clear without token", "DELETE", "/quarantine?source=x", "", auth(""), http.StatusUnauthorized},
		{"quarantine clear, token, cross-site", "DELETE", "/quarantine?source=x", "",
			map[string]string{"Authorization": "Bearer " + testToken, "Content-Type": "application/json", "Origin": "https://evil.example"}, http.StatusForbidden},
		{"quarantine clear, token, not JSON", "DELETE", "/quarantine?source=x", "", map[string]string{"Authorization": "Bearer " + testToken}, http.StatusUnsupportedMediaType},
		{"reload without token", "POST", "/-/reload", "", auth(""), http.StatusUnauthorized},
		{"reload dry run without token", "POST", "/-/reload?dry_run=1", "", auth(""), http.StatusUnauthorized},
		{"reload, token, cross-site", "POST", "/-/reload", "",
			map[string]string{"Authorization": "Bearer " + testToken, "Content-Type": "application/json", "Origin": "https://evil.example"}, http.StatusForbidden},
		{"reload, token, not JSON", "POST", "/-/reload", "", map[string]string{"Authorization": "Bearer " + testToken}, http.StatusUnsupportedMediaType},
		{"reload by GET", "GET", "/-/reload", "", auth("Bearer " + testToken), http.StatusMethodNotAllowed},
		{"tap without token", "GET", "/tap", "", nil, http.StatusUnauthorized},
		{"tap, wrong token", "GET", "/tap?source=x", "", auth("Bearer " + testToken + "0"), http.StatusUnauthorized},
		{"quarantine clear without a source", "DELETE", "/quarantine", "", auth("Bearer " + testToken), http.StatusBadRequest},
		{"quarantine with token", "GET", "/quarantine?limit=5", "", auth("Bearer " + testToken), http.StatusOK},
		{"quarantine, bad limit", "GET", "/quarantine?limit=-1", "", auth("Bearer " + testToken), http.StatusBadRequest},
		{"quarantined delivery, unknown", "GET", "/quarantine/999", "", auth("Bearer " + testToken), http.StatusNotFound},
		{"metrics", "GET", "/metrics", "", nil, http.StatusOK},
		{"healthz", "GET", "/healthz", "", nil, http.StatusOK},
		{"readyz", "GET", "/readyz", "", nil, http.StatusOK},
		{"payload with token", "GET", show, "", auth("Bearer " + testToken), http.StatusOK},
	} {
		got, body := adminRequest(t, c, tc.method, base+tc.path, tc.body, tc.header)
		if got != tc.want {
			t.Errorf("%s: %s %s = %d, want %d: %s", tc.name, tc.method, tc.path, got, tc.want, body)
		}
		if strings.Contains(body, testToken[:16]) || (got == http.StatusOK && tc.path == show && !strings.Contains(body, "not json")) {
			t.Errorf("%s: body %s", tc.name, body)
		}
	}
	if n, err := h.d.Queue().CountDeadLetters(t.Context(), queue.DLQFilter{}); err != nil || n != 1 {
		t.Errorf("dead letters after the refused drops = %d, %v; want 1", n, err)
	}
	if got, body := adminRequest(t, c, "POST", base+"/dlq/drop", `{"all":true}`, auth("Bearer "+testToken)); got != http.StatusOK || !strings.Contains(body, `"dropped":1`) {
		t.Errorf("drop with the token = %d %s", got, body)
	}
	if strings.Contains(h.logs.String(), testToken) {
		t.Errorf("the token was logged:\n%s", h.logs.String())
	}
}

// TestAdminAddr serves the admin endpoints on their own listeners (TCP and
// a Unix socket of mode 0600): http_addr then serves only metrics and
// health.
func TestAdminAddr(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	for _, addr := range []string{"127.0.0.1:0", "unix:" + sock} {
		t.Run(strings.SplitN(addr, ":", 2)[0], func(t *testing.T) {
			h := startDaemonWith(t, fmt.Sprintf("admin_addr = %q", addr), "", "", "", Options{})
			deadLetterOne(t, h)
			public := "http://" + h.d.HTTPAddr()
			c := http.DefaultClient
			for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
				if got, _ := adminRequest(t, c, "GET", public+p, "", nil); got != http.StatusOK {
					t.Errorf("GET %s on http_addr = %d, want 200", p, got)
				}
			}
			for _, p := range []string{"/dlq", "/dlq/1"} {
				if got, _ := adminRequest(t, c, "GET", public+p, "", nil); got != http.StatusNotFound {
					t.Errorf("GET %s on http_addr = %d, want 404 (admin_addr serves it)", p, got)
				}
			}
			json := map[string]string{"Content-Type": "application/json"}
			for _, p := range []string{"/dlq/replay", "/dlq/drop"} {
				if got, _ := adminRequest(t, c, "POST", public+p, `{"all":true}`, json); got != http.StatusNotFound && got != http.StatusMethodNotAllowed {
					t.Errorf("POST %s on http_addr = %d, want it not served", p, got)
				}
			}
			admin, ac := "http://"+h.d.AdminAddr(), c
			if path, ok := strings.CutPrefix(addr, "unix:"); ok {
				fi, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Perm() != 0o600 {
					t.Errorf("admin socket mode %v, want 0600", fi.Mode().Perm())
				}
				admin = "http://localhost"
				ac = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", path)
				}}}
			}
			if got, body := adminRequest(t, ac, "GET", admin+"/dlq", "", nil); got != http.StatusOK || !strings.Contains(body, "not json") {
				t.Errorf("GET /dlq on admin_addr = %d %s", got, body)
			}
			if got, _ := adminRequest(t, ac, "GET", admin+"/metrics", "", nil); got != http.StatusNotFound {
				t.Errorf("GET /metrics on admin_addr = %d, want 404", got)
			}
			if got, body := adminRequest(t, ac, "POST", admin+"/dlq/drop", `{"all":true}`, json); got != http.StatusOK || !strings.Contains(body, `"dropped":1`) {
				t.Errorf("POST /dlq/drop on admin_addr = %d %s", got, body)
			}
		})
	}
}

// TestPublicAdminWithoutTokenRefusesToStart checks both guards: config
// validation, and Start itself for a config built in code.
func TestPublicAdminWithoutTokenRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	pub, ack := testconfig.FreeEndpoints(t)
	c := testconfig.Daemon{Dir: dir, DataDir: dir, HTTPAddr: "0.0.0.0:0", Publish: pub, Ack: ack}
	_, err := config.Parse("public.toml", []byte(c.TOML()))
	if err == nil || !strings.Contains(err.Error(), "public.toml:3: daemon.http_addr: serves the admin endpoints") {
		t.Fatalf("config with a public tokenless admin listener: %v", err)
	}
	c.HTTPAddr = "127.0.0.1:0"
	cfg := c.Parse(t, "public.toml")
	for _, c := range []struct{ http, admin string }{{"0.0.0.0:0", ""}, {"127.0.0.1:0", ":0"}} {
		cfg.Daemon.HTTPAddr, cfg.Daemon.AdminAddr = c.http, c.admin
		d, err := Start(t.Context(), cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			t.Errorf("http_addr %q admin_addr %q: started (admin on %s) without a token", c.http, c.admin, d.AdminAddr())
			if err := d.Shutdown(ctx); err != nil {
				t.Error(err)
			}
			cancel()
			continue
		}
		if !strings.Contains(err.Error(), "refusing to start") || !strings.Contains(err.Error(), "daemon.admin_token") {
			t.Errorf("http_addr %q admin_addr %q: error %v does not name the keys", c.http, c.admin, err)
		}
	}
}

// TestOpsServerLimits checks that every ops listener has read, write and
// idle timeouts and a header limit, and that slow or oversized clients are
// cut off.
func TestOpsServerLimits(t *testing.T) {
	h := startDaemonWith(t, `admin_addr = "127.0.0.1:0"`, "", "", "", Options{})
	for name, s := range map[string]*opsServer{"http": h.d.httpSrv, "admin": h.d.adminSrv} {
		if s.srv.ReadHeaderTimeout <= 0 || s.srv.ReadTimeout <= 0 || s.srv.WriteTimeout <= 0 || s.srv.IdleTimeout <= 0 ||
			s.srv.MaxHeaderBytes <= 0 || s.srv.MaxHeaderBytes > 64<<10 {
			t.Errorf("%s server limits: header %v, read %v, write %v, idle %v, max header %d bytes", name,
				s.srv.ReadHeaderTimeout, s.srv.ReadTimeout, s.srv.WriteTimeout, s.srv.IdleTimeout, s.srv.MaxHeaderBytes)
		}
	}

	short := &opsLimits{readHeader: 300 * time.Millisecond, read: 600 * time.Millisecond, write: 5 * time.Second,
		idle: 600 * time.Millisecond, maxHeaderBytes: defaultOpsLimits.maxHeaderBytes}
	defaultAddr := h.d.HTTPAddr()
	h = startDaemonWith(t, "", "", "", "", Options{opsLimits: short})
	addr := h.d.HTTPAddr()
	for _, tc := range []struct{ name, send string }{
		{"headers never finished", "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "},
		{"body never finished", "POST /dlq/drop HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"all\":"},
		{"idle keep-alive", "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(conn, tc.send); err != nil {
			t.Fatal(err)
		}
		// The server must close the connection on its own; the deadline
		// only keeps a failing test from hanging.
		if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = io.Copy(io.Discard, conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s: the server kept the connection open for %v", tc.name, time.Since(start))
		} else {
			t.Logf("%s: closed by the server after %v (%v)", tc.name, time.Since(start).Round(time.Millisecond), err)
		}
		if err := conn.Close(); err != nil {
			t.Error(err)
		}
	}

	// A header block over the limit is refused (by the daemon with the
	// default limits, whose header timeout leaves ample time). It is sent
	// unfinished and exactly as long as the server reads before it gives
	// up, so that no unread bytes make the close a reset that could eat
	// the answer.
	conn, err := net.Dial("tcp", defaultAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := conn.Close(); err != nil {
			t.Error(err)
		}
	}()
	req := "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
	req += strings.Repeat("a", defaultOpsLimits.maxHeaderBytes+4096-len(req))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("header over the limit: %v", err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Error(err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("header over the limit: status %d, want 431", resp.StatusCode)
	}
}

// TestStartFailsCleanlyWhenHTTPAddrIsTaken checks that an error after the
// sender has started is returned, not a crash of the sender's goroutine
// (which once read the Daemon that the error return had set to nil).
func TestStartFailsCleanlyWhenHTTPAddrIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := taken.Close(); err != nil {
			t.Error(err)
		}
	}()
	dir := t.TempDir()
	pub, ack := testconfig.FreeEndpoints(t)
	cfg := testconfig.Daemon{Dir: dir, DataDir: dir, HTTPAddr: taken.Addr().String(), Publish: pub, Ack: ack}.Parse(t, "taken.toml")
	for range 20 {
		d, err := Start(t.Context(), cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			t.Errorf("started on a taken http_addr %s", d.HTTPAddr())
			if err := d.Shutdown(ctx); err != nil {
				t.Error(err)
			}
			cancel()
			return
		}
		if !strings.Contains(err.Error(), "http listen") {
			t.Fatalf("error %v, want the http listen failure", err)
		}
	}
}
