package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/adminapi"
	"github.com/ingestorhq/ingestor/internal/tap"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// tapClient reaches a daemon's admin endpoints: base is their URL.
type tapClient struct {
	base   string
	client *http.Client
	token  string
}

// adminTapClient reaches h's admin endpoints, on a Unix socket when
// admin_addr is one.
func adminTapClient(h *harness, token string) tapClient {
	addr := h.d.AdminAddr()
	if !strings.HasPrefix(addr, "/") {
		return tapClient{base: "http://" + addr, client: &http.Client{}, token: token}
	}
	return tapClient{base: "http://localhost", token: token, client: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}}}}
}

// tapStream is one GET /tap session as a client reads it.
type tapStream struct {
	t          *testing.T
	resp       *http.Response
	sc         *bufio.Scanner
	cancel     context.CancelFunc
	start      adminapi.TapStart
	keepalives int
}

// open starts GET /tap?query and reads its first line; the session ends
// when the test does, or with close.
func (c tapClient) open(t *testing.T, query string) *tapStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/tap?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		t.Fatalf("GET /tap?%s: %v", query, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /tap?%s: %s", query, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("GET /tap: Content-Type %q", ct)
	}
	s := &tapStream{t: t, resp: resp, sc: bufio.NewScanner(resp.Body), cancel: cancel}
	s.sc.Buffer(nil, 1<<20)
	typ, line := s.next()
	if typ != adminapi.TapTypeStart {
		t.Fatalf("GET /tap: first line %s, want the start line", line)
	}
	if err := json.Unmarshal(line, &s.start); err != nil {
		t.Fatal(err)
	}
	return s
}

// status answers GET /tap?query with the request's status and body, for a
// session refused.
func (c tapClient) status(t *testing.T, query string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, c.base+"/tap?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, ""
	}
	var e struct{ Error string }
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error
}

// line returns the next line, and its type ("" for a keepalive), or an
// error when the stream ended. It may run on any goroutine.
func (s *tapStream) line() (string, []byte, error) {
	if !s.sc.Scan() {
		return "", nil, fmt.Errorf("tap stream ended: %v", s.sc.Err())
	}
	line := s.sc.Bytes()
	if len(line) == 0 {
		s.keepalives++
		return "", nil, nil
	}
	var l struct{ Type string }
	if err := json.Unmarshal(line, &l); err != nil {
		return "", nil, fmt.Errorf("tap line %q: %w", line, err)
	}
	return l.Type, append([]byte(nil), line...), nil
}

// next returns the next line that is not a keepalive, and its type.
func (s *tapStream) next() (string, []byte) {
	s.t.Helper()
	for {
		typ, line, err := s.line()
		if err != nil {
			s.t.Fatal(err)
		}
		if typ != "" {
			return typ, line
		}
	}
}

// event reads the next line, which must be an event's, and returns it.
func (s *tapStream) event() adminapi.TapEvent {
	s.t.Helper()
	typ, line := s.next()
	var ev adminapi.TapEvent
	if err := json.Unmarshal(line, &ev); err != nil || typ != adminapi.TapTypeEvent {
		s.t.Fatalf("tap line %s, want an event (%v)", line, err)
	}
	return ev
}

// close ends the session from the client's side.
func (s *tapStream) close() {
	s.cancel()
	_ = s.resp.Body.Close()
}

// tapSources is a gated http_poll source "api", a second one "other" and
// a webhook source "hooks".
func tapSources(api, other *testupstream.Feed) string {
	return httpSource("api", api.URL) + httpSource("other", other.URL) + `
[push]
addr = "127.0.0.1:0"

[source.hooks]
kind = "webhook"
id_field = "id"
`
}

// TestTapShowsCommittedEvents taps a daemon with two polled sources and a
// webhook source: a session asking for "api" and "hooks" (one as a comma
// list) sees every event of both once it is committed, with its source,
// key, seq, times and the payload cut at max_bytes with its full size,
// and no event of "other", committed before api's; an unknown source is
// refused with the configured ones listed.
func TestTapShowsCommittedEvents(t *testing.T) {
	api, other := testupstream.NewHeld(t, 30, 10), testupstream.NewHeld(t, 20, 10)
	h := startDaemon(t, "", "", tapSources(api, other))
	c := adminTapClient(h, "")
	code, msg := c.status(t, "source=api,nope", nil)
	if code != http.StatusBadRequest || msg != `unknown source "nope": the configured sources are api, hooks, other` {
		t.Errorf("GET /tap?source=api,nope = %d %q", code, msg)
	}
	if code, msg := c.status(t, "max_bytes=-1", nil); code != http.StatusBadRequest || !strings.Contains(msg, "max_bytes") {
		t.Errorf("GET /tap?max_bytes=-1 = %d %q", code, msg)
	}
	s := c.open(t, "source=api,hooks&max_bytes=20")
	if st := s.start; strings.Join(st.Sources, ",") != "api,hooks" || st.MaxBytes != 20 || st.BufferEvents != tap.BufferEvents || st.BufferBytes != tap.BufferBytes {
		t.Errorf("start line %+v", st)
	}
	other.Release()
	testsync.WaitFor(t, `the 20 events of "other" committed`, 30*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_source_events_total", "source", "other") == 20
	})
	tapped := time.Now()
	api.Release()
	for n := 1; n <= 30; n++ {
		ev := s.event()
		rec := testupstream.Record(n)
		if ev.Source != "api" || ev.Key != testupstream.ID(n) || ev.Seq <= 0 || ev.Size != len(rec) || !ev.Truncated ||
			ev.Payload == nil || *ev.Payload != string(rec[:20]) || ev.PayloadB64 != "" {
			t.Fatalf("event %d: %+v; want api %s, its first 20 of %d bytes %q", n, ev, testupstream.ID(n), len(rec), rec[:20])
		}
		if ev.CommittedAt.Before(tapped) || ev.FetchedAt.After(ev.CommittedAt) || ev.EventTime.IsZero() {
			t.Errorf("event %d: times %v, %v, %v", n, ev.FetchedAt, ev.CommittedAt, ev.EventTime)
		}
	}
	resp, err := http.Post("http://"+h.d.PushAddr()+"/ingest/hooks", "application/json", strings.NewReader(`{"id":"h1","n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("webhook answered %s", resp.Status)
	}
	ev := s.event()
	if ev.Source != "hooks" || ev.Key != "h1" || ev.Truncated || ev.Size != 17 || ev.Payload == nil || *ev.Payload != `{"id":"h1","n":1}` {
		t.Errorf("webhook event %+v", ev)
	}
}

// TestTapNeedsTheAdminToken: with daemon.admin_token set, GET /tap
// without it, or with another, is refused (it shows payloads); with it, a
// session starts.
func TestTapNeedsTheAdminToken(t *testing.T) {
	h := startDaemonWith(t, fmt.Sprintf("admin_token = %q", testToken), "", "", "", Options{})
	c := adminTapClient(h, testToken)
	for _, header := range []map[string]string{nil, {"Authorization": "Bearer " + testToken + "x"}, {"Authorization": testToken}} {
		if code, msg := c.status(t, "", header); code != http.StatusUnauthorized || !strings.Contains(msg, "admin token") {
			t.Errorf("GET /tap with %v = %d %q, want 401", header, code, msg)
		}
	}
	s := c.open(t, "")
	if len(s.start.Sources) != 0 || s.start.MaxBytes != defaultTapMaxBytes {
		t.Errorf("start line %+v: want every source and %d bytes", s.start, defaultTapMaxBytes)
	}
}

// TestTapSlowClientDropsAndNeverBlocks: a client that stops reading does
// not hold the commits back: all 5000 events commit while it reads
// nothing (over a Unix socket, whose buffer is small and fixed, so that
// its session's buffer fills). The events its buffer had no room for are
// dropped and counted; once it reads again it gets the events buffered,
// then a "dropped" line, and every event is either read or counted.
func TestTapSlowClientDropsAndNeverBlocks(t *testing.T) {
	const total = 5000
	api := testupstream.NewHeld(t, total, 500)
	sock := filepath.Join(t.TempDir(), "admin.sock")
	h := startDaemonWith(t, fmt.Sprintf("admin_addr = %q", "unix:"+sock), "", "", httpSource("api", api.URL), Options{})
	s := adminTapClient(h, "").open(t, "max_bytes=16")
	api.Release()
	testsync.WaitFor(t, "every event committed while the tap client reads nothing", 60*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_source_events_total", "source", "api") == total
	})
	if metric(t, h.d.Registry(), "ingestor_tap_dropped_events_total") == 0 {
		t.Fatal("no event dropped for a client that read nothing: is the session's buffer bounded?")
	}
	var read, dropped, lastSeq int64
	for read+dropped < total {
		typ, line := s.next()
		switch typ {
		case adminapi.TapTypeEvent:
			var ev adminapi.TapEvent
			if err := json.Unmarshal(line, &ev); err != nil || ev.Seq <= lastSeq || dropped > 0 {
				t.Fatalf("event %s after seq %d and %d dropped (%v): the dropped ones come last", line, lastSeq, dropped, err)
			}
			lastSeq = ev.Seq
			read++
		case adminapi.TapTypeDropped:
			var d adminapi.TapDropped
			if err := json.Unmarshal(line, &d); err != nil || d.Dropped <= 0 {
				t.Fatalf("dropped line %s (%v)", line, err)
			}
			dropped += d.Dropped
		default:
			t.Fatalf("unexpected line %s", line)
		}
	}
	if dropped == 0 || read < int64(tap.BufferEvents) {
		t.Errorf("read %d events, %d dropped; want the buffer's %d at least, and a dropped line", read, dropped, tap.BufferEvents)
	}
	if got := metric(t, h.d.Registry(), "ingestor_tap_dropped_events_total"); got != float64(dropped) {
		t.Errorf("ingestor_tap_dropped_events_total = %v, the dropped lines said %d", got, dropped)
	}
	t.Logf("read %d events, %d dropped", read, dropped)
}

// tapGoroutines returns the stacks of goroutines serving tap sessions.
func tapGoroutines() string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	var out []string
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "handleTap") || strings.Contains(g, "tapSession") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestTapSessionsAreCappedAndCleanedUp: the daemon serves 4 sessions at
// once and answers 503 to a fifth; a client that goes away frees its
// session, whose goroutines end.
func TestTapSessionsAreCappedAndCleanedUp(t *testing.T) {
	h := startDaemonWith(t, "", "", "", "", Options{})
	c := adminTapClient(h, "")
	var open []*tapStream
	for range tap.DefaultMaxSessions {
		open = append(open, c.open(t, ""))
	}
	if code, msg := c.status(t, "", nil); code != http.StatusServiceUnavailable || !strings.Contains(msg, "4 tap sessions are open") {
		t.Errorf("a fifth session: %d %q, want 503", code, msg)
	}
	sessions := func() float64 { return metric(t, h.d.Registry(), "ingestor_tap_sessions") }
	if n := sessions(); n != 4 {
		t.Errorf("ingestor_tap_sessions = %v, want 4", n)
	}
	open[0].close()
	testsync.WaitFor(t, "the session of the client gone freed", 10*time.Second, func() bool { return sessions() == 3 })
	open[0] = c.open(t, "")
	for _, s := range open {
		s.close()
	}
	testsync.WaitFor(t, "every session freed and its goroutines ended", 10*time.Second, func() bool {
		return sessions() == 0 && tapGoroutines() == ""
	})
}

// TestTapOutlivesTimeoutsAndEndsOnStop: a session outlives the ops
// listener's read and write timeouts (shortened here to 200ms), getting
// keepalives while idle and events after; when the daemon stops, a
// reading session gets an "end" line, and one whose client reads nothing,
// its socket full, does not hold the stop.
func TestTapOutlivesTimeoutsAndEndsOnStop(t *testing.T) {
	api := testupstream.NewHeld(t, 5000, 500)
	sock := filepath.Join(t.TempDir(), "admin.sock")
	short := defaultOpsLimits
	short.read, short.write = 200*time.Millisecond, 200*time.Millisecond
	h := startDaemonWith(t, fmt.Sprintf("admin_addr = %q", "unix:"+sock), "", "", httpSource("api", api.URL),
		Options{opsLimits: &short, tapKeepalive: 50 * time.Millisecond})
	c := adminTapClient(h, "")
	reader, stalled := c.open(t, ""), c.open(t, "")
	began := time.Now()
	for reader.keepalives < 10 || time.Since(began) < 3*short.write {
		if typ, line, err := reader.line(); err != nil || typ != "" {
			t.Fatalf("waiting for keepalives: %s %v", line, err)
		}
	}
	api.Release()
	if ev := reader.event(); ev.Key != testupstream.ID(1) {
		t.Errorf("first event %+v after the keepalives", ev)
	}
	testsync.WaitFor(t, "the stalled session's buffer full", 60*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_tap_dropped_events_total") > 0
	})
	last := make(chan string, 1)
	go func() {
		for {
			typ, line, err := reader.line()
			if err != nil || typ == adminapi.TapTypeEnd {
				last <- fmt.Sprintf("%s %v", line, err)
				return
			}
		}
	}()
	stopped := time.Now()
	if err := h.stop(); err != nil {
		t.Errorf("stop with a stalled tap session: %v", err)
	}
	if d := time.Since(stopped); d > tapWriteTimeout/2 {
		t.Errorf("the stop took %v with a stalled tap session", d)
	}
	if l := <-last; !strings.Contains(l, `{"type":"end","reason":"the daemon is stopping"}`) {
		t.Errorf("the reading session's last line: %s; want the end line", l)
	}
	stalled.close()
}
