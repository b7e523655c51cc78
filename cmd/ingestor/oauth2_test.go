package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// oauth2Run is how long TestOAuth2TokensExpireMidRun polls and how long
// its tokens live: 12 s of 2 s tokens in make test, and in make bench
// (INGESTOR_OAUTH2_RUN=5m INGESTOR_OAUTH2_TTL=30s) the five
// minutes of 30 s tokens.
func oauth2Run(t *testing.T) (run, ttl time.Duration) {
	run, ttl = 12*time.Second, 2*time.Second
	for _, v := range []struct {
		env string
		d   *time.Duration
	}{{"INGESTOR_OAUTH2_RUN", &run}, {"INGESTOR_OAUTH2_TTL", &ttl}} {
		if s := os.Getenv(v.env); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil {
				t.Fatalf("%s=%q: %v", v.env, s, err)
			}
			*v.d = d
		}
	}
	return run, ttl
}

// TestOAuth2TokensExpireMidRun runs the built daemon with an http_poll
// source on an upstream that takes only OAuth2 tokens (client
// credentials) and refuses a token past its life, for several lives of a
// token, with a processor acking: every record is delivered once, no poll
// fails and none is answered 401 (each token is replaced before it
// expires), and no token or secret appears in the daemon's logs, in
// /status or in check-source's output.
func TestOAuth2TokensExpireMidRun(t *testing.T) {
	t.Parallel() // long and mostly waiting: overlaps the other long tests (make test's wall time)
	run, ttl := oauth2Run(t)
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	auth := &testupstream.OAuth2{ClientID: "ingestor", ClientSecret: "client-s3cret-value", TokenTTL: ttl}
	const total = 600
	srv := testupstream.NewServer(t, testupstream.Options{Total: total, PageSize: 10, OAuth2: auth})
	httpAddr := testsync.FreePort(t)
	pub, ack := testconfig.FreeEndpoints(t)
	cfgPath := writeOAuth2Config(t, dir, httpAddr, pub, ack, srv.URL)
	env := append(os.Environ(), "TICKETS_CLIENT_SECRET="+auth.ClientSecret)

	var mu sync.Mutex
	seen := map[string]int{}
	stop := startProcessor(t, pub, ack, func(_ context.Context, e *processor.Event) error {
		mu.Lock()
		seen[e.Key]++
		mu.Unlock()
		return nil
	})
	defer stop()
	var logs testsync.LockedBuffer
	cmd := exec.Command(bin, "run", "-c", cfgPath)
	cmd.Env, cmd.Stderr = env, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	waitReady(t, httpAddr, cmd)
	began := time.Now()
	testsync.WaitFor(t, "every record delivered", run+time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == total
	})
	// Polls go on, empty now, for the rest of the run: each needs a token.
	testsync.WaitFor(t, "the end of the run", run+time.Minute, func() bool { return time.Since(began) >= run })

	status := httpGet(t, "http://"+httpAddr+"/status")
	checked := checkSourceOutput(t, bin, cfgPath, env)
	st := auth.Stats()
	if want := int(run/(ttl/2)) - 1; st.Issued < want {
		t.Errorf("%d tokens over %s of %s tokens, want at least %d", st.Issued, run, ttl, want)
	}
	if st.Unauthorized != 0 || st.Refused != 0 {
		t.Errorf("%d requests answered 401 (%d with an expired token), %d token requests refused; want none", st.Unauthorized, st.Expired, st.Refused)
	}
	metrics, err := metricsText(httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, `ingestor_source_polls_total{result="error",source="tickets"} 0`) {
		t.Errorf("a poll failed:\n%s", grepLines(metrics, "ingestor_source_polls_total"))
	}
	mu.Lock()
	for key, n := range seen {
		if n != 1 {
			t.Errorf("record %s delivered %d times, want once", key, n)
		}
	}
	mu.Unlock()
	for where, text := range map[string]string{"the daemon's logs": logs.String(), "/status": status, "check-source": checked} {
		for _, secret := range append(st.Tokens, auth.ClientSecret) {
			if strings.Contains(text, secret) {
				t.Errorf("%s holds %q", where, secret)
			}
		}
	}
	t.Logf("%s of %s tokens: %d issued, %d polls, 0 failed", run, ttl, st.Issued, len(srv.Requests()))
}

// writeOAuth2Config writes the config of TestOAuth2TokensExpireMidRun:
// the daemon logs at debug level, and its source tickets polls upstream
// every 100 ms with tokens from upstream's token endpoint, the client
// secret from ${TICKETS_CLIENT_SECRET}.
func writeOAuth2Config(t *testing.T, dir, httpAddr, pub, ack, upstream string) string {
	t.Helper()
	return testconfig.Daemon{Dir: dir, HTTPAddr: httpAddr, JSONLogs: true, Publish: pub, Ack: ack,
		DaemonKeys: `log_level = "debug"`,
		Rest: fmt.Sprintf(`
[source.tickets]
kind = "http_poll"
poll_url = %q
interval = "100ms"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"

[source.tickets.oauth2]
token_url = %q
client_id = "ingestor"
client_secret = "${TICKETS_CLIENT_SECRET}"
scopes = ["tickets.read"]
`, upstream+"/feed", upstream+testupstream.TokenPath)}.Write(t, filepath.Join(dir, "ingestor.toml"))
}

// checkSourceOutput runs check-source on the config's tickets source and
// returns what it printed; it must succeed and trace the token request.
func checkSourceOutput(t *testing.T, bin, cfgPath string, env []string) string {
	t.Helper()
	cmd := exec.Command(bin, "check-source", "tickets", "-c", cfgPath)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "oauth2 token (client_credentials)") {
		t.Errorf("check-source: %v, want it to succeed and trace the token request\n%s", err, out)
	}
	return string(out)
}

// httpGet returns the body of url.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
