package sources

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"
)

// polled is what the test server saw of one request.
type polled struct {
	query  url.Values
	header http.Header
	path   string
}

// pollServer serves body with status to every request and reports each
// request on the returned channel.
func pollServer(t *testing.T, status int, body string) (*httptest.Server, <-chan polled) {
	t.Helper()
	reqs := make(chan polled, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs <- polled{query: r.URL.Query(), header: r.Header.Clone(), path: r.URL.Path}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if _, err := w.Write([]byte(body)); err != nil {
			t.Errorf("test server: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, reqs
}

// withDefaults fills the zero fields of spec that have a default.
func withDefaults(spec *HTTPPollSpec) *HTTPPollSpec {
	def := newHTTPPollSpec()
	for _, f := range []struct{ v, d *string }{{&spec.Method, &def.Method}, {&spec.Format, &def.Format},
		{&spec.CursorFrom, &def.CursorFrom}, {&spec.Pagination, &def.Pagination}} {
		if *f.v == "" {
			*f.v = *f.d
		}
	}
	for _, f := range []struct{ v, d *int }{{&spec.PageStart, &def.PageStart}, {&spec.MaxPages, &def.MaxPages}, {&spec.RateBurst, &def.RateBurst}} {
		if *f.v == 0 {
			*f.v = *f.d
		}
	}
	if spec.MaxBodyBytes == 0 {
		spec.MaxBodyBytes = def.MaxBodyBytes
	}
	return spec
}

// openPoll opens spec, with defaults for its zero fields, and closes it
// when the test ends.
func openPoll(t *testing.T, spec *HTTPPollSpec) Source {
	t.Helper()
	return openPollEnv(t, spec, Env{Name: "feed", Timeout: 10 * time.Second})
}

func openPollEnv(t *testing.T, spec *HTTPPollSpec, env Env) Source {
	t.Helper()
	src, err := withDefaults(spec).Open(env)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := src.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return src
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestHTTPPollRecords(t *testing.T) {
	elems := []string{
		`{"id":"a\"1","seq":9,"ts":"2024-05-01T10:00:00Z","v":[1,"]"]}`,
		`{ "id" : 7 , "seq" : 10 , "ts" : "2024-05-01T10:00:01.5+02:00" }`,
		`{"seq":8,"other":"x","ts":"not a time"}`,
		`{"id":"","seq":"8"}`,
		`{"id":null}`,
		`"just a string"`,
	}
	body := "[\n  " + strings.Join(elems, " ,\n  ") + "\n]\n"
	srv, _ := pollServer(t, http.StatusOK, body)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id", CursorField: "seq", CursorParam: "since", TimeField: "ts"})

	b, err := src.Fetch(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if string(b.Body) != body || b.FetchedAt.IsZero() {
		t.Errorf("body %q fetched at %v", b.Body, b.FetchedAt)
	}
	want := []Record{
		{Key: `a"1`, Cursor: "9", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)},
		{Key: "7", Cursor: "10", Time: time.Date(2024, 5, 1, 8, 0, 1, 5e8, time.UTC)},
		{Key: sha256Hex([]byte(elems[2])), Cursor: "8"},
		{Key: sha256Hex([]byte(elems[3])), Cursor: "8"},
		{Key: sha256Hex([]byte(elems[4]))},
		{Key: sha256Hex([]byte(elems[5]))},
	}
	if len(b.Records) != len(want) {
		t.Fatalf("%d records, want %d", len(b.Records), len(want))
	}
	for i, r := range b.Records {
		if got := string(b.Body[r.Off : r.Off+r.Len]); got != elems[i] {
			t.Errorf("record %d bytes %q, want %q", i, got, elems[i])
		}
		if r.Key != want[i].Key || r.Cursor != want[i].Cursor || !r.Time.Equal(want[i].Time) {
			t.Errorf("record %d = %q %q %v; want %q %q %v", i, r.Key, r.Cursor, r.Time, want[i].Key, want[i].Cursor, want[i].Time)
		}
	}
	if b.Cursor != "10" { // numerically, not "9" as text would say
		t.Errorf("batch cursor %q, want 10", b.Cursor)
	}
}

func TestHTTPPollKeysWithoutIDField(t *testing.T) {
	srv, _ := pollServer(t, http.StatusOK, `[{"id":1},{"id":1}, {"id":2}]`)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL})
	b, err := src.Fetch(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{sha256Hex([]byte(`{"id":1}`)), sha256Hex([]byte(`{"id":1}`)), sha256Hex([]byte(`{"id":2}`))}
	for i, r := range b.Records {
		if r.Key != keys[i] || r.Cursor != "" {
			t.Errorf("record %d key %q cursor %q, want %q and no cursor", i, r.Key, r.Cursor, keys[i])
		}
	}
	if b.Cursor != "" {
		t.Errorf("batch cursor %q without a cursor field", b.Cursor)
	}
}

func TestHTTPPollCursorParam(t *testing.T) {
	srv, reqs := pollServer(t, http.StatusOK, `[{"id":"x","meta":{"seq":41}},{"id":"y","meta":{"seq":42}}]`)
	src := openPoll(t, &HTTPPollSpec{
		PollURL:     srv.URL + "/v1/events?limit=100&since=0",
		IDField:     "id",
		CursorField: "meta.seq",
		CursorParam: "since",
	})
	b, err := src.Fetch(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	first := <-reqs
	if first.path != "/v1/events" || first.query.Get("since") != "0" || first.query.Get("limit") != "100" {
		t.Errorf("first poll %s?%s, want the poll URL as configured", first.path, first.query.Encode())
	}
	if b.Cursor != "42" {
		t.Fatalf("batch cursor %q, want 42", b.Cursor)
	}
	if _, err := src.Fetch(t.Context(), b.Cursor); err != nil {
		t.Fatal(err)
	}
	second := <-reqs
	if got := second.query["since"]; len(got) != 1 || got[0] != "42" || second.query.Get("limit") != "100" {
		t.Errorf("second poll query %s, want since=42 and limit=100", second.query.Encode())
	}
}

func TestHTTPPollTimeCursor(t *testing.T) {
	srv, _ := pollServer(t, http.StatusOK, `[
		{"id":1,"updated_at":"2024-05-01T10:00:00Z"},
		{"id":2,"updated_at":"2024-05-01T11:30:00+02:00"},
		{"id":3,"updated_at":"2024-05-01T09:59:59.999999999Z"}]`)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id", CursorField: "updated_at", CursorParam: "since"})
	b, err := src.Fetch(t.Context(), "2024-05-01T09:00:00Z")
	if err != nil {
		t.Fatal(err)
	}
	// 11:30+02:00 is 09:30Z: as text it would be the largest.
	if b.Cursor != "2024-05-01T10:00:00Z" {
		t.Errorf("batch cursor %q, want 2024-05-01T10:00:00Z", b.Cursor)
	}
}

func TestHTTPPollCursorNeverRewinds(t *testing.T) {
	srv, _ := pollServer(t, http.StatusOK, `[{"id":1,"seq":5},{"id":2,"seq":6}]`)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id", CursorField: "seq", CursorParam: "after"})
	b, err := src.Fetch(t.Context(), "20")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Records) != 2 || b.Cursor != "" {
		t.Errorf("%d records, cursor %q; want 2 records and the cursor unchanged", len(b.Records), b.Cursor)
	}
	// The same cursor again is not a rewind, and not a change.
	b, err = src.Fetch(t.Context(), "5")
	if err != nil {
		t.Fatal(err)
	}
	if b.Cursor != "6" {
		t.Errorf("cursor %q, want 6", b.Cursor)
	}
	b, err = src.Fetch(t.Context(), "6")
	if err != nil {
		t.Fatal(err)
	}
	if b.Cursor != "" {
		t.Errorf("cursor %q, want it unchanged", b.Cursor)
	}
}

func TestHTTPPollEmptyArray(t *testing.T) {
	for _, status := range []int{http.StatusOK, http.StatusNoContent} {
		body := " [ ] "
		if status == http.StatusNoContent {
			body = ""
		}
		srv, _ := pollServer(t, status, body)
		src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, CursorField: "seq", CursorParam: "since"})
		b, err := src.Fetch(t.Context(), "17")
		if err != nil {
			t.Fatalf("status %d: %v", status, err)
		}
		if len(b.Records) != 0 || b.Cursor != "" {
			t.Errorf("status %d: %d records, cursor %q; want none and the cursor unchanged", status, len(b.Records), b.Cursor)
		}
	}
}

func TestHTTPPollMalformed(t *testing.T) {
	tests := []struct {
		name, body, reason string
	}{
		{"empty body", "", "empty body"},
		{"whitespace", " \r\n", "empty body"},
		{"not JSON", "<html>oops</html>", "not a JSON array (found '<')"},
		{"object", `{"items":[{"id":1}]}`, "not a JSON array (found an object)"},
		{"truncated", `[{"id":1},{"id":`, "unexpected end of input at offset 16"},
		{"trailing garbage", `[{"id":1}] x`, "unexpected data after the array"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := pollServer(t, http.StatusOK, tt.body)
			src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id"})
			b, err := src.Fetch(t.Context(), "")
			m, ok := AsMalformed(err)
			if !ok || b != nil {
				t.Fatalf("got %v, %v; want a *MalformedError", b, err)
			}
			if string(m.Body) != tt.body || m.FetchedAt.IsZero() || !strings.Contains(m.Reason, tt.reason) {
				t.Errorf("malformed body %q at %v, reason %q; want reason with %q", m.Body, m.FetchedAt, m.Reason, tt.reason)
			}
		})
	}
}

func TestHTTPPollStatusError(t *testing.T) {
	for _, status := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusNotFound} {
		srv, _ := pollServer(t, status, `{"error":"down"}`)
		src := openPoll(t, &HTTPPollSpec{
			PollURL: srv.URL + "/events?api_key=qs3cret",
			Headers: map[string]string{"Authorization": "Bearer s3cret-token"},
		})
		_, err := src.Fetch(t.Context(), "")
		if err == nil {
			t.Fatalf("status %d: no error", status)
		}
		if _, ok := AsMalformed(err); ok {
			t.Errorf("status %d: %v is a MalformedError, want a plain error to retry", status, err)
		}
		want := `source "feed": poll ` + srv.URL + `/events: status ` + strconv.Itoa(status)
		if err.Error() != want {
			t.Errorf("error %q, want %q", err, want)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error %q leaks a secret", err)
		}
	}
}

func TestHTTPPollOversize(t *testing.T) {
	body := `[{"id":1}]` // 10 bytes
	srv, _ := pollServer(t, http.StatusOK, body)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, MaxBodyBytes: 9})
	_, err := src.Fetch(t.Context(), "")
	if err == nil || !strings.Contains(err.Error(), "larger than max_body_bytes (9)") {
		t.Errorf("Fetch error %v, want one about max_body_bytes", err)
	}
	if _, ok := AsMalformed(err); ok {
		t.Errorf("oversize body is a MalformedError: %v", err)
	}
	src = openPoll(t, &HTTPPollSpec{PollURL: srv.URL, MaxBodyBytes: 10})
	if b, err := src.Fetch(t.Context(), ""); err != nil || len(b.Records) != 1 {
		t.Errorf("body of exactly max_body_bytes: %v, %v", b, err)
	}
}

func TestHTTPPollHeaders(t *testing.T) {
	srv, reqs := pollServer(t, http.StatusOK, `[]`)
	var logs bytes.Buffer
	src := openPollEnv(t, &HTTPPollSpec{PollURL: srv.URL, MaxBodyBytes: 1 << 10, Headers: map[string]string{
		"Authorization": "Bearer s3cret-token",
		"x-trace":       "literal ${NOT_EXPANDED} value", // config expanded ${ENV} already
	}}, Env{
		Name:    "feed",
		Timeout: 10 * time.Second,
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Member:  "ingestor-2",
	})
	if _, err := src.Fetch(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "polled") || strings.Contains(logs.String(), "s3cret") {
		t.Errorf("debug log %q: want the poll logged without the token", logs.String())
	}
	h := (<-reqs).header
	if got := h.Get("Authorization"); got != "Bearer s3cret-token" {
		t.Errorf("Authorization %q", got)
	}
	if got := h.Get(MemberHeader); got != "ingestor-2" {
		t.Errorf("%s %q, want the cluster member", MemberHeader, got)
	}
	if got := h.Get("X-Trace"); got != "literal ${NOT_EXPANDED} value" {
		t.Errorf("X-Trace %q", got)
	}
	if got := h.Get("Accept"); got != "application/json" {
		t.Errorf("Accept %q", got)
	}

}

func TestHTTPPollRedirects(t *testing.T) {
	other, otherReqs := pollServer(t, http.StatusOK, `[{"id":"elsewhere"}]`)
	mux := http.NewServeMux()
	mux.HandleFunc("/old", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/new", http.StatusFound)
	})
	mux.HandleFunc("/away", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/steal", http.StatusFound)
	})
	mux.HandleFunc("/new", func(w http.ResponseWriter, r *http.Request) {
		if _, err := w.Write([]byte(`[{"id":"moved"}]`)); err != nil {
			t.Errorf("test server: %v", err)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	headers := map[string]string{"X-Api-Key": "s3cret"}

	b, err := openPoll(t, &HTTPPollSpec{PollURL: srv.URL + "/old", IDField: "id", Headers: headers}).Fetch(t.Context(), "")
	if err != nil || len(b.Records) != 1 || b.Records[0].Key != "moved" {
		t.Fatalf("same-host redirect: %v, %v", b, err)
	}
	_, err = openPoll(t, &HTTPPollSpec{PollURL: srv.URL + "/away", IDField: "id", Headers: headers}).Fetch(t.Context(), "")
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("redirect to another host: %v, want it refused", err)
	}
	select {
	case r := <-otherReqs:
		t.Errorf("the other host got a request with headers %v", r.header)
	default:
	}
}

func TestHTTPPollContextCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cancel() // the poll is in flight: cancel it and hold the response
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL})
	_, err := src.Fetch(ctx, "")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Fetch error %v, want context.Canceled", err)
	}
}

func TestHTTPPollTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answer
	}))
	t.Cleanup(srv.Close)
	src := openPollEnv(t, &HTTPPollSpec{PollURL: srv.URL, MaxBodyBytes: 1 << 10}, Env{Name: "feed", Timeout: 50 * time.Millisecond})
	_, err := src.Fetch(t.Context(), "")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("Fetch error %v, want a timeout", err)
	}
}

func TestHTTPPollCloseClosesIdleConnections(t *testing.T) {
	closed := make(chan struct{}, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := w.Write([]byte(`[]`)); err != nil {
			t.Errorf("test server: %v", err)
		}
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed <- struct{}{}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	src, err := withDefaults(&HTTPPollSpec{PollURL: srv.URL, MaxBodyBytes: 1 << 10}).Open(Env{Name: "feed", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Fetch(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle connection was not closed")
	}
}

// TestReadAllBoundsItsBuffer checks the buffer a body is read into: it
// never grows past max_body_bytes+1 however long the body, a body of the
// size announced fits without growing, and one much smaller than its
// buffer is copied into one of its own size, so a page in flight holds
// its bytes and little more.
func TestReadAllBoundsItsBuffer(t *testing.T) {
	const limit = 1 << 20
	const page = 8 << 10 // the allocator rounds a large buffer up to this
	tests := []struct {
		name      string
		size      int64 // announced or guessed
		body      int
		wantLen   int
		wantMaxCp int
	}{
		{"unknown size", 0, 300 << 10, 300 << 10, 300<<10 + 300<<10/3},
		{"announced size", 300 << 10, 300 << 10, 300 << 10, 300<<10 + 1 + page},
		{"guess far too big", 900 << 10, 10 << 10, 10 << 10, 10<<10 + 64<<10},
		{"exactly the limit", 0, limit, limit, limit + 1 + page},
		{"endless", 0, 20 * limit, limit + 1, limit + 1 + page},
		{"endless, announced small", 1000, 20 * limit, limit + 1, limit + 1 + page},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := io.LimitReader(iotest.HalfReader(zeros{}), int64(tt.body))
			b, err := readAll(r, tt.size, limit)
			if err != nil || len(b) != tt.wantLen || cap(b) > tt.wantMaxCp {
				t.Errorf("readAll: %d bytes in a buffer of %d (%v), want %d in at most %d", len(b), cap(b), err, tt.wantLen, tt.wantMaxCp)
			}
		})
	}
}

// zeros reads endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestHTTPPollRefusedBodyIsForgotten refuses a chunked body over
// max_body_bytes, then reads a small one: the refused body's size is not
// the next buffer's (which would give every later page a buffer of
// max_body_bytes), and a Content-Length over the limit is refused unread.
func TestHTTPPollRefusedBodyIsForgotten(t *testing.T) {
	const limit = 256 << 10
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		switch n.Add(1) {
		case 1: // chunked, no length
			chunk := bytes.Repeat([]byte(" "), 32<<10)
			for range 2 * limit / len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		case 2:
			w.Header().Set("Content-Length", strconv.Itoa(2*limit))
			w.WriteHeader(http.StatusOK) // and nothing: it must not be read
		default:
			w.(http.Flusher).Flush() // chunked
			fmt.Fprint(w, `[{"id":1}]`)
		}
	}))
	t.Cleanup(srv.Close)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, MaxBodyBytes: limit})
	for i, want := range []string{"larger than max_body_bytes", "Content-Length 524288"} {
		if _, err := src.Fetch(t.Context(), ""); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("fetch %d: %v, want an error saying %q", i+1, err, want)
		}
	}
	b, err := src.Fetch(t.Context(), "")
	if err != nil || len(b.Records) != 1 {
		t.Fatalf("small body: %v, %v", b, err)
	}
	if cap(b.Body) >= 64<<10 {
		t.Errorf("a %d-byte body holds a buffer of %d bytes", len(b.Body), cap(b.Body))
	}
}
