package checksource_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/checksource"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/sources"
)

// feed is an upstream serving records {"id":"ev-N","seq":N,"ts":...} for
// N = 1..total with seq > the since parameter, as one JSON array.
type feed struct {
	srv   *httptest.Server
	total int

	mu     sync.Mutex
	sinces []string
}

func newFeed(t *testing.T, total int) *feed {
	f := &feed{total: total}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		since := r.URL.Query().Get("since")
		f.mu.Lock()
		f.sinces = append(f.sinces, since)
		f.mu.Unlock()
		after, _ := strconv.Atoi(since)
		var recs []string
		for n := after + 1; n <= f.total; n++ {
			recs = append(recs, fmt.Sprintf(`{"id":"ev-%d","seq":%d,"ts":"%s","body":"%s"}`,
				n, n, time.Date(2024, 3, 5, 10, 0, n, 0, time.UTC).Format(time.RFC3339), strings.Repeat("x", 300)))
		}
		w.Header().Set("Content-Type", "application/json")
		if _, err := w.Write([]byte("[" + strings.Join(recs, ",") + "]")); err != nil {
			t.Errorf("feed: %v", err)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *feed) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.sinces...)
}

// setup writes a config whose data dir and raw dir do not exist yet, with
// the given source blocks; {url} in them is replaced by url.
func setup(t *testing.T, url, sourcesTOML string) (cfg *config.Config, dir string) {
	t.Helper()
	dir = t.TempDir()
	cfg = testconfig.Daemon{Dir: dir, Rest: strings.ReplaceAll(sourcesTOML, "{url}", url)}.Parse(t, "test.toml")
	return cfg, dir
}

const feedTOML = `
[source.feed]
kind = "http_poll"
enabled = false
poll_url = "{url}/events?api_key=s3cret"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
time_field = "ts"
`

func run(t *testing.T, cfg *config.Config, name string, o checksource.Options) (checksource.Result, string, error) {
	t.Helper()
	var out bytes.Buffer
	res, err := checksource.Run(t.Context(), cfg, name, &out, o)
	return res, out.String(), err
}

// wroteNothing checks that neither the data dir (so no queue) nor the raw
// dir was created.
func wroteNothing(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"data", "raw"} {
		if _, err := os.Stat(filepath.Join(dir, d)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("check-source created %s: %v", d, err)
		}
	}
}

func TestCheckSourceFirstPoll(t *testing.T) {
	f := newFeed(t, 25)
	cfg, dir := setup(t, f.srv.URL, feedTOML)
	res, out, err := run(t, cfg, "feed", checksource.Options{})
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	if want := (checksource.Result{Pages: 1, Requests: 1, Records: 25, Cursor: "25"}); res != want {
		t.Errorf("result %+v, want %+v", res, want)
	}
	for _, want := range []string{
		`source "feed": kind http_poll, disabled`,
		`cursor: "" (no queue at ` + filepath.Join(dir, "data", "queue.db"),
		"GET " + f.srv.URL + "/events", // the query, with its secret, is the source's to redact
		" -> 200 in ",
		"25 record(s)",
		"id=ev-1 cursor=1 time=2024-03-05T10:00:01Z\n",
		"id=ev-20 cursor=20 time=2024-03-05T10:00:20Z\n",
		"... and 5 more (-v lists them all)",
		`sample payload (id=ev-1): {"id":"ev-1","seq":1,`,
		`... (`, // the sample is cut at 200 bytes
		`next cursor: "25"`,
		"more: false",
		`ok: 1 page(s), 1 request(s), 25 record(s), next cursor "25"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "id=ev-21 ") {
		t.Errorf("more than 20 records listed without -v:\n%s", out)
	}
	if strings.Contains(out, "s3cret") {
		t.Errorf("output shows the secret query value:\n%s", out)
	}
	if got := f.requests(); len(got) != 1 || got[0] != "" {
		t.Errorf("upstream saw since=%q, want one request without a cursor", got)
	}
	wroteNothing(t, dir)

	// -v lists every record.
	_, out, err = run(t, cfg, "feed", checksource.Options{Verbose: true})
	if err != nil || !strings.Contains(out, "id=ev-25 cursor=25") || strings.Contains(out, "more (-v") {
		t.Errorf("verbose check (%v):\n%s", err, out)
	}
}

// TestCheckSourcePageOfManySlices checks a page of more records than one
// slice (sources.SliceRecords), whose records after the first slice the
// fetch only counted: all are counted, and -v lists the last one too.
func TestCheckSourcePageOfManySlices(t *testing.T) {
	total := sources.SliceRecords + 5
	f := newFeed(t, total)
	cfg, _ := setup(t, f.srv.URL, feedTOML)
	res, out, err := run(t, cfg, "feed", checksource.Options{})
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	if res.Records != total || !strings.Contains(out, fmt.Sprintf("  %d record(s), ", total)) ||
		!strings.Contains(out, fmt.Sprintf("... and %d more", total-checksource.ShownRecords)) {
		t.Errorf("result %+v, want %d records:\n%.2000s", res, total, out)
	}
	_, out, err = run(t, cfg, "feed", checksource.Options{Verbose: true})
	last := fmt.Sprintf("id=ev-%d cursor=%d", total, total)
	if err != nil || !strings.Contains(out, last) || strings.Contains(out, "more (-v") {
		t.Errorf("verbose check (%v) lacks %q or says more:\n...%s", err, last, out[max(0, len(out)-2000):])
	}
}

// TestCheckSourceDurableCursor checks that the source's durable cursor is
// read from the daemon's queue, which is left as it was, and that -cursor
// overrides it.
func TestCheckSourceDurableCursor(t *testing.T) {
	f := newFeed(t, 25)
	cfg, dir := setup(t, f.srv.URL, feedTOML)
	qpath := filepath.Join(dir, "data", "queue.db")
	if err := os.MkdirAll(filepath.Dir(qpath), 0o750); err != nil {
		t.Fatal(err)
	}
	q, err := queue.Open(queue.Options{Path: qpath})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Append(t.Context(), queue.Batch{Source: "feed", Cursor: "21", SetCursor: true}); err != nil {
		t.Fatal(err)
	}
	// While the daemon runs, its latest cursor is still in the WAL.
	_, out, err := run(t, cfg, "feed", checksource.Options{})
	if err != nil || !strings.Contains(out, `cursor: "21" (durable cursor in `+qpath+")") {
		t.Errorf("check while the queue is open (%v):\n%s", err, out)
	}
	if _, err := q.Append(t.Context(), queue.Batch{Source: "feed", Cursor: "22", SetCursor: true}); err != nil {
		t.Fatalf("the queue cannot commit after a check: %v", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	// With the daemon stopped, the check leaves the data dir as it is.
	before := dirState(t, filepath.Dir(qpath))

	res, out, err := run(t, cfg, "feed", checksource.Options{})
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	if !strings.Contains(out, `cursor: "22" (durable cursor in `+qpath+")") || res.Records != 3 || res.Cursor != "25" {
		t.Errorf("result %+v, output:\n%s", res, out)
	}
	if _, out, err = run(t, cfg, "feed", checksource.Options{Cursor: "5", HasCursor: true}); err != nil ||
		!strings.Contains(out, `cursor: "5" (from -cursor)`) {
		t.Errorf("check with -cursor (%v):\n%s", err, out)
	}
	if got := f.requests(); len(got) != 3 || got[1] != "22" || got[2] != "5" {
		t.Errorf("upstream saw since=%q, want 21, 22 then 5", got)
	}
	// A source with no stored cursor in an existing queue.
	cfg2, _ := setup(t, f.srv.URL, feedTOML)
	cfg2.Daemon.DataDir = filepath.Dir(qpath)
	cfg2.Sources[0].Name = "other"
	if _, out, err = run(t, cfg2, "other", checksource.Options{}); err != nil ||
		!strings.Contains(out, `cursor: "" (no durable cursor in `+qpath+")") {
		t.Errorf("check of a source without a cursor (%v):\n%s", err, out)
	}
	if after := dirState(t, filepath.Dir(qpath)); after != before {
		t.Errorf("the data dir changed:\nbefore %s\nafter  %s", before, after)
	}
}

// dirState describes every file in dir by name, size and modification time.
func dirState(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s:%d:%d ", e.Name(), fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String()
}

func TestCheckSourceProblems(t *testing.T) {
	status := http.StatusUnauthorized
	body := `{"error":"bad token"}`
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(status)
		if _, err := w.Write([]byte(body)); err != nil {
			t.Errorf("server: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	cfg, dir := setup(t, srv.URL, feedTOML)

	_, out, err := run(t, cfg, "feed", checksource.Options{})
	if err == nil {
		t.Fatalf("a 401 passed:\n%s", out)
	}
	for _, want := range []string{"GET " + srv.URL + "/events", " -> 401 in ", "problem: ", "hint: 401: ", "check headers and credentials"} {
		if !strings.Contains(out, want) {
			t.Errorf("401: output lacks %q:\n%s", want, out)
		}
	}

	mu.Lock()
	status, body = http.StatusOK, `{"error":"an object, not an array"}`
	mu.Unlock()
	_, out, err = run(t, cfg, "feed", checksource.Options{})
	if _, ok := sources.AsMalformed(err); !ok {
		t.Fatalf("malformed payload: error %v\n%s", err, out)
	}
	for _, want := range []string{"problem: malformed payload", `payload (35 bytes): {"error":"an object, not an array"}`, "deadletter/feed/"} {
		if !strings.Contains(out, want) {
			t.Errorf("malformed: output lacks %q:\n%s", want, out)
		}
	}

	srv.Close()
	_, out, err = run(t, cfg, "feed", checksource.Options{})
	if err == nil || !strings.Contains(out, "-> no response") || !strings.Contains(out, "hint: the daemon would retry with backoff") {
		t.Errorf("unreachable upstream (%v):\n%s", err, out)
	}
	wroteNothing(t, dir)
}

func TestCheckSourceDisabledWithUnexpandedEnv(t *testing.T) {
	f := newFeed(t, 1)
	cfg, _ := setup(t, f.srv.URL, feedTOML+`headers = { Authorization = "Bearer ${CHECKSOURCE_TEST_UNSET}" }
`)
	_, out, err := run(t, cfg, "feed", checksource.Options{})
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	if !strings.Contains(out, "warning: ${ENV} references are not expanded for a disabled source") {
		t.Errorf("no warning about ${ENV}:\n%s", out)
	}
	if strings.Contains(out, "Bearer") {
		t.Errorf("output shows a header value:\n%s", out)
	}
	// Without ${ in the values there is nothing to warn about.
	cfg, _ = setup(t, f.srv.URL, feedTOML)
	if _, out, _ := run(t, cfg, "feed", checksource.Options{}); strings.Contains(out, "warning") {
		t.Errorf("spurious warning:\n%s", out)
	}
}

func TestCheckSourceDemoAndUnknown(t *testing.T) {
	cfg, dir := setup(t, "", `
[source.synthetic]
kind = "demo"
events_per_tick = 3
`)
	res, out, err := run(t, cfg, "synthetic", checksource.Options{})
	if err != nil || res.Records != 3 || res.Cursor != "3" || !strings.Contains(out, "id=synthetic-3 cursor=3") {
		t.Errorf("demo check: %+v, %v\n%s", res, err, out)
	}
	wroteNothing(t, dir)
	if _, _, err := run(t, cfg, "nosuch", checksource.Options{}); err == nil || !strings.Contains(err.Error(), `no source "nosuch" (the config has synthetic)`) {
		t.Errorf("unknown source: %v", err)
	}
}

// TestCheckSourcePages follows a paginated poll while the source reports
// More, up to -max-pages.
func TestCheckSourcePages(t *testing.T) {
	var mu sync.Mutex
	var pages []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		page := r.URL.Query().Get("page")
		mu.Lock()
		pages = append(pages, page)
		mu.Unlock()
		n, _ := strconv.Atoi(page)
		body := "[]"
		if n >= 1 && n <= 3 { // three pages of two records, then an empty one
			body = fmt.Sprintf(`[{"id":"p%d-a","seq":%d},{"id":"p%d-b","seq":%d}]`, n, 2*n-1, n, 2*n)
		}
		if _, err := w.Write([]byte(body)); err != nil {
			t.Errorf("server: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	seen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := pages
		pages = nil
		return out
	}
	cfg, dir := setup(t, srv.URL, `
[source.paged]
kind = "http_poll"
poll_url = "{url}/items"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
pagination = "page"
page_param = "page"
`)
	res, out, err := run(t, cfg, "paged", checksource.Options{})
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	if res.Pages != 4 || res.Records != 6 || res.More || res.Cursor != "6" {
		t.Errorf("result %+v, want 4 pages, 6 records, cursor 6\n%s", res, out)
	}
	for _, want := range []string{"page 1 (cursor \"\")", "id=p1-a cursor=1", "page 3 ", "id=p3-b cursor=6", "page 4 ", "more: true", "more: false",
		`ok: 4 page(s), 4 request(s), 6 record(s), next cursor "6"`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if got := seen(); !slices.Equal(got, []string{"1", "2", "3", "4"}) {
		t.Errorf("pages requested %q, want 1 to 4", got)
	}

	res, out, err = run(t, cfg, "paged", checksource.Options{MaxPages: 2})
	if err != nil || res.Pages != 2 || !res.More || !strings.Contains(out, "stopped after 2 pages (-max-pages)") {
		t.Errorf("-max-pages 2: %+v, %v\n%s", res, err, out)
	}
	if got := seen(); !slices.Equal(got, []string{"1", "2"}) {
		t.Errorf("pages requested with -max-pages 2: %q", got)
	}
	wroteNothing(t, dir)
}
