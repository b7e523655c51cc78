package daemon

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// walkthroughBlock returns the fenced block of language lang that follows
// the marker <!-- walkthrough: name --> in README.md.
func walkthroughBlock(t *testing.T, readme, name, lang string) string {
	t.Helper()
	marker := "<!-- walkthrough: " + name + " -->\n```" + lang + "\n"
	_, rest, ok := strings.Cut(readme, marker)
	block, _, closed := strings.Cut(rest, "\n```\n")
	if !ok || !closed {
		t.Fatalf("README.md has no %q followed by a ```%s block", "<!-- walkthrough: "+name+" -->", lang)
	}
	return block
}

// statusColumns are the columns of `ingestor status` that
// TestFirstFeedWalkthrough compares with README's: those that do not
// depend on the clock.
var statusColumns = []string{"SOURCE", "KIND", "CURSOR", "REC/MIN", "BYTES/MIN", "PENDING", "DLQ", "RESTARTS"}

// cellGap separates the cells of an `ingestor status` table.
var cellGap = regexp.MustCompile(`\s{2,}`)

// statusRow returns the cells of the row of source in an `ingestor status`
// table, by column; nil when the table has no such row.
func statusRow(table, source string) map[string]string {
	var header []string
	for _, line := range strings.Split(table, "\n") {
		cells := cellGap.Split(strings.TrimSpace(line), -1)
		switch {
		case len(cells) > 0 && cells[0] == "SOURCE":
			header = cells
		case header != nil && len(cells) == len(header) && cells[0] == source:
			row := map[string]string{}
			for i, c := range cells {
				row[header[i]] = c
			}
			return row
		}
	}
	return nil
}

// walkthroughAPI serves README's example response at /v1/orders as the
// walkthrough describes its API: the orders updated after
// ?updated_since=, all of them without it, as the very bytes printed when
// that is all of them. It records the cursors it was asked for.
type walkthroughAPI struct {
	body []byte
	mu   sync.Mutex
	asks []string
}

func (a *walkthroughAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/orders" {
		http.NotFound(w, r)
		return
	}
	since := r.URL.Query().Get("updated_since")
	a.mu.Lock()
	a.asks = append(a.asks, since)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	var page struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.Unmarshal(a.body, &page); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	newer := slices.DeleteFunc(slices.Clone(page.Data), func(o map[string]any) bool {
		at, _ := o["updated_at"].(string)
		return at <= since
	})
	if len(newer) == len(page.Data) {
		if _, err := w.Write(a.body); err != nil {
			return // the daemon went away: its poll fails and is retried
		}
		return
	}
	page.Data = newer
	if err := json.NewEncoder(w).Encode(page); err != nil {
		return // as above
	}
}

// askedFor reports whether the API was asked for the orders after cursor.
func (a *walkthroughAPI) askedFor(cursor string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Contains(a.asks, cursor)
}

// TestFirstFeedWalkthrough runs README's "Your first feed in five
// minutes" as a user following it would, with what the README marks:
// its response is served by a local API in place of
// https://api.example.com, its config is saved as first-feed.toml with the
// daemon's three addresses moved to free ports, bin/ingestor and
// bin/processor are built (as make build does), and its commands run in
// that directory through sh, those ending in & in the background. Then
// what the README says the user sees must be seen: validate's line, the
// source's row in `ingestor status` (in the columns that do not depend on
// the clock) and received.txt. Last, as the README says, both are stopped
// and started again, and the daemon asks the API for the orders after its
// durable cursor and delivers nothing twice.
func TestFirstFeedWalkthrough(t *testing.T) {
	doc := readWalkthrough(t)
	api := &walkthroughAPI{body: []byte(doc.response)}
	srv := httptest.NewServer(api)
	defer srv.Close()
	w := setUpWalkthrough(t, doc, srv.URL)

	procs := w.start()
	got := w.waitForStatus(doc.status)
	w.checkStatusPage()
	wantLines := strings.Split(doc.received, "\n")
	slices.Sort(wantLines)
	if got := w.received(); !slices.Equal(got, wantLines) {
		t.Errorf("received.txt holds %q, README shows %q", got, doc.received)
	}

	// Stopped and started again, the daemon resumes from its durable
	// cursor: it asks for the orders after it and delivers nothing twice.
	w.stop(procs)
	cursor := got["CURSOR"]
	api.mu.Lock()
	api.asks = nil
	api.mu.Unlock()
	procs = w.start()
	testsync.WaitFor(t, "a poll from the durable cursor after the restart", 60*time.Second, func() bool {
		return api.askedFor(cursor)
	})
	w.stop(procs)
	if got := w.received(); !slices.Equal(got, wantLines) {
		t.Errorf("after the restart received.txt holds %q, want README's %q only", got, doc.received)
	}
}

// walkthroughDoc is what README's walkthrough marks: the API's response
// (as saved to a file), the config, the commands, the status and
// received.txt the user sees, and what validate prints.
type walkthroughDoc struct {
	response, config, commands string
	status, received           string
	validated                  string
}

// readWalkthrough reads the walkthrough's blocks from README.md.
func readWalkthrough(t *testing.T) walkthroughDoc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	doc := walkthroughDoc{
		response: walkthroughBlock(t, readme, "response", "json") + "\n", // as saved to a file
		config:   walkthroughBlock(t, readme, "config", "toml"),
		commands: walkthroughBlock(t, readme, "commands", "sh"),
		status:   walkthroughBlock(t, readme, "status", "text"),
		received: walkthroughBlock(t, readme, "received", "text"),
	}
	validated := regexp.MustCompile("`validate` prints `([^`]+)`").FindStringSubmatch(readme)
	if validated == nil {
		t.Fatal("README.md does not say what `validate` prints")
	}
	doc.validated = validated[1]
	return doc
}

// walkthrough is a directory set up as the user following README's
// walkthrough has it, and the commands they run there.
type walkthrough struct {
	t   *testing.T
	dir string
	// lines are the commands: validate, two in the background and status.
	lines     []string
	validated string
	// httpAddr is the daemon's ops listener.
	httpAddr string
}

// setUpWalkthrough saves the walkthrough's config as first-feed.toml in a
// new directory, with the API at apiURL and the daemon's three addresses
// moved to free ports, builds bin/ingestor and bin/processor there, and
// reads the commands, moved the same way.
func setUpWalkthrough(t *testing.T, doc walkthroughDoc, apiURL string) *walkthrough {
	t.Helper()
	w := &walkthrough{t: t, validated: doc.validated, httpAddr: testsync.FreePort(t)}
	moves := []string{
		"https://api.example.com", apiURL,
		"127.0.0.1:9464", w.httpAddr,
		"tcp://127.0.0.1:5557", "tcp://" + testsync.FreePort(t),
		"tcp://127.0.0.1:5558", "tcp://" + testsync.FreePort(t),
	}
	for i := 0; i < len(moves); i += 2 {
		if !strings.Contains(doc.config, moves[i]) {
			t.Fatalf("the walkthrough's config does not hold %s, which the test moves:\n%s", moves[i], doc.config)
		}
	}
	move := strings.NewReplacer(moves...)

	w.dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(w.dir, "first-feed.toml"), []byte(move.Replace(doc.config)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(w.dir, "bin")+string(filepath.Separator),
		"github.com/ingestorhq/ingestor/cmd/ingestor", "github.com/ingestorhq/ingestor/cmd/processor")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, line := range strings.Split(move.Replace(doc.commands), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			w.lines = append(w.lines, line)
		}
	}
	if len(w.lines) != 4 || !strings.Contains(w.lines[0], " validate ") || !strings.Contains(w.lines[3], " status ") {
		t.Fatalf("the walkthrough's commands are not validate, two in the background and status:\n%s", doc.commands)
	}
	return w
}

// logs returns the daemon's and the processor's logs, for a failure.
func (w *walkthrough) logs() string {
	var s strings.Builder
	for _, f := range []string{"daemon.log", "processor.log"} {
		b, err := os.ReadFile(filepath.Join(w.dir, f))
		fmt.Fprintf(&s, "--- %s (%v):\n%s\n", f, err, b)
	}
	return s.String()
}

// run runs one command line as the user would: the background ones are
// returned to be stopped, the others must succeed.
func (w *walkthrough) run(line string) (background *testsync.Process, out string, err error) {
	if cmd, ok := strings.CutSuffix(line, "&"); ok {
		sh := exec.Command("sh", "-c", "exec "+cmd)
		sh.Dir = w.dir
		p, err := testsync.StartProcess(sh)
		return p, "", err
	}
	sh := exec.Command("sh", "-c", line)
	sh.Dir = w.dir
	b, err := sh.CombinedOutput()
	return nil, string(b), err
}

// start runs the commands but the last, status, and returns the processes
// they left in the background.
func (w *walkthrough) start() []*testsync.Process {
	t := w.t
	t.Helper()
	var procs []*testsync.Process
	for _, line := range w.lines[:3] {
		p, out, err := w.run(line)
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		if p != nil {
			procs = append(procs, p)
			t.Cleanup(func() {
				if err := p.Stop(15 * time.Second); err != nil {
					t.Errorf("%s: %v", line, err)
				}
			})
		} else if !strings.Contains(out, w.validated) {
			t.Fatalf("%s printed %q, README says %q", line, out, w.validated)
		}
	}
	return procs
}

// stop stops procs as `kill %1 %2` does, SIGTERM, and checks that each
// drained and exited 0.
func (w *walkthrough) stop(procs []*testsync.Process) {
	w.t.Helper()
	for _, p := range procs {
		if err := p.Stop(30 * time.Second); err != nil || p.Err() != nil {
			w.t.Fatalf("stop: %v, exit %v\n%s", err, p.Err(), w.logs())
		}
	}
}

// waitForStatus waits until `ingestor status` shows the row of source
// orders of README's status block wantStatus, checks it in the columns
// that do not depend on the clock, and returns it.
func (w *walkthrough) waitForStatus(wantStatus string) map[string]string {
	t := w.t
	t.Helper()
	want := statusRow(wantStatus, "orders")
	if want == nil {
		t.Fatalf("README's status block has no row of source orders:\n%s", wantStatus)
	}
	var got map[string]string
	var table string
	testsync.WaitFor(t, "the status row of README", 90*time.Second, func() bool {
		_, out, err := w.run(w.lines[3])
		table = out
		if got = statusRow(out, "orders"); err != nil || got == nil {
			return false
		}
		return got["REC/MIN"] == want["REC/MIN"] && got["PENDING"] == want["PENDING"]
	})
	for _, col := range statusColumns {
		if got[col] != want[col] {
			t.Errorf("status %s = %q, README shows %q\n%s\n%s", col, got[col], want[col], table, w.logs())
		}
	}
	return got
}

// checkStatusPage checks that the daemon's ops listener serves the status
// page, in HTML.
func (w *walkthrough) checkStatusPage() {
	t := w.t
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+w.httpAddr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	page, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := page.Body.Close(); err != nil {
		t.Error(err)
	}
	if page.StatusCode != http.StatusOK || !strings.HasPrefix(page.Header.Get("Content-Type"), "text/html") {
		t.Errorf("the status page answered %s, %s", page.Status, page.Header.Get("Content-Type"))
	}
}

// received returns the lines of received.txt, sorted.
func (w *walkthrough) received() []string {
	w.t.Helper()
	b, err := os.ReadFile(filepath.Join(w.dir, "received.txt"))
	if err != nil {
		w.t.Fatalf("received.txt: %v\n%s", err, w.logs())
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	slices.Sort(lines)
	return lines
}
