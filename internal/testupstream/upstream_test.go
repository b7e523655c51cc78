package testupstream

import (
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// get requests u with client and returns the response and its body.
func get(t *testing.T, client *http.Client, u string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, vals := range header {
		req.Header[name] = vals
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// seqs returns the seq of each record in a JSON array.
func seqs(t *testing.T, arr []byte) []int {
	t.Helper()
	var recs []struct {
		ID  string
		Seq int
	}
	if err := json.Unmarshal(arr, &recs); err != nil {
		t.Fatalf("%q: %v", arr, err)
	}
	out := make([]int, len(recs))
	for i, r := range recs {
		if r.ID != ID(r.Seq) {
			t.Errorf("record %d id %q, seq %d", i, r.ID, r.Seq)
		}
		out[i] = r.Seq
	}
	return out
}

func span(from, to int) []int {
	var out []int
	for n := from; n <= to; n++ {
		out = append(out, n)
	}
	return out
}

func TestServerPagingStyles(t *testing.T) {
	type page struct {
		records []byte
		next    string // the next request's URL, "" at the end
	}
	styles := map[Paging]func(s *Server, resp *http.Response, body []byte, reqURL string) page{
		PageLink: func(s *Server, resp *http.Response, body []byte, _ string) page {
			next := ""
			if l := resp.Header.Get("Link"); strings.Contains(l, `rel="next"`) {
				next = l[1:strings.IndexByte(l, '>')]
			}
			return page{body, next}
		},
		PageBodyURL: func(s *Server, _ *http.Response, body []byte, _ string) page {
			var v struct {
				Data json.RawMessage
				Next string
			}
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatal(err)
			}
			if v.Next != "" {
				v.Next = s.URL + v.Next
			}
			return page{v.Data, v.Next}
		},
		PageBodyToken: func(s *Server, _ *http.Response, body []byte, _ string) page {
			var v struct {
				Data  json.RawMessage
				Token string `json:"next_token"`
			}
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatal(err)
			}
			if v.Token == "" {
				return page{v.Data, ""}
			}
			return page{v.Data, s.URL + "/e?since=2&token=" + url.QueryEscape(v.Token)}
		},
	}
	bodyCursorEnd := ""
	styles[PageBodyCursor] = func(s *Server, _ *http.Response, body []byte, _ string) page {
		var v struct {
			Data    json.RawMessage
			Cursor  string `json:"next_cursor"`
			HasMore *bool  `json:"has_more"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatal(err)
		}
		if v.HasMore == nil || v.Cursor == "" {
			t.Fatalf("body cursor page %s: want next_cursor and has_more on every page", body)
		}
		if !*v.HasMore {
			bodyCursorEnd = v.Cursor
			return page{v.Data, ""}
		}
		return page{v.Data, s.URL + "/e?cursor=" + url.QueryEscape(v.Cursor)}
	}
	counter := func(param string) func(*Server, *http.Response, []byte, string) page {
		return func(s *Server, _ *http.Response, body []byte, reqURL string) page {
			if string(body) == "[]" {
				return page{body, ""}
			}
			u, _ := url.Parse(reqURL)
			n, _ := strconv.Atoi(u.Query().Get(param))
			step := 1
			if param == "offset" {
				step = len(seqs(t, body))
			}
			return page{body, s.URL + "/e?since=2&" + param + "=" + strconv.Itoa(n+step)}
		}
	}
	styles[PagePage] = counter("page")
	styles[PageOffset] = counter("offset")

	for paging, follow := range styles {
		s := NewServer(t, Options{Total: 23, PageSize: 5, Paging: paging})
		u := s.URL + "/e?since=2"
		switch paging {
		case PagePage:
			u += "&page=1"
		case PageOffset:
			u += "&offset=0"
		case PageBodyCursor:
			u = s.URL + "/e?cursor=" + url.QueryEscape(BodyCursor(2))
		}
		var got []int
		for range 20 {
			resp, body := get(t, http.DefaultClient, u, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("paging %d: status %d for %s", paging, resp.StatusCode, u)
			}
			p := follow(s, resp, body, u)
			got = append(got, seqs(t, p.records)...)
			if u = p.next; u == "" {
				break
			}
		}
		if !slices.Equal(got, span(3, 23)) {
			t.Errorf("paging %d: seqs %v, want 3..23 exactly once", paging, got)
		}
	}
	if bodyCursorEnd != BodyCursor(23) {
		t.Errorf("last next_cursor %q, want %q", bodyCursorEnd, BodyCursor(23))
	}
}

func TestServerFaultsAndLog(t *testing.T) {
	s := NewServer(t, Options{Total: 3, ETag: true, Gzip: true})
	s.Script(Status(http.StatusBadGateway), RateLimited(0, "9"), Body(http.StatusOK, NotJSON))
	resp, _ := get(t, http.DefaultClient, s.URL+"/x?since=1", http.Header{"X-Probe": {"1"}})
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("first status %d", resp.StatusCode)
	}
	resp, body := get(t, http.DefaultClient, s.URL, nil)
	if resp.Header.Get("X-RateLimit-Remaining") != "0" || resp.Header.Get("X-RateLimit-Reset") != "9" || !slices.Equal(seqs(t, body), span(1, 3)) {
		t.Errorf("rate limited response %v %q", resp.Header, body)
	}
	if _, body = get(t, http.DefaultClient, s.URL, nil); string(body) != NotJSON {
		t.Errorf("scripted body %q", body)
	}
	// ETag: the same page again is 304.
	resp, _ = get(t, http.DefaultClient, s.URL, nil)
	etag := resp.Header.Get("ETag")
	if resp, _ = get(t, http.DefaultClient, s.URL, http.Header{"If-None-Match": {etag}}); resp.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match: status %d", resp.StatusCode)
	}
	// Gzip, decoded by hand: the client asks for it itself.
	resp, body = get(t, http.DefaultClient, s.URL, http.Header{"Accept-Encoding": {"gzip"}})
	zr, err := gzip.NewReader(strings.NewReader(string(body)))
	if err != nil || resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip: %v, %v", err, resp.Header)
	}
	plain, err := io.ReadAll(zr)
	if err != nil || !slices.Equal(seqs(t, plain), span(1, 3)) {
		t.Errorf("gunzipped %q, %v", plain, err)
	}

	reqs := s.Requests()
	if len(reqs) != 6 {
		t.Fatalf("%d requests logged, want 6", len(reqs))
	}
	first := reqs[0]
	if first.Path != "/x" || first.Query.Get("since") != "1" || first.Header.Get("X-Probe") != "1" || first.Status != 502 || first.Time.IsZero() {
		t.Errorf("first request logged as %+v", first)
	}
	if reqs[4].Status != 304 || !reqs[5].Gzipped {
		t.Errorf("statuses %d, gzipped %v", reqs[4].Status, reqs[5].Gzipped)
	}
}

func TestServerOversize(t *testing.T) {
	s := NewServer(t, Options{Total: 1})
	s.Script(Oversize(10000))
	_, body := get(t, http.DefaultClient, s.URL, nil)
	if len(body) <= 10000 || !json.Valid(body) {
		t.Errorf("oversize body of %d bytes, valid %v", len(body), json.Valid(body))
	}
}

func TestServerPipeInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewServer(t, Options{Total: 2, Pipe: true})
		s.Script(RetryAfterDate(http.StatusTooManyRequests, 90*time.Second), Hang())
		client := &http.Client{Transport: &http.Transport{DialContext: s.DialContext}, Timeout: 5 * time.Second}
		t.Cleanup(client.CloseIdleConnections)
		start := time.Now()
		resp, _ := get(t, client, s.URL, nil)
		if when, err := http.ParseTime(resp.Header.Get("Retry-After")); err != nil || !when.Equal(start.Add(90*time.Second)) {
			t.Errorf("Retry-After %q, want +90s", resp.Header.Get("Retry-After"))
		}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Do(req); err == nil {
			t.Error("a hung request got an answer")
		}
		if took := time.Since(start); took != 5*time.Second {
			t.Errorf("the hung request gave up after %v of fake time, want the 5s timeout", took)
		}
		if _, body := get(t, client, s.URL, nil); !slices.Equal(seqs(t, body), span(1, 2)) {
			t.Errorf("after the faults: %q", body)
		}
		if reqs := s.Requests(); len(reqs) != 3 || reqs[1].Status != 0 {
			t.Errorf("requests %+v", reqs)
		}
	})
}

func TestFeedKeepsItsAPI(t *testing.T) {
	f := New(t, 5, 2)
	f.ServeMalformed(WrongShape, Empty)
	for _, want := range []string{WrongShape, Empty} {
		if _, body := get(t, http.DefaultClient, f.URL+"?since=0", nil); string(body) != want {
			t.Errorf("malformed body %q, want %q", body, want)
		}
	}
	if _, body := get(t, http.DefaultClient, f.URL+"?since=2", nil); !slices.Equal(seqs(t, body), []int{3, 4}) {
		t.Errorf("page after 2: %q", body)
	}
	if _, body := get(t, http.DefaultClient, f.URL+"?since=5", nil); string(body) != "[]" {
		t.Errorf("past the end: %q", body)
	}
	if resp, _ := get(t, http.DefaultClient, f.URL+"?since=x", nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad since: status %d", resp.StatusCode)
	}
	if got := f.Requests(); !slices.Equal(got, []string{"0", "0", "2", "5", "x"}) {
		t.Errorf("Requests() = %q", got)
	}
	if served := f.Served(); len(served) != 1 || !strings.Contains(served[0], ID(3)) {
		t.Errorf("Served() = %q, want the one non-empty page", served)
	}
}

func TestRateWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewServer(t, Options{Total: 5, Pipe: true, RateWindow: &RateWindow{Limit: 2, Window: 10 * time.Second, Headers: DraftRateLimit}})
		client := &http.Client{Transport: &http.Transport{DialContext: s.DialContext}}
		t.Cleanup(client.CloseIdleConnections)
		var got []string
		for range 3 {
			resp, _ := get(t, client, s.URL, nil)
			got = append(got, strconv.Itoa(resp.StatusCode)+" "+resp.Header.Get("RateLimit"))
		}
		time.Sleep(4 * time.Second)
		resp, _ := get(t, client, s.URL, nil) // still the spent window
		got = append(got, strconv.Itoa(resp.StatusCode)+" "+resp.Header.Get("RateLimit"))
		time.Sleep(6 * time.Second)
		resp, _ = get(t, client, s.URL, nil) // a new window
		got = append(got, strconv.Itoa(resp.StatusCode)+" "+resp.Header.Get("RateLimit"))
		want := []string{`200 "default";r=1;t=10`, `200 "default";r=0;t=10`, `429 "default";r=0;t=10`,
			`429 "default";r=0;t=6`, `200 "default";r=1;t=10`}
		if !slices.Equal(got, want) {
			t.Errorf("answers %q, want %q", got, want)
		}
		if n := s.Overruns(); n != 2 {
			t.Errorf("%d overruns, want 2", n)
		}
		if p := resp.Header.Get("RateLimit-Policy"); p != `"default";q=2;w=10` {
			t.Errorf("RateLimit-Policy %q", p)
		}
	})
}
