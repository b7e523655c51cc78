package main

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
)

// hookDaemon is the built daemon with a push listener, in a temporary
// directory.
type hookDaemon struct {
	t                  *testing.T
	bin, dir, cfg      string
	httpAddr, pushAddr string
	pub, ack           string
	// pushURL is http://PUSHADDR/ingest/.
	pushURL       string
	logs          testsync.LockedBuffer
	cmd           *exec.Cmd
	processorMu   sync.Mutex
	seen          map[string]int // source/key -> deliveries
	stopProcessor func()
}

// newHookDaemon writes the config: the push listener on loopback, the log
// level, publish.max_pending_events and sourcesTOML.
func newHookDaemon(t *testing.T, bin, logLevel string, maxPending int, sourcesTOML string) *hookDaemon {
	d := &hookDaemon{t: t, bin: bin, dir: t.TempDir(), httpAddr: testsync.FreePort(t), pushAddr: testsync.FreePort(t),
		pub: "tcp://" + testsync.FreePort(t), ack: "tcp://" + testsync.FreePort(t), seen: map[string]int{}}
	d.pushURL = "http://" + d.pushAddr + "/ingest/"
	d.cfg = filepath.Join(d.dir, "ingestor.toml")
	text := daemonTOML(d.dir, d.httpAddr, d.pub, d.ack, fmt.Sprintf("log_level = %q", logLevel), fmt.Sprintf(`ack_timeout = "2s"
max_pending_events = %d`, maxPending)) + fmt.Sprintf(`
[push]
addr = %q
`, d.pushAddr) + sourcesTOML
	if err := os.WriteFile(d.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if d.cmd != nil && d.cmd.ProcessState == nil {
			_ = d.cmd.Process.Kill()
			_ = d.cmd.Wait() // killed: its exit status is the signal
		}
		if d.stopProcessor != nil {
			d.stopProcessor()
		}
		if t.Failed() {
			t.Logf("daemon logs:\n%s", tail(d.logs.String()))
		}
	})
	return d
}

// start runs the daemon and waits until it is ready.
func (d *hookDaemon) start() {
	d.t.Helper()
	d.cmd = exec.Command(d.bin, "run", "-c", d.cfg)
	d.cmd.Stderr = &d.logs
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	waitReady(d.t, d.httpAddr, d.cmd)
}

// stop sends SIGTERM and checks the daemon exits cleanly.
func (d *hookDaemon) stop() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		d.t.Fatal(err)
	}
	if err := d.cmd.Wait(); err != nil {
		d.t.Fatalf("graceful stop after SIGTERM: %v", err)
	}
}

// kill sends SIGKILL.
func (d *hookDaemon) kill() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		d.t.Fatal(err)
	}
	_ = d.cmd.Wait() // killed: its exit status is the signal
}

// runProcessor starts a processor that acks every event and counts its
// deliveries by source/key.
func (d *hookDaemon) runProcessor() {
	d.t.Helper()
	stop := startProcessor(d.t, d.pub, d.ack, func(_ context.Context, ev *processor.Event) error {
		d.processorMu.Lock()
		defer d.processorMu.Unlock()
		d.seen[ev.Source+"/"+ev.Key]++
		return nil
	})
	d.stopProcessor = func() {
		stop()
		d.stopProcessor = nil
	}
}

func (d *hookDaemon) seenKeys() int {
	d.processorMu.Lock()
	defer d.processorMu.Unlock()
	return len(d.seen)
}

// ledger opens queue.db read-only.
func (d *hookDaemon) ledger() *sql.DB {
	d.t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(d.dir, "data", "queue.db")+"?mode=ro")
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { _ = db.Close() })
	return db
}

// hookClient is a keep-alive HTTP client for many concurrent senders.
var hookClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}, Timeout: 60 * time.Second}

// post sends body to url with headers (name, value pairs) and reads the
// answer, failing t on a transport error.
func post(t *testing.T, url, body string, headers ...string) (int, http.Header, string) {
	t.Helper()
	code, h, b, err := postErr(url, body, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return code, h, b
}

// postErr is post for other goroutines than the test's.
func postErr(url, body string, headers ...string) (int, http.Header, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, "", err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := hookClient.Do(req)
	if err != nil {
		return 0, nil, "", fmt.Errorf("POST %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, "", fmt.Errorf("POST %s: read the answer: %w", url, err)
	}
	return resp.StatusCode, resp.Header, string(b), nil
}

func hexHMAC(secret, msg string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

// TestWebhookThroughTheBinary runs the built daemon with webhook sources
// and real HTTP clients: every answer, each signature preset, dedupe under
// 100 concurrent senders, 429 under saturation and no loss on retry, and a
// kill -9 between commit and answer.
func TestWebhookThroughTheBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	bin := buildBinary(t, t.TempDir())
	t.Run("answers", func(t *testing.T) { webhookAnswers(t, bin) })
	t.Run("concurrent_same_keys", func(t *testing.T) { webhookConcurrentSameKeys(t, bin) })
	t.Run("saturation", func(t *testing.T) { webhookSaturation(t, bin) })
	t.Run("kill_before_answer", func(t *testing.T) { webhookKillBeforeAnswer(t, bin) })
}

const hookSecret = "whsec_0123456789abcdef"

func webhookAnswers(t *testing.T, bin string) {
	t.Setenv("HOOK_SECRET", hookSecret)
	d := newHookDaemon(t, bin, "debug", 100000, `
[source.app]
kind = "webhook"
token = "app-token-0123456789"
id_field = "id"
required_fields = ["type"]
max_body_bytes = 256

[source.gh]
kind = "webhook"
signature = "github"
secret = "${HOOK_SECRET}"

[source.stripe]
kind = "webhook"
signature = "stripe"
secret = "${HOOK_SECRET}"

[source.slack]
kind = "webhook"
signature = "slack"
secret = "${HOOK_SECRET}"

[source.generic]
kind = "webhook"
signature = "hmac_sha256"
secret = "${HOOK_SECRET}"
signature_header = "X-Signature"
`)
	d.start()
	d.runProcessor()
	app := d.pushURL + "app"
	auth := []string{"Authorization", "Bearer app-token-0123456789"}
	check := func(what string, code int, h http.Header, body string, want int, inBody string) {
		t.Helper()
		if code != want || !strings.Contains(body, inBody) || h.Get("X-Request-ID") == "" {
			t.Errorf("%s: answered %d %s (X-Request-ID %q), want %d with %q", what, code, body, h.Get("X-Request-ID"), want, inBody)
		}
	}
	code, h, body := post(t, app, `{"id":"a1","type":"t"}`, append(auth, "X-Request-ID", "trace-1")...)
	check("new", code, h, body, http.StatusAccepted, `"request_id":"trace-1"`)
	var first struct {
		ID int64 `json:"id"`
	}
	if err := json.Unmarshal([]byte(body), &first); err != nil || first.ID < 1 {
		t.Fatalf("new event answer %s: %v", body, err)
	}
	code, h, body = post(t, app, `{"id":"a1","type":"t"}`, auth...)
	check("duplicate", code, h, body, http.StatusOK, fmt.Sprintf(`"id":%d,"idempotency_key":"a1"`, first.ID))
	code, h, body = post(t, app, `{"id":"a2"`, auth...)
	check("invalid JSON", code, h, body, http.StatusBadRequest, "invalid JSON")
	code, h, body = post(t, app, `{"id":"a2"}`, auth...)
	check("missing field", code, h, body, http.StatusBadRequest, `required field \"type\"`)
	code, h, body = post(t, app, `{"id":"a2","type":"`+strings.Repeat("x", 300)+`"}`, auth...)
	check("too large", code, h, body, http.StatusRequestEntityTooLarge, "max_body_bytes")
	code, h, body = post(t, app, `a=1`, append(auth, "Content-Type", "application/x-www-form-urlencoded")...)
	check("not JSON", code, h, body, http.StatusUnsupportedMediaType, "Content-Type")
	code, h, body = post(t, app, `{"id":"a2","type":"t"}`)
	check("no token", code, h, body, http.StatusUnauthorized, "missing Authorization")
	code, h, body = post(t, app, `{"id":"a2","type":"t"}`, "Authorization", "Bearer wrong-token-0123456789")
	check("wrong token", code, h, body, http.StatusForbidden, "wrong bearer token")
	// The listener, not a source, answers for an unknown source.
	if code, _, body = post(t, d.pushURL+"nosuch", `{}`); code != http.StatusNotFound || !strings.Contains(body, `no push source \"nosuch\"`) {
		t.Errorf("unknown source: answered %d %s", code, body)
	}
	resp, err := http.Get(app)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /ingest/app answered %d, want 405", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/events/%d", app, first.ID), nil)
	req.Header.Set(auth[0], auth[1])
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"idempotency_key":"a1"`) {
		t.Errorf("status look-up answered %d %s", resp.StatusCode, b)
	}

	// Each signature preset: a real example, a tampered body, an expired
	// timestamp.
	ev := `{"id":"evt_1","type":"ping"}`
	bad := `{"id":"evt_1","type":"pong"}`
	now := time.Now().Unix()
	gh := "sha256=" + hexHMAC(hookSecret, ev)
	code, h, body = post(t, d.pushURL+"gh", ev, "X-Hub-Signature-256", gh, "X-GitHub-Delivery", "gh-delivery-1")
	check("github", code, h, body, http.StatusAccepted, `"idempotency_key":"gh-delivery-1"`)
	code, h, body = post(t, d.pushURL+"gh", bad, "X-Hub-Signature-256", gh)
	check("github tampered", code, h, body, http.StatusUnauthorized, "does not match")
	stripe := func(ts int64) string {
		return fmt.Sprintf("t=%d,v1=%s", ts, hexHMAC(hookSecret, fmt.Sprintf("%d.%s", ts, ev)))
	}
	code, h, body = post(t, d.pushURL+"stripe", ev, "Stripe-Signature", stripe(now))
	check("stripe", code, h, body, http.StatusAccepted, `"idempotency_key":"evt_1"`)
	code, h, body = post(t, d.pushURL+"stripe", bad, "Stripe-Signature", stripe(now))
	check("stripe tampered", code, h, body, http.StatusUnauthorized, "does not match")
	code, h, body = post(t, d.pushURL+"stripe", ev, "Stripe-Signature", stripe(now-3600))
	check("stripe expired", code, h, body, http.StatusUnauthorized, "tolerance")
	slack := func(ts int64) []string {
		return []string{"X-Slack-Request-Timestamp", strconv.FormatInt(ts, 10), "X-Slack-Signature", "v0=" + hexHMAC(hookSecret, fmt.Sprintf("v0:%d:%s", ts, ev))}
	}
	code, h, body = post(t, d.pushURL+"slack", ev, slack(now)...)
	check("slack", code, h, body, http.StatusAccepted, `"status":"queued"`)
	code, h, body = post(t, d.pushURL+"slack", bad, slack(now)...)
	check("slack tampered", code, h, body, http.StatusUnauthorized, "does not match")
	code, h, body = post(t, d.pushURL+"slack", ev, slack(now-3600)...)
	check("slack expired", code, h, body, http.StatusUnauthorized, "tolerance")
	code, h, body = post(t, d.pushURL+"generic", ev, "X-Signature", "sha256="+hexHMAC(hookSecret, ev))
	check("hmac_sha256", code, h, body, http.StatusAccepted, `"status":"queued"`)
	code, h, body = post(t, d.pushURL+"generic", bad, "X-Signature", hexHMAC(hookSecret, ev))
	check("hmac_sha256 tampered", code, h, body, http.StatusUnauthorized, "does not match")

	testsync.WaitFor(t, "the processor to get the 5 accepted events", 30*time.Second, func() bool { return d.seenKeys() == 5 })
	d.stop()
	if logs := d.logs.String(); strings.Contains(logs, hookSecret) || strings.Contains(logs, "app-token-0123456789") || !strings.Contains(logs, "trace-1") {
		t.Errorf("the logs hold a secret, or not the request id trace-1")
	}
}

// webhookConcurrentSameKeys has 100 senders post the same 1,000 keys, each
// in its own order: the ledger ends with exactly one row per key, and the
// processor saw every key.
func webhookConcurrentSameKeys(t *testing.T, bin string) {
	const senders, keys = 100, 1000
	d := newHookDaemon(t, bin, "info", 1_000_000, `
[source.hooks]
kind = "webhook"
id_field = "id"
`)
	d.start()
	d.runProcessor()
	var news, dups atomic.Int64
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for _, k := range rand.Perm(keys) {
				code, _, body, err := postErr(d.pushURL+"hooks", fmt.Sprintf(`{"id":"k%d","sender":%d}`, k, s))
				switch {
				case err != nil:
					t.Error(err)
					return
				case code == http.StatusAccepted:
					news.Add(1)
				case code == http.StatusOK:
					dups.Add(1)
				default:
					t.Errorf("key k%d: answered %d %s", k, code, body)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d new, %d duplicates", news.Load(), dups.Load())
	if news.Load() != keys || dups.Load() != (senders-1)*keys {
		t.Errorf("%d answered 202 and %d 200, want %d and %d", news.Load(), dups.Load(), keys, (senders-1)*keys)
	}
	testsync.WaitFor(t, "the processor to see every key", time.Minute, func() bool { return d.seenKeys() == keys })
	d.stop()
	var rows, distinct int
	if err := d.ledger().QueryRow(`SELECT count(*), count(DISTINCT key) FROM events WHERE source = 'hooks'`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != keys || distinct != keys {
		t.Errorf("ledger holds %d rows, %d distinct keys; want %d of each", rows, distinct, keys)
	}
}

// webhookSaturation fills the queue to max_pending_events with no
// processor: senders get 429 with Retry-After and retry; once a processor
// runs, every event gets in and is delivered.
func webhookSaturation(t *testing.T, bin string) {
	const senders, perSender, maxPending = 10, 50, 100
	d := newHookDaemon(t, bin, "info", maxPending, `
[source.hooks]
kind = "webhook"
id_field = "id"
`)
	d.start()
	var busy atomic.Int64
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := range perSender {
				for {
					code, h, body, err := postErr(d.pushURL+"hooks", fmt.Sprintf(`{"id":"s%d-%d"}`, s, i))
					if err != nil {
						t.Error(err)
						return
					}
					if code == http.StatusAccepted || code == http.StatusOK {
						break
					}
					if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
						t.Errorf("answered %d %s (Retry-After %q), want 202 or 429 with Retry-After", code, body, h.Get("Retry-After"))
						return
					}
					busy.Add(1)
					secs, _ := strconv.Atoi(h.Get("Retry-After"))
					time.Sleep(time.Duration(secs) * time.Second / 10) // a sender's backoff, shortened
				}
			}
		})
	}
	// The queue stays full until a processor acks: start one once senders
	// are refused; they keep retrying as told meanwhile.
	testsync.WaitFor(t, "a 429 with the queue at max_pending_events", 30*time.Second, func() bool { return busy.Load() > 0 })
	d.runProcessor()
	wg.Wait()
	testsync.WaitFor(t, "the processor to see every event", time.Minute, func() bool { return d.seenKeys() == senders*perSender })
	d.stop()
	var rows int
	if err := d.ledger().QueryRow(`SELECT count(*) FROM events WHERE source = 'hooks'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests answered 429; %d events stored", busy.Load(), rows)
	if rows != senders*perSender {
		t.Errorf("ledger holds %d events, want %d", rows, senders*perSender)
	}
}

// webhookKillBeforeAnswer sends a request from a raw TCP client that does
// not read the answer, waits until the event's row is in the ledger,
// SIGKILLs the daemon, starts it again and retries: the retry is answered
// 200 with the stored event's id.
func webhookKillBeforeAnswer(t *testing.T, bin string) {
	d := newHookDaemon(t, bin, "info", 1000, `
[source.hooks]
kind = "webhook"
`)
	d.start()
	conn, err := net.Dial("tcp", d.pushAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	body := `{"order":42}`
	if _, err := fmt.Fprintf(conn, "POST /ingest/hooks HTTP/1.1\r\nHost: x\r\nIdempotency-Key: order-42\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	db := d.ledger()
	var seq int64
	testsync.WaitFor(t, "the event's ledger row", 30*time.Second, func() bool {
		return db.QueryRow(`SELECT id FROM events WHERE source = 'hooks' AND key = 'order-42'`).Scan(&seq) == nil
	})
	d.kill()
	d.start()
	code, _, answer := post(t, d.pushURL+"hooks", body, "Idempotency-Key", "order-42")
	if code != http.StatusOK || !strings.Contains(answer, fmt.Sprintf(`"id":%d,"idempotency_key":"order-42"`, seq)) {
		t.Errorf("retry after kill -9 answered %d %s, want 200 with id %d", code, answer, seq)
	}
	// The unread answer was on its way: the connection holds a 202 or was
	// cut, never another code.
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil && resp.StatusCode != http.StatusAccepted {
		t.Errorf("the unread answer was %d, want 202", resp.StatusCode)
	}
	d.stop()
}
