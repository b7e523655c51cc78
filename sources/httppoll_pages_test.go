package sources

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// drain fetches from cursor until a batch has More unset, as the caller
// does once each batch is durable, and returns the batches.
func drain(t *testing.T, src Source, cursor string) []*Batch {
	t.Helper()
	var out []*Batch
	for range 1000 {
		b, err := src.Fetch(t.Context(), cursor)
		if err != nil {
			t.Fatalf("Fetch(%q) after %d batches: %v", cursor, len(out), err)
		}
		out = append(out, b)
		if b.Cursor != "" {
			cursor = b.Cursor
		}
		if !b.More {
			return out
		}
	}
	t.Fatal("pagination never ended")
	return nil
}

// keys returns the keys of the records of batches, in order.
func keys(batches []*Batch) []string {
	var out []string
	for _, b := range batches {
		for _, r := range b.Records {
			out = append(out, r.Key)
		}
	}
	return out
}

// ids returns testupstream.ID(n) for n in from..to.
func ids(from, to int) []string {
	var out []string
	for n := from; n <= to; n++ {
		out = append(out, testupstream.ID(n))
	}
	return out
}

// pagingStyles pairs each pagination mode with the upstream style and the
// keys it needs.
var pagingStyles = []struct {
	name   string
	paging testupstream.Paging
	spec   HTTPPollSpec
	extra  int // requests beyond the pages with records: the empty last page
}{
	{"link", testupstream.PageLink, HTTPPollSpec{Pagination: "link"}, 0},
	{"body_url", testupstream.PageBodyURL, HTTPPollSpec{Pagination: "body_url", RecordsPath: "data", NextURLField: "next"}, 0},
	{"body_token", testupstream.PageBodyToken, HTTPPollSpec{Pagination: "body_token", RecordsPath: "data",
		NextTokenField: "next_token", NextTokenParam: "token"}, 0},
	{"page", testupstream.PagePage, HTTPPollSpec{Pagination: "page", PageParam: "page"}, 1},
	{"offset", testupstream.PageOffset, HTTPPollSpec{Pagination: "offset", OffsetParam: "offset"}, 1},
}

func pagedSpec(url string, base HTTPPollSpec) *HTTPPollSpec {
	s := base
	s.PollURL, s.IDField, s.CursorField, s.CursorParam, s.MaxPages = url, "id", "seq", "since", 100
	return &s
}

func TestHTTPPollPagination(t *testing.T) {
	for _, st := range pagingStyles {
		t.Run(st.name, func(t *testing.T) {
			srv := testupstream.NewServer(t, testupstream.Options{Total: 25, PageSize: 10, Paging: st.paging})
			src := openPoll(t, pagedSpec(srv.URL+"/events?api_key=k1", st.spec))

			batches := drain(t, src, "")
			if got := keys(batches); !slices.Equal(got, ids(1, 25)) {
				t.Fatalf("keys %v, want ev-1..ev-25 exactly once, in order", got)
			}
			if len(batches) != 3+st.extra {
				t.Fatalf("%d batches, want %d", len(batches), 3+st.extra)
			}
			for i, b := range batches {
				last := i == len(batches)-1
				if b.More == last {
					t.Errorf("batch %d: More = %v", i, b.More)
				}
				c := decodeCursor(b.Cursor)
				if last {
					if b.Cursor != "25" {
						t.Errorf("last batch cursor %q, want the plain final cursor 25", b.Cursor)
					}
				} else if found := min(10*(i+1), 25); c.Next == "" || c.Start != "" || c.Found != strconv.Itoa(found) || c.Pages != i+1 {
					t.Errorf("batch %d cursor %q = %+v: want page state, start \"\", found %d", i, b.Cursor, c, found)
				}
			}
			reqs := srv.Requests()
			if len(reqs) != len(batches) {
				t.Fatalf("%d requests for %d batches", len(reqs), len(batches))
			}
			for i, r := range reqs {
				if r.Query.Get("api_key") != "k1" || r.Query.Has("since") {
					t.Errorf("request %d query %v: want api_key kept and no since on the first poll", i, r.Query)
				}
			}

			// The next poll starts from the final cursor, and every one of
			// its pages sends the cursor it started with.
			srv2 := testupstream.NewServer(t, testupstream.Options{Total: 45, PageSize: 10, Paging: st.paging})
			src2 := openPoll(t, pagedSpec(srv2.URL+"/events", st.spec))
			batches = drain(t, src2, "25")
			if got := keys(batches); !slices.Equal(got, ids(26, 45)) {
				t.Fatalf("second poll keys %v, want ev-26..ev-45", got)
			}
			if last := batches[len(batches)-1]; last.Cursor != "45" {
				t.Errorf("second poll final cursor %q, want 45", last.Cursor)
			}
			for i, r := range srv2.Requests() {
				if got := r.Query["since"]; len(got) != 1 || got[0] != "25" {
					t.Errorf("page request %d sent since=%v, want the poll's cursor 25", i, got)
				}
			}
		})
	}
}

func TestHTTPPollResumesMidPagination(t *testing.T) {
	for _, st := range pagingStyles {
		t.Run(st.name, func(t *testing.T) {
			srv := testupstream.NewServer(t, testupstream.Options{Total: 25, PageSize: 10, Paging: st.paging})
			spec := pagedSpec(srv.URL, st.spec)
			first := openPoll(t, spec)
			b1, err := first.Fetch(t.Context(), "")
			if err != nil {
				t.Fatal(err)
			}
			b2, err := first.Fetch(t.Context(), b1.Cursor)
			if err != nil || !b2.More {
				t.Fatalf("page 2: %v, more %v", err, b2 != nil && b2.More)
			}
			// The process dies with page 2 durable: a new source resumes
			// from page 2's cursor at page 3.
			second := openPoll(t, withDefaults(pagedSpec(srv.URL, st.spec)))
			rest := drain(t, second, b2.Cursor)
			got := append(keys([]*Batch{b1, b2}), keys(rest)...)
			if !slices.Equal(got, ids(1, 25)) {
				t.Fatalf("keys across the restart %v, want ev-1..ev-25 exactly once", got)
			}
			if last := rest[len(rest)-1]; last.Cursor != "25" || last.More {
				t.Errorf("final batch cursor %q more %v", last.Cursor, last.More)
			}
			// Page 2 not durable: the old cursor fetches page 2 again.
			again, err := openPoll(t, pagedSpec(srv.URL, st.spec)).Fetch(t.Context(), b1.Cursor)
			if err != nil || !slices.Equal(keys([]*Batch{again}), ids(11, 20)) {
				t.Errorf("refetch of page 2: %v, keys %v", err, keys([]*Batch{again}))
			}
		})
	}
}

func TestHTTPPollMaxPages(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 25, PageSize: 10, Paging: testupstream.PageLink})
	spec := pagedSpec(srv.URL, HTTPPollSpec{Pagination: "link"})
	spec.MaxPages = 2
	src := openPoll(t, spec)
	batches := drain(t, src, "")
	if len(batches) != 2 || batches[1].Cursor != "20" {
		t.Fatalf("%d batches, last cursor %q; want the poll to end after 2 pages at cursor 20", len(batches), batches[len(batches)-1].Cursor)
	}
	rest := drain(t, src, "20")
	if got := keys(rest); !slices.Equal(got, ids(21, 25)) {
		t.Errorf("next poll keys %v, want ev-21..ev-25", got)
	}
}

func TestHTTPPollNextPageOnAnotherHostIsRefused(t *testing.T) {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the other host got a request with headers %v", r.Header)
	}))
	t.Cleanup(other.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", `<`+other.URL+`/steal?page=2>; rel="next"`)
		if _, err := w.Write([]byte(`[{"id":1}]`)); err != nil {
			t.Errorf("test server: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, Pagination: "link", Headers: map[string]string{"X-Api-Key": "s3cret"}})
	_, err := src.Fetch(t.Context(), "")
	var perm *PermanentError
	if !errors.As(err, &perm) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("Fetch error %v, want a PermanentError refusing the next page", err)
	}
}

func TestHTTPPollCursorFromBodyAndHeader(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 25, PageSize: 10, RecordsPath: "result.items"})
	for _, spec := range []*HTTPPollSpec{
		{CursorFrom: "body", CursorBodyField: "last_seq"},
		{CursorFrom: "header", CursorHeader: "X-Last-Seq"},
	} {
		spec.PollURL, spec.RecordsPath, spec.IDField, spec.CursorParam = srv.URL, "result.items", "id", "since"
		src := openPoll(t, spec)
		cursor := ""
		var got []string
		for range 3 {
			b, err := src.Fetch(t.Context(), cursor)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, keys([]*Batch{b})...)
			cursor = b.Cursor
		}
		if !slices.Equal(got, ids(1, 25)) || cursor != "25" {
			t.Errorf("cursor_from %s: keys %v, cursor %q", spec.CursorFrom, got, cursor)
		}
	}
}

func TestHTTPPollCursorSentAsHeader(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 15, PageSize: 10, CursorHeader: "X-Since"})
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id", CursorField: "seq", CursorRequestHeader: "X-Since"})
	b1, err := src.Fetch(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	b2, err := src.Fetch(t.Context(), b1.Cursor)
	if err != nil {
		t.Fatal(err)
	}
	if got := keys([]*Batch{b1, b2}); !slices.Equal(got, ids(1, 15)) || b2.Cursor != "15" {
		t.Errorf("keys %v, cursor %q", got, b2.Cursor)
	}
	reqs := srv.Requests()
	if _, sent := reqs[0].Header["X-Since"]; sent || reqs[1].Header.Get("X-Since") != "10" {
		t.Errorf("X-Since headers %q then %q, want none then 10", reqs[0].Header.Values("X-Since"), reqs[1].Header.Get("X-Since"))
	}
}

func TestHTTPPollCursorInURL(t *testing.T) {
	type seen struct{ uri string }
	got := make(chan seen, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.RequestURI}
		if _, err := w.Write([]byte(`[{"id":1,"at":"a b/c&d+e"}]`)); err != nil {
			t.Errorf("test server: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL + "/v1/{cursor}/events?after={cursor}&limit=5",
		CursorField: "at", InitialCursor: "a"})
	b, err := src.Fetch(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.uri != "/v1/a/events?after=a&limit=5" {
		t.Errorf("request URI %q", r.uri)
	}
	if _, err := src.Fetch(t.Context(), b.Cursor); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.uri != "/v1/a%20b%2Fc&d+e/events?after=a+b%2Fc%26d%2Be&limit=5" {
		t.Errorf("request URI %q", r.uri)
	}
}

func TestPollCursorEncoding(t *testing.T) {
	for _, c := range []pollCursor{
		{Start: "123"}, {Start: "2024-05-01T10:00:00Z"}, {Start: `{"looks":"like json"}`},
		{Start: "", Found: "9", Next: "/x?after=9", Pages: 1}, {Start: "5", Next: "3", Pages: 2}, {},
	} {
		if got := decodeCursor(c.encode()); got != c {
			t.Errorf("decode(encode(%+v)) = %+v", c, got)
		}
	}
	// Cursors stored by the first http_poll are plain values.
	for _, s := range []string{"123", "", "{not json", `{"c":"1","x":2}`, `{"c":"1"} trailing`} {
		if got := decodeCursor(s); got != (pollCursor{Start: s}) {
			t.Errorf("decodeCursor(%q) = %+v, want the plain cursor", s, got)
		}
	}
	if got := (pollCursor{Start: "42"}).encode(); got != "42" {
		t.Errorf("a cursor between polls is stored as %q, want plain 42", got)
	}
}

func TestLinkNext(t *testing.T) {
	tests := map[string]string{
		`<https://a/x?page=2>; rel="next"`:                                        "https://a/x?page=2",
		`<https://a/x?page=1>; rel="prev", <https://a/x?page=3>; rel=next`:        "https://a/x?page=3",
		`</p/3>; title="a, b; rel=next"; rel="last", </p/2>; REL="prefetch Next"`: "/p/2",
		`<https://a/x>; rel="last"`:                                               "",
		`garbage`:                                                                 "",
		`<unterminated; rel="next"`:                                               "",
	}
	for in, want := range tests {
		if got := linkNext(in); got != want {
			t.Errorf("linkNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHTTPPollPaginationChangedMidPoll(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 25, PageSize: 10, Paging: testupstream.PageLink})
	stale := pollCursor{Start: "5", Found: "15", Next: "2", Pages: 1, Mode: "page"}.encode()
	src := openPoll(t, pagedSpec(srv.URL, HTTPPollSpec{Pagination: "link"}))
	batches := drain(t, src, stale)
	if got := keys(batches); !slices.Equal(got, ids(6, 25)) {
		t.Errorf("keys %v, want the poll started again from its cursor 5", got)
	}
	if first := srv.Requests()[0]; first.Query.Get("since") != "5" || first.Query.Has("after") || first.Query.Has("page") {
		t.Errorf("first request query %v, want only since=5", first.Query)
	}
}

// TestHTTPPollNullBodyCursorKeepsCursor pins what docs/sources.md promises: a null
// at cursor_body_field keeps the previous cursor.
func TestHTTPPollNullBodyCursorKeepsCursor(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := `{"items":[{"id":"a"}],"next_cursor":null}`
		if r.URL.Query().Get("c") == "" {
			body = `{"items":[],"next_cursor":"tok-1"}`
		}
		if _, err := w.Write([]byte(body)); err != nil {
			t.Errorf("test server: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, RecordsPath: "items", IDField: "id",
		CursorFrom: "body", CursorBodyField: "next_cursor", CursorParam: "c"})
	b, err := src.Fetch(t.Context(), "")
	if err != nil || b.Cursor != "tok-1" {
		t.Fatalf("first fetch: cursor %q, %v; want tok-1", b.Cursor, err)
	}
	b, err = src.Fetch(t.Context(), "tok-1")
	if err != nil || len(b.Records) != 1 || b.Cursor != "" {
		t.Fatalf("null cursor: %d records, cursor %q, %v; want 1 record and the cursor kept (\"\")", len(b.Records), b.Cursor, err)
	}
}

// bodyCursorSpec reads testupstream.PageBodyCursor: the cursor in the body,
// sent back as ?cursor=, and has_more saying whether to poll again at once.
func bodyCursorSpec(url string) *HTTPPollSpec {
	return &HTTPPollSpec{PollURL: url, RecordsPath: "data", IDField: "id", CursorFrom: "body",
		CursorBodyField: "next_cursor", CursorParam: "cursor", HasMoreField: "has_more"}
}

// TestHTTPPollHasMoreField pins issue 9 item 8: while has_more is true each
// page's batch has More (the caller polls again at once, not after the
// interval) and carries that page's next_cursor; the last page has no More.
func TestHTTPPollHasMoreField(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 25, PageSize: 10, Paging: testupstream.PageBodyCursor})
	src := openPoll(t, bodyCursorSpec(srv.URL))
	batches := drain(t, src, "")
	if got := keys(batches); !slices.Equal(got, ids(1, 25)) {
		t.Fatalf("keys %v, want ev-1..ev-25 exactly once, in order", got)
	}
	want := []string{testupstream.BodyCursor(10), testupstream.BodyCursor(20), testupstream.BodyCursor(25)}
	if len(batches) != len(want) {
		t.Fatalf("%d batches, want %d", len(batches), len(want))
	}
	for i, b := range batches {
		if b.Cursor != want[i] || b.More != (i < len(want)-1) {
			t.Errorf("batch %d: cursor %q more %v; want %q, more %v", i, b.Cursor, b.More, want[i], i < len(want)-1)
		}
	}
	for i, r := range srv.Requests() {
		if sent, exp := r.Query.Get("cursor"), []string{"", want[0], want[1]}[i]; sent != exp {
			t.Errorf("request %d sent cursor %q, want %q", i, sent, exp)
		}
	}
	// Caught up: has_more is false, so the caller waits for the interval.
	b, err := src.Fetch(t.Context(), want[2])
	if err != nil || len(b.Records) != 0 || b.More || b.Cursor != "" {
		t.Fatalf("caught up: %v, more %v, cursor %q; want no records, no More, the cursor kept", err, b != nil && b.More, b.Cursor)
	}
}

// TestHTTPPollCatchUpStopsAtMaxPages: a has_more catch-up run fetches at
// most max_pages pages back to back. With max_pages = 3 over 8 pages, the
// first two batches say More, the third says Capped (the caller waits for
// its interval, the cursor kept where the run stopped); the next fetch
// starts a new run from there, and the last page ends it with neither.
func TestHTTPPollCatchUpStopsAtMaxPages(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 80, PageSize: 10, Paging: testupstream.PageBodyCursor})
	spec := bodyCursorSpec(srv.URL)
	spec.MaxPages = 3
	src := openPoll(t, spec)
	cursor := ""
	var got []string
	for page := 1; page <= 8; page++ {
		b, err := src.Fetch(t.Context(), cursor)
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		cursor = b.Cursor
		wantMore, wantCapped := page%3 != 0 && page != 8, page%3 == 0
		if b.More != wantMore || b.Capped != wantCapped || len(b.Records) != 10 {
			t.Errorf("page %d: more %v capped %v, %d records; want more %v capped %v, 10 records",
				page, b.More, b.Capped, len(b.Records), wantMore, wantCapped)
		}
		got = append(got, keys([]*Batch{b})...)
	}
	if !slices.Equal(got, ids(1, 80)) {
		t.Errorf("keys %v, want ev-1..ev-80 once each, in order", got)
	}
}

// TestHTTPPollHasMoreWithoutProgress pins that has_more with a cursor that
// did not move (or none) does not make the caller poll again at once: that
// would only fetch the same page in a tight loop.
func TestHTTPPollHasMoreWithoutProgress(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := `{"data":[{"id":"a"}],"next_cursor":"c1","has_more":true}`
		if r.URL.Query().Get("cursor") == "nocursor" {
			body = `{"data":[],"has_more":true}`
		}
		if _, err := w.Write([]byte(body)); err != nil {
			t.Errorf("test server: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	src := openPoll(t, bodyCursorSpec(srv.URL))
	for _, cursor := range []string{"c1", "nocursor"} {
		b, err := src.Fetch(t.Context(), cursor)
		if err != nil || b.More {
			t.Errorf("from %q: %v, more %v; want no More", cursor, err, b != nil && b.More)
		}
	}
	if b, err := src.Fetch(t.Context(), "c0"); err != nil || !b.More || b.Cursor != "c1" {
		t.Errorf("from c0: %v; want More and cursor c1", err)
	}
}
