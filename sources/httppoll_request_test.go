package sources

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// traces collects TraceEvents.
type traces struct {
	mu  sync.Mutex
	evs []TraceEvent
}

func (tr *traces) add(ev TraceEvent) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.evs = append(tr.evs, ev)
}

func (tr *traces) all() []TraceEvent {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.evs)
}

func TestHTTPPollNotModified(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 5, PageSize: 10, ETag: true})
	var tr traces
	src := openPollEnv(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id"}, Env{Name: "feed", Timeout: 10 * time.Second, Trace: tr.add})
	b, err := src.Fetch(t.Context(), "")
	if err != nil || len(b.Records) != 5 {
		t.Fatalf("first fetch: %v, %v", b, err)
	}
	b, err = src.Fetch(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Records) != 0 || len(b.Body) != 0 || b.Cursor != "" || b.More {
		t.Errorf("304: %d records, body %q, cursor %q, more %v; want an empty batch", len(b.Records), b.Body, b.Cursor, b.More)
	}
	reqs := srv.Requests()
	if reqs[0].Header.Get("If-None-Match") != "" || reqs[1].Header.Get("If-None-Match") == "" || reqs[1].Status != http.StatusNotModified {
		t.Errorf("If-None-Match %q then %q (status %d)", reqs[0].Header.Get("If-None-Match"), reqs[1].Header.Get("If-None-Match"), reqs[1].Status)
	}
	if evs := tr.all(); len(evs) != 2 || evs[1].Status != http.StatusNotModified || evs[1].Note != "304 not modified" {
		t.Errorf("traces %+v", evs)
	}
}

func TestHTTPPollRewoundCursorIsNotConditional(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 15, PageSize: 10, ETag: true})
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id", CursorField: "seq", CursorParam: "since"})
	if _, err := src.Fetch(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	// The caller fetches "" again: the first batch was not made durable, so
	// its records must come again in full, not as a 304.
	b, err := src.Fetch(t.Context(), "")
	if err != nil || len(b.Records) != 10 {
		t.Fatalf("refetch: %v, %d records", err, len(b.Records))
	}
	if got := srv.Requests()[1].Header.Get("If-None-Match"); got != "" {
		t.Errorf("refetch sent If-None-Match %q", got)
	}
}

func TestHTTPPollGzip(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 50, PageSize: 50, Gzip: true})
	for _, headers := range []map[string]string{nil, {"Accept-Encoding": "gzip"}} {
		src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id", Headers: headers})
		b, err := src.Fetch(t.Context(), "")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(keys([]*Batch{b}), ids(1, 50)) || !bytes.HasPrefix(b.Body, []byte(`[{"id":"ev-1"`)) {
			t.Errorf("headers %v: body %.40q, %d records", headers, b.Body, len(b.Records))
		}
	}
	for i, r := range srv.Requests() {
		if !r.Gzipped {
			t.Errorf("request %d was answered without gzip", i)
		}
	}
}

func TestHTTPPollStatusClasses(t *testing.T) {
	for _, status := range []int{400, 401, 403, 404, 405, 410, 422} {
		srv := testupstream.NewServer(t, testupstream.Options{Total: 1})
		srv.Script(testupstream.Status(status))
		_, err := openPoll(t, &HTTPPollSpec{PollURL: srv.URL}).Fetch(t.Context(), "")
		var perm *PermanentError
		if !errors.As(err, &perm) {
			t.Errorf("status %d: %v, want a PermanentError", status, err)
		}
	}
	for _, status := range []int{408, 429, 500, 502, 503, 504} {
		srv := testupstream.NewServer(t, testupstream.Options{Total: 1})
		srv.Script(testupstream.Status(status))
		_, err := openPoll(t, &HTTPPollSpec{PollURL: srv.URL}).Fetch(t.Context(), "")
		var perm *PermanentError
		var wait *WaitError
		if err == nil || errors.As(err, &perm) || errors.As(err, &wait) {
			t.Errorf("status %d: %v, want a plain error for the caller's backoff", status, err)
		}
	}
}

func TestHTTPPollFaults(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 3})
	srv.Script(testupstream.Body(http.StatusOK, testupstream.NotJSON), testupstream.Oversize(4096))
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id", MaxBodyBytes: 4096})
	if _, err := src.Fetch(t.Context(), ""); err == nil {
		t.Error("not JSON: no error")
	} else if m, ok := AsMalformed(err); !ok || string(m.Body) != testupstream.NotJSON {
		t.Errorf("not JSON: %v, want a MalformedError with the body", err)
	}
	if _, err := src.Fetch(t.Context(), ""); err == nil || !strings.Contains(err.Error(), "max_body_bytes") {
		t.Errorf("oversize: %v", err)
	}
	if b, err := src.Fetch(t.Context(), ""); err != nil || !slices.Equal(keys([]*Batch{b}), ids(1, 3)) {
		t.Errorf("after the faults: %v, %v", b, err)
	}
}

func TestHTTPPollRequestShape(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 3})
	var tr traces
	src := openPollEnv(t, &HTTPPollSpec{
		PollURL:       "http://user:pw@" + strings.TrimPrefix(srv.URL, "http://") + "/q?limit=5&region=eu&access_token=t0k",
		Method:        "post",
		Query:         map[string]string{"region": "us", "api_key": "k3y"},
		Body:          `{"since":"{cursor}","limit":5}`,
		Headers:       map[string]string{"Authorization": "Bearer s3cret"},
		IDField:       "id",
		CursorField:   "seq",
		InitialCursor: `a"b`,
	}, Env{Name: "feed", Timeout: 10 * time.Second, Trace: tr.add})
	if _, err := src.Fetch(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	r := srv.Requests()[0]
	if r.Method != http.MethodPost || r.Body != `{"since":"a\"b","limit":5}` || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("request %s %q content type %q", r.Method, r.Body, r.Header.Get("Content-Type"))
	}
	if r.Query.Get("limit") != "5" || r.Query.Get("region") != "us" || r.Query.Get("api_key") != "k3y" {
		t.Errorf("query %v, want limit=5 region=us api_key=k3y", r.Query)
	}
	ev := tr.all()[0]
	for _, secret := range []string{"pw", "t0k", "k3y", "s3cret"} {
		if strings.Contains(ev.URL, secret) {
			t.Errorf("trace URL %q leaks %q", ev.URL, secret)
		}
	}
	if !strings.Contains(ev.URL, "api_key=REDACTED") || !strings.Contains(ev.URL, "limit=5") ||
		ev.Method != http.MethodPost || ev.Status != 200 || ev.Bytes == 0 || ev.Duration <= 0 {
		t.Errorf("trace %+v", ev)
	}
}

func TestHTTPPollTLS(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 2, TLS: true})
	ca := writeCAFile(t, srv.Certificate())
	if b, err := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, TLSCAFile: ca}).Fetch(t.Context(), ""); err != nil || len(b.Records) != 2 {
		t.Errorf("with tls_ca_file: %v", err)
	}
	if _, err := openPoll(t, &HTTPPollSpec{PollURL: srv.URL}).Fetch(t.Context(), ""); err == nil {
		t.Error("an unknown CA was trusted")
	}
	var logs bytes.Buffer
	src := openPollEnv(t, &HTTPPollSpec{PollURL: srv.URL, TLSInsecureSkipVerify: true},
		Env{Name: "feed", Timeout: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if _, err := src.Fetch(t.Context(), ""); err != nil {
		t.Errorf("tls_insecure_skip_verify: %v", err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "VERIFICATION IS DISABLED") {
		t.Errorf("no loud warning: %q", logs.String())
	}
}

func TestHTTPPollRedirectToAnotherHostIsPermanent(t *testing.T) {
	srv := httptest.NewServer(http.RedirectHandler("http://elsewhere.invalid/x", http.StatusFound))
	t.Cleanup(srv.Close)
	_, err := openPoll(t, &HTTPPollSpec{PollURL: srv.URL}).Fetch(t.Context(), "")
	var perm *PermanentError
	if !errors.As(err, &perm) {
		t.Errorf("Fetch error %v, want a PermanentError", err)
	}
}

func TestHTTPPollValidate(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(ca, []byte("no certificate here"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		spec HTTPPollSpec
		want []string // "key: message substring"
	}{
		{HTTPPollSpec{PollURL: "https://a/x", CursorField: "seq"}, []string{"cursor_param: is required when cursor_field is set (or set cursor_request_header"}},
		{HTTPPollSpec{PollURL: "https://a/x", CursorParam: "since"}, []string{"cursor_from: finds no cursor to send"}},
		{HTTPPollSpec{PollURL: "https://a/x/{cursor}", SequenceField: "seq"}, nil},
		{HTTPPollSpec{PollURL: "https://a/x", Method: "PUT", Body: "{}"}, []string{"method: must be"}},
		{HTTPPollSpec{PollURL: "https://a/x", Body: "{}"}, []string{"body: is only sent with method"}},
		{HTTPPollSpec{PollURL: "https://a/x", Format: "xml", RecordsPath: "a..b"}, []string{"records_path: must be a dotted path", "format: must be"}},
		{HTTPPollSpec{PollURL: "https://a/x", Format: "ndjson", RecordsPath: "data"}, []string{"records_path: is only used with format"}},
		{HTTPPollSpec{PollURL: "https://a/x", CursorFrom: "body", CursorBodyField: "next", CursorParam: "c"}, []string{"cursor_body_field: needs a body that is an object"}},
		{HTTPPollSpec{PollURL: "https://a/x", CursorFrom: "header", CursorParam: "c", CursorField: "seq"},
			[]string{"cursor_header: is required", "cursor_field: is only used with cursor_from"}},
		{HTTPPollSpec{PollURL: "https://a/x", Pagination: "body_token", NextTokenField: "t"},
			[]string{"next_token_field: needs a body", "next_token_param: is required"}},
		{HTTPPollSpec{PollURL: "https://a/x", Pagination: "page", PageParam: "p", CursorParam: "p", CursorField: "s", MaxPages: -1},
			[]string{"cursor_param: must differ", "max_pages: must be at least 1"}},
		{HTTPPollSpec{PollURL: "https://a/x", Pagination: "pages", OffsetParam: "o"}, []string{"offset_param: is only used", "pagination: must be"}},
		{HTTPPollSpec{PollURL: "https://a/x", RateLimit: "fast", RateBurst: -1}, []string{"rate_limit: rate \"fast\"", "rate_burst: must be at least 1"}},
		{HTTPPollSpec{PollURL: "http://a/x", TLSCAFile: ca, TLSInsecureSkipVerify: true},
			[]string{"tls_ca_file: is only used with an https", "tls_insecure_skip_verify: cannot be combined", "tls_insecure_skip_verify: is only used with an https"}},
		{HTTPPollSpec{PollURL: "https://a/x", TLSCAFile: ca}, []string{"tls_ca_file: " + ca + " holds no PEM certificate"}},
		{HTTPPollSpec{PollURL: "https://a/x", InitialCursor: "5"}, []string{"initial_cursor: is only used when"}},
	}
	for i, tt := range tests {
		errs := withDefaults(&tt.spec).Validate()
		var got []string
		for _, e := range errs {
			got = append(got, e.Error())
		}
		if len(got) != len(tt.want) {
			t.Errorf("case %d: errors %q, want %q", i, got, tt.want)
			continue
		}
		for j, w := range tt.want {
			if !strings.HasPrefix(got[j], w) {
				t.Errorf("case %d: error %q, want it to start with %q", i, got[j], w)
			}
		}
	}
}

func TestHTTPPollSharedLimiterMustExist(t *testing.T) {
	spec := withDefaults(&HTTPPollSpec{PollURL: "http://a/x", RateLimiter: "api"})
	if spec.LimiterName() != "api" {
		t.Errorf("LimiterName() = %q", spec.LimiterName())
	}
	if _, err := spec.Open(Env{Name: "feed"}); err == nil || !strings.Contains(err.Error(), "rate_limiter") {
		t.Errorf("Open with no such limiter: %v", err)
	}
	lim := NewRateLimiters()
	r, err := ParseRate("5/s")
	if err != nil {
		t.Fatal(err)
	}
	lim.Add("api", r, 1)
	src, err := spec.Open(Env{Name: "feed", Limiters: lim})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
}
