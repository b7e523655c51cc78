package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

func runQuarantine(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"quarantine"}, args...), &out, &errb)
	return out.String() + errb.String(), code
}

// TestQuarantineCommand runs a daemon with a webhook source whose sender
// has the wrong secret, behind an admin token: `ingestor quarantine list`
// and `show` find the refused deliveries through the admin endpoints
// (which refuse a request without the token), the signature and the
// token redacted everywhere; then, with the daemon stopped, through the
// queue, and `clear` empties the source's quarantine.
func TestQuarantineCommand(t *testing.T) {
	const (
		adminToken = "0123456789abcdef0123456789abcdef"
		sentSig    = "sha256=00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
		apiKey     = "api-key-SECRET-0003"
	)
	dir := t.TempDir()
	cfgPath, cfg := writeDaemonConfig(t, dir, fmt.Sprintf("admin_token = %q", adminToken), "", fmt.Sprintf(`
[push]
addr = %q

[source.hooks]
kind = "webhook"
signature = "github"
secret = "the-right-secret-0123"
quarantine_size = 3
quarantine_body_bytes = 16
`, testsync.FreePort(t)))
	d, stop := startInProcess(t, cfg)

	for i := range 5 {
		body := fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, strings.Repeat("x", 40))
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+d.PushAddr()+"/ingest/hooks", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Hub-Signature-256", sentSig)
		req.Header.Set("X-Api-Key", apiKey)
		req.Header.Set("X-Request-ID", "bad-"+strconv.Itoa(i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := resp.Body.Close(); err != nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a delivery with the wrong secret was answered %d (close: %v), want 401", resp.StatusCode, err)
		}
	}
	var list []queue.Rejected
	testsync.WaitFor(t, "the last refused delivery in the quarantine", 10*time.Second, func() bool {
		out, code := runQuarantine(t, "list", "-c", cfgPath, "-o", "json")
		if code != 0 {
			t.Fatalf("quarantine list -o json = %d:\n%s", code, out)
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("quarantine list -o json printed %q: %v", out, err)
		}
		return len(list) > 0 && list[0].RequestID == "bad-4"
	})
	if len(list) != 3 || list[2].RequestID != "bad-2" || list[0].Reason != "bad_signature" || list[0].Code != 401 {
		t.Fatalf("quarantine list = %+v, want bad-4 down to bad-2, bad_signature 401", list)
	}

	// The admin endpoints need the token, as /dlq does.
	resp, err := http.Get("http://" + d.HTTPAddr() + "/quarantine")
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /quarantine without the admin token = %d (close: %v), want 401", resp.StatusCode, err)
	}

	out, code := runQuarantine(t, "list", "-c", cfgPath, "-source", "hooks", "-limit", "2")
	if code != 0 || !strings.Contains(out, "bad-4") || !strings.Contains(out, "bad-3") || strings.Contains(out, "bad-2") || !strings.Contains(out, "2 quarantined") {
		t.Fatalf("quarantine list -limit 2 = %d:\n%s", code, out)
	}
	id := strconv.FormatInt(list[0].ID, 10)
	out, code = runQuarantine(t, "show", id, "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "reason:      bad_signature") || !strings.Contains(out, "X-Hub-Signature-256: [redacted]") ||
		!strings.Contains(out, `body (16 bytes, text, truncated):`+"\n"+`{"n":4,"pad":"xx`) || !strings.Contains(out, "request:     POST /ingest/hooks") {
		t.Fatalf("quarantine show %s = %d:\n%s", id, code, out)
	}
	showJSON, code := runQuarantine(t, "show", id, "-o", "json", "-c", cfgPath)
	var e queue.Rejected
	if err := json.Unmarshal([]byte(showJSON), &e); code != 0 || err != nil || string(e.Body) != `{"n":4,"pad":"xx` || !e.Truncated ||
		!strings.Contains(showJSON, `"body_encoding": "text"`) {
		t.Fatalf("quarantine show -o json = %d (%v):\n%s", code, err, showJSON)
	}
	for _, secret := range []string{sentSig, apiKey, "the-right-secret-0123"} {
		if strings.Contains(out+showJSON, secret) {
			t.Errorf("the output holds the secret %q", secret)
		}
	}
	if out, code := runQuarantine(t, "show", "999999", "-c", cfgPath); code != 1 || !strings.Contains(out, "no such quarantined delivery") {
		t.Errorf("quarantine show of an unknown id = %d:\n%s", code, out)
	}

	// clear through the daemon: DELETE /quarantine?source=S.
	if out, code := runQuarantine(t, "clear", "-source", "other", "-c", cfgPath); code != 0 || !strings.Contains(out, "0 quarantined delivery(ies) of other cleared") {
		t.Errorf("quarantine clear through the daemon = %d:\n%s", code, out)
	}

	// With the daemon stopped, quarantine opens the queue itself.
	stop()
	out, code = runQuarantine(t, "list", "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "bad-4") || !strings.Contains(out, "3 quarantined") {
		t.Fatalf("quarantine list offline = %d:\n%s", code, out)
	}
	out, code = runQuarantine(t, "show", id, "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "X-Api-Key: [redacted]") {
		t.Fatalf("quarantine show offline = %d:\n%s", code, out)
	}
	out, code = runQuarantine(t, "clear", "-source", "hooks", "-c", cfgPath)
	if code != 0 || !strings.Contains(out, "3 quarantined delivery(ies) of hooks cleared") {
		t.Fatalf("quarantine clear offline = %d:\n%s", code, out)
	}
	if out, code = runQuarantine(t, "list", "-c", cfgPath); code != 0 || !strings.Contains(out, "0 quarantined") {
		t.Fatalf("quarantine list after clear = %d:\n%s", code, out)
	}
}

// TestQuarantineCommandUsage: malformed invocations are refused with exit
// 2 and a reason, before the config is read.
func TestQuarantineCommandUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage:"},
		{[]string{"purge", "-c", "x.toml"}, `unknown command "purge"`},
		{[]string{"list"}, "-c FILE is required"},
		{[]string{"list", "-c", "x.toml", "-o", "yaml"}, `-o "yaml": want json`},
		{[]string{"list", "-c", "x.toml", "-limit", "0"}, "want a positive number"},
		{[]string{"show", "-c", "x.toml"}, "give exactly one ID"},
		{[]string{"show", "abc", "-c", "x.toml"}, `"abc" is not a quarantined delivery id`},
		{[]string{"clear", "-c", "x.toml"}, "-source S is required"},
	} {
		if out, code := runQuarantine(t, tc.args...); code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("quarantine %v = %d:\n%s\nwant exit 2 with %q", tc.args, code, out, tc.want)
		}
	}
}
