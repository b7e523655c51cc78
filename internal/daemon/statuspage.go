package daemon

import (
	"crypto/sha256"
	_ "embed" // the status page
	"encoding/base64"
	"net/http"
	"strings"
)

// statusPage is the page GET / serves: the status table, refreshed by its
// own script from GET /status. It loads nothing else, so it works offline.
//
//go:embed status.html
var statusPage []byte

// statusPageCSP lets the page run only its own inline script and style
// (by their hashes) and fetch only from the daemon: the texts it shows
// (errors, cursors) come from upstreams and are set as text, and even
// markup slipped into them could run nothing.
var statusPageCSP = "default-src 'none'; script-src " + inlineHash(statusPage, "<script>", "</script>") +
	"; style-src " + inlineHash(statusPage, "<style>", "</style>") +
	"; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// inlineHash returns the CSP source of the content between open and close
// in page: 'sha256-BASE64'. The page is built in; a missing tag is a bug
// that every test of the page shows.
func inlineHash(page []byte, open, close string) string {
	_, rest, ok := strings.Cut(string(page), open)
	body, _, ok2 := strings.Cut(rest, close)
	if !ok || !ok2 {
		panic("status.html has no " + open + " element")
	}
	sum := sha256.Sum256([]byte(body))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// handlePage serves GET /, the status page.
func (d *Daemon) handlePage(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", statusPageCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	if _, err := w.Write(statusPage); err != nil {
		d.log.Debug("write status page", "err", err) // the client went away
	}
}
