package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// modeFirehose serves the upstream of -mode real, in its own process.
const modeFirehose = "firehose"

// firehose is the HTTP upstream of -mode real: GET /events?since=S serves
// the JSON array of the events after S, at most pageSize of them, each
//
//	{"id":"ev-N","seq":N,"ts":"<RFC 3339 time of serving>","body":"xxx..."}
//
// padded with body to about eventSize bytes. Events are released by the
// bench through POST /release?n=N (events 1..N at once, served as fast as
// asked) and POST /pace?rate=R&until=T (the events up to T, released at R
// per second from now). A request for more than is released waits until a
// whole page is, or until the schedule's last event is; one with nothing
// left to come waits for the next release. So pages stay full under
// pacing, and the daemon's fetch time, taken when a page arrives, is not
// inflated by the wait.
type firehose struct {
	pageSize  int
	eventSize int

	mu       sync.Mutex
	schedule schedule
	changed  chan struct{} // closed, and replaced, when the schedule changes

	pages sync.Pool
	// pad is eventSize bytes of 'x', appended whole (a byte at a time, the
	// padding cost the firehose, which shares the machine's two cores with
	// what it measures, ~0.5 ms a page).
	pad []byte
}

// schedule says how many events are released at a given time: base at
// start, then rate more per second, up to until (rate 0: base, at once).
type schedule struct {
	base, until int64
	start       time.Time
	rate        float64
}

// released returns the number of events released at now.
func (s schedule) released(now time.Time) int64 {
	if s.rate == 0 {
		return s.base
	}
	return min(s.until, s.base+int64(s.rate*now.Sub(s.start).Seconds()))
}

// at returns when n events will have been released.
func (s schedule) at(n int64) time.Time {
	if s.rate == 0 || n <= s.base {
		return s.start
	}
	return s.start.Add(time.Duration(math.Ceil(float64(n-s.base) / s.rate * float64(time.Second))))
}

func newFirehose(pageSize, eventSize int) *firehose {
	return &firehose{pageSize: pageSize, eventSize: eventSize, changed: make(chan struct{}), pad: bytes.Repeat([]byte{'x'}, max(eventSize, 0))}
}

// ServeHTTP implements http.Handler.
func (f *firehose) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/events":
		since, err := strconv.ParseInt(cmp.Or(q.Get("since"), "0"), 10, 64)
		if err != nil || since < 0 {
			http.Error(w, "since must be a non-negative integer", http.StatusBadRequest)
			return
		}
		f.serveEvents(w, r, since)
	case r.Method == http.MethodPost && r.URL.Path == "/release":
		n, err := strconv.ParseInt(q.Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "n must be a non-negative integer", http.StatusBadRequest)
			return
		}
		f.setSchedule(schedule{base: n, until: n, start: time.Now()})
	case r.Method == http.MethodPost && r.URL.Path == "/pace":
		rate, err1 := strconv.ParseFloat(q.Get("rate"), 64)
		until, err2 := strconv.ParseInt(q.Get("until"), 10, 64)
		if err1 != nil || err2 != nil || !(rate > 0) || math.IsInf(rate, 0) {
			http.Error(w, "rate must be a positive number and until an integer", http.StatusBadRequest)
			return
		}
		now := time.Now()
		f.mu.Lock()
		base := f.schedule.released(now)
		f.mu.Unlock()
		f.setSchedule(schedule{base: base, until: max(base, until), start: now, rate: rate})
	default:
		http.NotFound(w, r)
	}
}

func (f *firehose) setSchedule(s schedule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.schedule = s
	close(f.changed)
	f.changed = make(chan struct{})
}

// serveEvents waits until the page after since is released, then serves
// it.
func (f *firehose) serveEvents(w http.ResponseWriter, r *http.Request, since int64) {
	for {
		now := time.Now()
		f.mu.Lock()
		s, changed := f.schedule, f.changed
		f.mu.Unlock()
		last := min(since+int64(f.pageSize), s.until)
		if last > since && s.released(now) >= last {
			f.writePage(w, since, last, now)
			return
		}
		wait := time.Hour // nothing more comes under this schedule
		if last > since {
			wait = s.at(last).Sub(now)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-changed:
		case <-r.Context().Done():
		}
		t.Stop()
		if r.Context().Err() != nil {
			return
		}
	}
}

// writePage writes events from+1..last.
func (f *firehose) writePage(w http.ResponseWriter, from, last int64, now time.Time) {
	bp, _ := f.pages.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	ts := now.UTC().Format(time.RFC3339Nano)
	b := append((*bp)[:0], '[')
	for n := from + 1; n <= last; n++ {
		if n > from+1 {
			b = append(b, ',')
		}
		start := len(b)
		b = append(b, `{"id":"ev-`...)
		b = strconv.AppendInt(b, n, 10)
		b = append(b, `","seq":`...)
		b = strconv.AppendInt(b, n, 10)
		b = append(b, `,"ts":"`...)
		b = append(b, ts...)
		b = append(b, `","body":"`...)
		if pad := f.eventSize - (len(b) - start) - 2; pad > 0 {
			b = append(b, f.pad[:min(pad, len(f.pad))]...)
		}
		b = append(b, `"}`...)
	}
	b = append(b, ']')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b) // a client gone away is its own problem
	*bp = b
	f.pages.Put(bp)
}

// runFirehose serves a firehose on addr until ctx is done or stdin closes
// (the bench that started it has gone), after printing its URL as the
// first line of stdout.
func runFirehose(ctx context.Context, o options, stdin io.Reader, stdout io.Writer) error {
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("firehose: %w", err)
	}
	srv := &http.Server{Handler: newFirehose(o.pageSize, o.eventSize), ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, stdin) // returns when the parent closes it or exits
		cancel()
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close() // ends Serve; blocked requests see their context cancelled
	}()
	if _, err := fmt.Fprintf(stdout, "firehose http://%s\n", ln.Addr()); err != nil {
		return fmt.Errorf("firehose: %w", errors.Join(err, ln.Close()))
	}
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("firehose: %w", err)
	}
	return nil
}

// firehoseURL reads the line runFirehose prints first.
func firehoseURL(line string) (string, error) {
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "firehose ")
	if !ok {
		return "", fmt.Errorf("firehose: unexpected first line %q", line)
	}
	return url, nil
}
