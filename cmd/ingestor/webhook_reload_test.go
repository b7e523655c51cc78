package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestWebhookSecretRotationByReload rotates a GitHub webhook's secret the
// way an operator does, with senders posting all along: the new secret is
// added in front of the old (reload), the senders switch to it, the old
// one is removed (reload). Every delivery is answered 202 and reaches the
// processor: a reload drops no request. The match counter of the removed
// secret's position goes away with it.
func TestWebhookSecretRotationByReload(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	bin := buildBinary(t, t.TempDir())
	source := func(secrets string) string {
		return fmt.Sprintf("\n[source.gh]\nkind = \"webhook\"\nsignature = \"github\"\nsecrets = %s\n", secrets)
	}
	d := newHookDaemon(t, bin, "info", 100000, source(`["old-secret-0123"]`))
	d.start()
	d.runProcessor()
	base, err := os.ReadFile(d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	head := strings.TrimSuffix(string(base), source(`["old-secret-0123"]`))
	reload := func(secrets string) string {
		t.Helper()
		if err := os.WriteFile(d.cfg, []byte(head+source(secrets)), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if code := run([]string{"reload", "-c", d.cfg}, &out, &errOut); code != 0 {
			t.Fatalf("ingestor reload = %d\n%s%s", code, out.String(), errOut.String())
		}
		return out.String()
	}

	var secret atomic.Pointer[string]
	old := "old-secret-0123"
	secret.Store(&old)
	var (
		sent, refused atomic.Int64
		stop          = make(chan struct{})
		wg            sync.WaitGroup
		mu            sync.Mutex
		failures      []string
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"n":%d}`, i)
				id := fmt.Sprintf("w%d-%d", w, i)
				code, _, answer, err := postErr(d.pushURL+"gh", body, "X-Hub-Signature-256", "sha256="+hexHMAC(*secret.Load(), body),
					"X-GitHub-Delivery", id, "X-GitHub-Event", "push")
				sent.Add(1)
				if err != nil || code != http.StatusAccepted {
					refused.Add(1)
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s: %d %s %v", id, code, answer, err))
					mu.Unlock()
				}
			}
		}()
	}
	waitSent := func(n int64) {
		t.Helper()
		target := sent.Load() + n
		testsync.WaitFor(t, fmt.Sprintf("%d more deliveries", n), 30*time.Second, func() bool { return sent.Load() >= target })
	}
	waitSent(50)
	if out := reload(`["new-secret-4567", "old-secret-0123"]`); !strings.Contains(out, "restart    1  gh") {
		t.Fatalf("adding a secret: %s", out)
	}
	waitSent(50)
	newSecret := "new-secret-4567"
	secret.Store(&newSecret)
	waitSent(50)
	if out := reload(`["new-secret-4567"]`); !strings.Contains(out, "restart    1  gh") {
		t.Fatalf("removing a secret: %s", out)
	}
	waitSent(50)
	close(stop)
	wg.Wait()
	if n := refused.Load(); n != 0 {
		t.Fatalf("%d of %d deliveries were not answered 202 across the reloads: %v", n, sent.Load(), failures[:min(len(failures), 5)])
	}
	total := int(sent.Load())
	testsync.WaitFor(t, "every delivery at the processor", 30*time.Second, func() bool { return d.seenKeys() == total })
	t.Logf("%d deliveries across two reloads, all 202 and delivered", total)

	metrics, err := metricsText(d.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, `ingestor_webhook_signature_matches_total{secret="0",source="gh"}`) {
		t.Errorf("no match series for the remaining secret:\n%s", grepLines(metrics, "signature_matches"))
	}
	if strings.Contains(metrics, `ingestor_webhook_signature_matches_total{secret="1",source="gh"}`) {
		t.Errorf("the removed secret's series is still exported:\n%s", grepLines(metrics, "signature_matches"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
