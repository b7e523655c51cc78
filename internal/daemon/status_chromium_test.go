package daemon

import (
	"bytes"
	"context"
	"html"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// chromium runs Debian's chromium headless with args and returns its
// standard output; make test-deps installs it, so a missing one fails.
func chromium(t *testing.T, profile string, args ...string) []byte {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (make test-deps installs Debian's chromium package): %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
		"--user-data-dir=" + profile, "--virtual-time-budget=5000"}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	// Chromium writes its caches under HOME: keep them in the test's dir.
	cmd.Env = append(os.Environ(), "HOME="+profile)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.Bytes()
}

var (
	rowTag    = regexp.MustCompile(`(?s)<tr\s([^>]*)>(.*?)</tr>`)
	attribute = regexp.MustCompile(`([a-z-]+)="([^"]*)"`)
	cellText  = regexp.MustCompile(`(?s)<td class="([^"]*)"[^>]*>(.*?)</td>`)
	tags      = regexp.MustCompile(`<[^>]*>`)
)

// pageRow is a source's row of the page's table as Chromium rendered it,
// and the text of the messages row under it.
type pageRow struct {
	class, state, why, messages string
}

// pageRows reads the rows of the rendered DOM by their data-source.
func pageRows(dom string) map[string]pageRow {
	rows := map[string]pageRow{}
	for _, m := range rowTag.FindAllStringSubmatch(dom, -1) {
		attrs := map[string]string{}
		for _, a := range attribute.FindAllStringSubmatch(m[1], -1) {
			attrs[a[1]] = html.UnescapeString(a[2])
		}
		if name, ok := attrs["data-message-of"]; ok {
			r := rows[name]
			r.messages = html.UnescapeString(tags.ReplaceAllString(m[2], " "))
			rows[name] = r
			continue
		}
		name, ok := attrs["data-source"]
		if !ok {
			continue
		}
		r := rows[name]
		r.class, r.state = attrs["class"], attrs["data-state"]
		for _, c := range cellText.FindAllStringSubmatch(m[2], -1) {
			if c[1] == "why" {
				r.why = html.UnescapeString(c[2])
			}
		}
		rows[name] = r
	}
	return rows
}

// TestStatusPageInChromium loads GET / of a daemon with a source in each
// state into headless Chromium: once its script has fetched /status, the
// table has a row per source with its state, the failing one is marked
// and shows its error, and a screenshot is saved.
func TestStatusPageInChromium(t *testing.T) {
	r := startStatusRig(t)
	url := "http://" + r.h.d.HTTPAddr() + "/"
	dir := t.TempDir()
	dom := string(chromium(t, filepath.Join(dir, "profile"), "--dump-dom", url))
	if !strings.Contains(dom, `data-loaded="true"`) {
		t.Fatalf("the page's script never rendered /status:\n%s", dom)
	}
	rows := pageRows(dom)
	for name, want := range r.feeds.Want {
		row, ok := rows[name]
		if !ok {
			t.Errorf("source %q has no row in the page", name)
			continue
		}
		if row.state != want[0] || !strings.Contains(row.why, want[1]) {
			t.Errorf("source %q: state %q, why %q in the page; want %q and %q", name, row.state, row.why, want[0], want[1])
		}
	}
	if len(rows) != len(r.feeds.Want) {
		t.Errorf("%d rows in the page, want %d", len(rows), len(r.feeds.Want))
	}
	if row := rows["broken"]; !strings.Contains(row.class, "failing") || !strings.Contains(row.messages, "status 404") {
		t.Errorf("failing source's row: class %q, messages %q; want it marked failing with its 404", row.class, row.messages)
	}
	if row := rows["limited"]; !strings.Contains(row.messages, "status 429") {
		t.Errorf("waiting source's messages %q, want what the upstream said (status 429)", row.messages)
	}
	if !strings.Contains(dom, "<polyline") {
		t.Error("no sparkline in the page")
	}

	shot := filepath.Join(dir, "status.png")
	chromium(t, filepath.Join(dir, "profile"), "--screenshot="+shot, "--window-size=1200,800", url)
	png, err := os.ReadFile(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10<<10 {
		t.Fatalf("screenshot %s is not a PNG of a page (%d bytes)", shot, len(png))
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
	if out := os.Getenv("INGESTOR_SCREENSHOT_DIR"); out != "" {
		if err := os.MkdirAll(out, 0o755); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(out, "status-page.png")
		if err := os.WriteFile(dst, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot copied to %s", dst)
	}
}

// TestStatusPageBehindAProxy loads the page through a reverse proxy that
// serves the daemon under /ops/ingestor/, as an ingress with a sub-path
// does: the page's script fetches the status relative to the page, so the
// table fills through the proxy. (It fetched the absolute /status, which
// the proxy does not serve, and the page stayed empty.)
func TestStatusPageBehindAProxy(t *testing.T) {
	h := startDaemon(t, "", "", `
[source.demo]
kind = "demo"
interval = "200ms"
`)
	target, err := url.Parse("http://" + h.d.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(http.StripPrefix("/ops/ingestor", httputil.NewSingleHostReverseProxy(target)))
	t.Cleanup(proxy.Close)
	dom := string(chromium(t, filepath.Join(t.TempDir(), "profile"), "--dump-dom", proxy.URL+"/ops/ingestor/"))
	if !strings.Contains(dom, `data-loaded="true"`) {
		t.Fatalf("the page's script never rendered the status through the proxy:\n%s", dom)
	}
	if _, ok := pageRows(dom)["demo"]; !ok {
		t.Errorf("source demo has no row in the page served through the proxy")
	}
}
