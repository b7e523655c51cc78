package main

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// soakUpstreams serves every polled and streamed upstream of the soak from
// the bench's own process, on one HTTP server:
//
//   - /events: the firehose (firehose.go), paced at -rate;
//   - /quiet: an API with nothing new, 304 and `[]` in turn;
//   - /broken: a persistently malformed API, the same bad page every poll;
//   - /big: `[]`, or once per arming a page of -big-page tiny records;
//   - /huge: `[]`, or once per arming a chunked body of -refused-body
//     bytes that never ends as JSON, refused at max_body_bytes;
//   - /stream: a WebSocket feed of records at a steady rate, resuming
//     from the cursor in its URL and dropping each connection after
//     streamDropAfter, so reconnects are part of the run.
type soakUpstreams struct {
	fire *firehose

	bigArmed, hugeArmed atomic.Bool
	bigServed           atomic.Int64 // pages served so far, numbering their records
	bigRecords          int
	hugeBytes           int64
	quietPolls          atomic.Int64

	stream soakStream
}

// brokenPage is what /broken serves every time: one digest, so one dead
// letter however many polls.
const brokenPage = `[{"id":"broken-1","v":1},{"id":"broken-2","v":`

// streamDropAfter is how long a /stream connection lasts before the feed
// drops it: longer than the source's default reconnect_max (30 s), after
// which a reconnect is immediate again (a source whose connections keep
// dropping sooner backs off up to reconnect_max, by design).
const streamDropAfter = 40 * time.Second

func (u *soakUpstreams) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/events":
		u.fire.ServeHTTP(w, r)
	case "/quiet":
		if u.quietPolls.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		writeJSON(w, []byte("[]"))
	case "/broken":
		writeJSON(w, []byte(brokenPage))
	case "/big":
		if !u.bigArmed.CompareAndSwap(true, false) {
			writeJSON(w, []byte("[]"))
			return
		}
		writeJSON(w, bigPage(u.bigServed.Add(1), u.bigRecords))
	case "/huge":
		if !u.hugeArmed.CompareAndSwap(true, false) {
			writeJSON(w, []byte("[]"))
			return
		}
		serveEndless(w, r, u.hugeBytes)
	case "/stream":
		u.stream.serve(w, r)
	default:
		http.NotFound(w, r)
	}
}

func writeJSON(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b) // a client gone away is its own problem
}

// bigPage returns page number page of /big: n records {"id":"bPAGE-I"}
// (I from 1), about 14 bytes each.
func bigPage(page int64, n int) []byte {
	b := make([]byte, 0, n*20)
	b = append(b, '[')
	for i := 1; i <= n; i++ {
		if i > 1 {
			b = append(b, ',')
		}
		b = append(b, `{"id":"b`...)
		b = strconv.AppendInt(b, page, 10)
		b = append(b, '-')
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `"}`...)
	}
	return append(b, ']')
}

// serveEndless writes an array that never closes, up to limit bytes,
// chunked, until the client hangs up.
func serveEndless(w http.ResponseWriter, r *http.Request, limit int64) {
	w.Header().Set("Content-Type", "application/json")
	chunk := make([]byte, 0, 64<<10)
	chunk = append(chunk, '[')
	for len(chunk) < cap(chunk)-16 {
		chunk = append(chunk, `{"id":"x"},`...)
	}
	for sent := int64(0); sent < limit && r.Context().Err() == nil; sent += int64(len(chunk)) {
		if _, err := w.Write(chunk); err != nil {
			return
		}
		chunk[0] = '{' // only the first chunk opens the array
	}
}

// soakStream is the /stream WebSocket feed: record N is
// {"id":"sN","seq":N,...}, released at rate per second from the start;
// stop freezes the count.
type soakStream struct {
	rate  float64
	start time.Time

	mu      sync.Mutex
	stopped bool
	final   int64
	conns   atomic.Int64
}

// released returns the records released by now.
func (s *soakStream) released(now time.Time) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return s.final
	}
	return int64(s.rate * now.Sub(s.start).Seconds())
}

// stop freezes the feed and returns its last record number.
func (s *soakStream) stop() int64 {
	n := s.released(time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped, s.final = true, n
	return n
}

func (s *soakStream) serve(w http.ResponseWriter, r *http.Request) {
	since, err := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64)
	if r.URL.Query().Get("since") == "" {
		since, err = 0, nil
	}
	if err != nil || since < 0 {
		http.Error(w, "since must be a record number", http.StatusBadRequest)
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	s.conns.Add(1)
	ctx := c.CloseRead(r.Context())
	defer func() { _ = c.CloseNow() }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	next, end := since+1, time.Now().Add(streamDropAfter)
	for time.Now().Before(end) {
		for ; next <= s.released(time.Now()); next++ {
			msg := fmt.Appendf(nil, `{"id":"s%d","seq":%d,"ts":%q,"body":"reading"}`, next, next, time.Now().UTC().Format(time.RFC3339Nano))
			if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	// Dropped without a close frame: the source reconnects from its cursor.
}

// newSoakUpstreams returns the upstreams, the firehose not yet released.
func newSoakUpstreams(o soakOptions) *soakUpstreams {
	return &soakUpstreams{
		fire:       newFirehose(100, realEventSize),
		bigRecords: o.bigPage,
		hugeBytes:  o.refusedBody,
		stream:     soakStream{rate: o.streamRate, start: time.Now()},
	}
}

// startStreams releases the firehose at rate from now on and restarts the
// stream's clock.
func (u *soakUpstreams) start(rate float64) {
	u.fire.setSchedule(schedule{until: 1 << 62, start: time.Now(), rate: rate})
	u.stream.mu.Lock()
	u.stream.start = time.Now()
	u.stream.mu.Unlock()
}

// stopFeeds freezes the firehose and the stream and returns how many
// records each released in all.
func (u *soakUpstreams) stopFeeds() (firehose, stream int64) {
	now := time.Now()
	u.fire.mu.Lock()
	n := u.fire.schedule.released(now)
	u.fire.mu.Unlock()
	u.fire.setSchedule(schedule{base: n, until: n, start: now})
	return n, u.stream.stop()
}
