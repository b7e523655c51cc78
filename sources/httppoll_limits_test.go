package sources

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// These tests run in synctest bubbles, on fake time: the upstream serves
// on an in-memory network (testupstream.Options.Pipe), since a goroutine
// blocked on a socket would keep the bubble's clock from advancing.

// openPipe opens spec against a Pipe server; call it inside the bubble.
func openPipe(t *testing.T, srv *testupstream.Server, spec *HTTPPollSpec, env Env) *httpPoll {
	t.Helper()
	if env.Name == "" {
		env.Name, env.Timeout = "feed", 10*time.Second
	}
	src := openPollEnv(t, spec, env).(*httpPoll)
	src.transport.DialContext = srv.DialContext
	return src
}

// politeFetch fetches as the caller does: it waits out every WaitError
// (never calling Fetch before Until) and returns the first other result.
// Every WaitError must say why it waits (the status page shows it).
func politeFetch(t *testing.T, src Source, cursor string) (*Batch, error) {
	t.Helper()
	for range 100 {
		b, err := src.Fetch(t.Context(), cursor)
		var wait *WaitError
		if !errors.As(err, &wait) {
			return b, err
		}
		if wait.Reason != WaitRetryAfter && wait.Reason != WaitRateLimit {
			t.Errorf("WaitError %v has reason %q, want %s or %s", wait, wait.Reason, WaitRetryAfter, WaitRateLimit)
		}
		time.Sleep(time.Until(wait.Until))
	}
	t.Fatal("still asked to wait after 100 fetches")
	return nil, nil
}

func TestHTTPPollRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		name  string
		fault testupstream.Fault
		wait  time.Duration
	}{
		{"429 delta-seconds", testupstream.RetryAfter(http.StatusTooManyRequests, 3), 3 * time.Second},
		{"503 delta-seconds", testupstream.RetryAfter(http.StatusServiceUnavailable, 120), 2 * time.Minute},
		{"429 HTTP date", testupstream.RetryAfterDate(http.StatusTooManyRequests, 5*time.Second), 5 * time.Second},
		{"503 HTTP date", testupstream.RetryAfterDate(http.StatusServiceUnavailable, time.Hour), time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := testupstream.NewServer(t, testupstream.Options{Total: 5, Pipe: true})
				srv.Script(tt.fault)
				var tr traces
				src := openPipe(t, srv, &HTTPPollSpec{PollURL: srv.URL, IDField: "id"},
					Env{Name: "feed", Timeout: 10 * time.Second, Trace: tr.add})
				start := time.Now()
				_, err := src.Fetch(t.Context(), "")
				var wait *WaitError
				if !errors.As(err, &wait) || !wait.Until.Equal(start.Add(tt.wait)) || wait.Reason != WaitRetryAfter {
					t.Fatalf("Fetch error %v, want a WaitError until +%v with reason %s", err, tt.wait, WaitRetryAfter)
				}
				if ev := tr.all()[0]; !strings.HasPrefix(ev.Note, "Retry-After ") {
					t.Errorf("trace note %q", ev.Note)
				}
				// A caller calling too early gets the same answer, and no
				// request goes out.
				time.Sleep(tt.wait - time.Millisecond)
				if _, err := src.Fetch(t.Context(), ""); !errors.As(err, &wait) || !wait.Until.Equal(start.Add(tt.wait)) || wait.Reason != WaitRetryAfter {
					t.Errorf("early Fetch: %v", err)
				}
				if n := len(srv.Requests()); n != 1 {
					t.Errorf("%d requests before Retry-After expired, want 1", n)
				}
				b, err := politeFetch(t, src, "")
				if err != nil || len(b.Records) != 5 {
					t.Fatalf("after the wait: %v, %v", b, err)
				}
				reqs := srv.Requests()
				if len(reqs) != 2 || reqs[1].Time.Before(start.Add(tt.wait)) {
					t.Errorf("requests at %v, want the second at or after +%v", reqTimes(reqs, start), tt.wait)
				}
			})
		})
	}
}

func TestHTTPPollRetryAfterAbsentOrPast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := testupstream.NewServer(t, testupstream.Options{Total: 1, Pipe: true})
		past := testupstream.Status(http.StatusTooManyRequests)
		past.Header = http.Header{"Retry-After": {time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)}}
		srv.Script(testupstream.Status(http.StatusServiceUnavailable), past, testupstream.RetryAfter(http.StatusInternalServerError, 5))
		src := openPipe(t, srv, &HTTPPollSpec{PollURL: srv.URL}, Env{})
		for i := range 3 {
			_, err := src.Fetch(t.Context(), "")
			var wait *WaitError
			if err == nil || errors.As(err, &wait) {
				t.Errorf("fault %d: %v, want a plain error", i, err)
			}
		}
	})
}

func TestHTTPPollRateLimitWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := testupstream.NewServer(t, testupstream.Options{Total: 200, PageSize: 10, Paging: testupstream.PagePage, Pipe: true})
		var tr traces
		spec := &HTTPPollSpec{PollURL: srv.URL, IDField: "id", Pagination: "page", PageParam: "page", MaxPages: 100, RateLimit: "10/s"}
		src := openPipe(t, srv, spec, Env{Name: "feed", Timeout: 10 * time.Second, Trace: tr.add})
		start := time.Now()
		batches := drain(t, src, "")
		if len(keys(batches)) != 200 {
			t.Fatalf("%d records, want 200", len(keys(batches)))
		}
		reqs := srv.Requests()
		n := len(reqs) // 20 pages and the empty one
		if n != 21 {
			t.Fatalf("%d requests, want 21", n)
		}
		if took := time.Since(start); took < time.Duration(n-1)*100*time.Millisecond {
			t.Errorf("%d requests took %v, want at least %v", n, took, time.Duration(n-1)*100*time.Millisecond)
		}
		for i := 1; i < n; i++ {
			if gap := reqs[i].Time.Sub(reqs[i-1].Time); gap < 100*time.Millisecond {
				t.Errorf("requests %d and %d are %v apart, want >= 100ms", i-1, i, gap)
			}
		}
		if ev := tr.all()[1]; ev.Note != "page 2; waited 100ms for rate limit" {
			t.Errorf("second trace note %q", ev.Note)
		}
	})
}

func TestHTTPPollSharedRateLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := testupstream.NewServer(t, testupstream.Options{Total: 1, Pipe: true})
		lim := NewRateLimiters()
		r, err := ParseRate("5/s")
		if err != nil {
			t.Fatal(err)
		}
		lim.Add("api", r, 1)
		var wg sync.WaitGroup
		for i := range 2 {
			src := openPipe(t, srv, &HTTPPollSpec{PollURL: srv.URL + "/" + strconv.Itoa(i), RateLimiter: "api"},
				Env{Name: "feed" + strconv.Itoa(i), Timeout: 10 * time.Second, Limiters: lim})
			wg.Go(func() {
				for range 5 {
					if _, err := src.Fetch(t.Context(), ""); err != nil {
						t.Errorf("Fetch: %v", err)
					}
				}
			})
		}
		wg.Wait()
		reqs := srv.Requests()
		if len(reqs) != 10 {
			t.Fatalf("%d requests, want 10", len(reqs))
		}
		for i := 1; i < len(reqs); i++ {
			if gap := reqs[i].Time.Sub(reqs[i-1].Time); gap < 200*time.Millisecond {
				t.Errorf("requests %d (%s) and %d (%s) are %v apart, want >= 200ms across both sources",
					i-1, reqs[i-1].Path, i, reqs[i].Path, gap)
			}
		}
	})
}

func TestHTTPPollSlowRateLimitHandsBackTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := testupstream.NewServer(t, testupstream.Options{Total: 1, Pipe: true})
		src := openPipe(t, srv, &HTTPPollSpec{PollURL: srv.URL, RateLimit: "1/m"}, Env{})
		start := time.Now()
		fetch := func() error {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // as the caller bounds a fetch
			defer cancel()
			_, err := src.Fetch(ctx, "")
			return err
		}
		if err := fetch(); err != nil {
			t.Fatal(err)
		}
		// The next slot is a minute away, beyond the fetch's deadline: the
		// wait is handed back rather than failing the fetch every time.
		err := fetch()
		var wait *WaitError
		if !errors.As(err, &wait) || !wait.Until.Equal(start.Add(time.Minute)) || wait.Reason != WaitRateLimit {
			t.Fatalf("second Fetch: %v (reason %q), want a WaitError until +1m, reason %s", err, wait.Reason, WaitRateLimit)
		}
		time.Sleep(time.Until(wait.Until))
		if err := fetch(); err != nil {
			t.Fatalf("third Fetch: %v", err)
		}
		if reqs := srv.Requests(); len(reqs) != 2 || !reqs[1].Time.Equal(start.Add(time.Minute)) {
			t.Errorf("requests at %v, want +0s and +1m (the slot reserved, not queued again)", reqTimes(reqs, start))
		}
	})
}

func TestHTTPPollRateLimitHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The bubble's clock starts in 2000, when unix seconds were below
		// 1e9, which X-RateLimit-Reset reads as seconds from now.
		time.Sleep(time.Until(time.Unix(1e9, 0)) + time.Hour)
		srv := testupstream.NewServer(t, testupstream.Options{Total: 1, Pipe: true})
		start := time.Now()
		srv.Script(
			testupstream.RateLimited(0, "5"), // seconds from now
			testupstream.RateLimited(0, strconv.FormatInt(start.Add(65*time.Second).Unix(), 10)), // unix seconds
			testupstream.RateLimited(3, "1"), // budget left: no wait
		)
		src := openPipe(t, srv, &HTTPPollSpec{PollURL: srv.URL, SlowOnRateLimitHeaders: true}, Env{})
		want := []time.Duration{0, 5 * time.Second, 65 * time.Second, 65 * time.Second}
		for range want {
			if _, err := politeFetch(t, src, ""); err != nil {
				t.Fatal(err)
			}
		}
		reqs := srv.Requests()
		for i, w := range want {
			if got := reqs[i].Time.Sub(start); got != w {
				t.Errorf("request %d at +%v, want +%v", i, got, w)
			}
		}
		// Without slow_on_ratelimit_headers the headers are ignored.
		srv.Script(testupstream.RateLimited(0, "5"))
		plain := openPipe(t, srv, &HTTPPollSpec{PollURL: srv.URL}, Env{})
		for range 2 {
			if _, err := plain.Fetch(t.Context(), ""); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestHTTPPollRateLimitedForbidden(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := testupstream.NewServer(t, testupstream.Options{Total: 1, Pipe: true})
		f := testupstream.Status(http.StatusForbidden)
		f.Header = http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"30"}}
		srv.Script(f)
		src := openPipe(t, srv, &HTTPPollSpec{PollURL: srv.URL, SlowOnRateLimitHeaders: true}, Env{})
		_, err := src.Fetch(t.Context(), "")
		var wait *WaitError
		if !errors.As(err, &wait) || time.Until(wait.Until) != 30*time.Second || wait.Reason != WaitRateLimit {
			t.Errorf("403 with an exhausted rate limit: %v, want a WaitError for 30s with reason %s", err, WaitRateLimit)
		}
	})
}

func TestHTTPPollSlowUpstreamTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := testupstream.NewServer(t, testupstream.Options{Total: 1, Pipe: true})
		srv.Script(testupstream.Hang())
		src := openPipe(t, srv, &HTTPPollSpec{PollURL: srv.URL}, Env{Name: "feed", Timeout: 2 * time.Second})
		start := time.Now()
		_, err := src.Fetch(t.Context(), "")
		var ne net.Error
		var perm *PermanentError
		if !errors.As(err, &ne) || !ne.Timeout() || errors.As(err, &perm) {
			t.Errorf("Fetch error %v, want a plain timeout", err)
		}
		if took := time.Since(start); took != 2*time.Second {
			t.Errorf("gave up after %v, want the 2s timeout", took)
		}
		if b, err := src.Fetch(t.Context(), ""); err != nil || len(b.Records) != 1 {
			t.Errorf("after the hang: %v, %v", b, err)
		}
	})
}

// reqTimes lists request times relative to start.
func reqTimes(reqs []testupstream.Request, start time.Time) []time.Duration {
	out := make([]time.Duration, len(reqs))
	for i, r := range reqs {
		out[i] = r.Time.Sub(start)
	}
	return out
}

// TestHTTPPollPoliteByDefault polls a rate-limit window as fast as the
// source lets it, with the default spec, for each style of rate-limit
// header: no request may arrive in a window whose budget is spent.
func TestHTTPPollPoliteByDefault(t *testing.T) {
	for _, tt := range []struct {
		name    string
		headers testupstream.RateHeaders
	}{
		{"X-RateLimit", testupstream.XRateLimit},
		{"RateLimit-Remaining", testupstream.PlainRateLimit},
		{"RateLimit structured", testupstream.DraftRateLimit},
		{"RateLimit dictionary", testupstream.DictRateLimit},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := testupstream.NewServer(t, testupstream.Options{Total: 1000, PageSize: 10, Pipe: true,
					RateWindow: &testupstream.RateWindow{Limit: 3, Window: 10 * time.Second, Headers: tt.headers}})
				spec := newHTTPPollSpec()
				spec.PollURL = srv.URL
				src := openPipe(t, srv, spec, Env{})
				var failed int
				for range 12 {
					if _, err := politeFetch(t, src, ""); err != nil {
						failed++
					}
				}
				if n := srv.Overruns(); n != 0 || failed != 0 {
					t.Errorf("%d request(s) overran the rate-limit window, %d fetch(es) failed; want none", n, failed)
				}
				if n := len(srv.Requests()); n != 12 {
					t.Errorf("%d requests, want 12", n)
				}
			})
		})
	}
}

func TestRateLimitResetHeaderStyles(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name string
		h    http.Header
		wait time.Duration // 0: no wait
	}{
		{"X-RateLimit", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"30"}}, 30 * time.Second},
		{"X-RateLimit unix", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {strconv.FormatInt(now.Unix()+7, 10)}}, 7 * time.Second},
		{"RateLimit-Reset", http.Header{"Ratelimit-Remaining": {"0"}, "Ratelimit-Reset": {"12"}}, 12 * time.Second},
		{"RateLimit-Remaining left", http.Header{"Ratelimit-Remaining": {"2"}, "Ratelimit-Reset": {"12"}}, 0},
		{"structured", http.Header{"Ratelimit": {`"default";r=0;t=30`}}, 30 * time.Second},
		{"structured two policies", http.Header{"Ratelimit": {`"burst";r=5;t=1, "day";r=0;t=600`}}, 10 * time.Minute},
		{"structured budget left", http.Header{"Ratelimit": {`"default";r=3;t=30`}}, 0},
		{"dictionary", http.Header{"Ratelimit": {"limit=10, remaining=0, reset=30"}}, 30 * time.Second},
		{"dictionary budget left", http.Header{"Ratelimit": {"limit=10, remaining=4, reset=30"}}, 0},
		{"malformed", http.Header{"Ratelimit": {`r=;t=x, remaining=zero`}}, 0},
		{"none", http.Header{}, 0},
	} {
		until, ok := rateLimitReset(tt.h, now)
		if tt.wait == 0 {
			if ok {
				t.Errorf("%s: wait until %v, want none", tt.name, until)
			}
			continue
		}
		if !ok || until.Sub(now) != tt.wait {
			t.Errorf("%s: got %v (%v), want a wait of %v", tt.name, until.Sub(now), ok, tt.wait)
		}
	}
}
