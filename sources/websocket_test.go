package sources

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// wsSpec returns a spec for feed with fast reconnects, changed by edit.
func wsSpec(feed *testupstream.WSFeed, edit func(*WebSocketSpec)) *WebSocketSpec {
	s := newWebSocketSpec()
	s.URL = feed.URL
	s.Subscribe = `{"op":"subscribe","since":"{cursor}"}`
	s.IDField, s.CursorField, s.TimeField = "id", "seq", "ts"
	s.ReconnectMax = "20ms"
	if edit != nil {
		edit(s)
	}
	return s
}

// openWS opens spec and closes the source when the test ends.
func openWS(t *testing.T, spec *WebSocketSpec, env Env) *wsSource {
	t.Helper()
	if env.Name == "" {
		env.Name = "ws"
	}
	src, err := spec.Open(env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := src.Close(); err != nil {
			t.Error(err)
		}
	})
	return src.(*wsSource)
}

// wsFetch fetches once, waiting at most a second for messages.
func wsFetch(t *testing.T, src Source, cursor string) (*Batch, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	return src.Fetch(ctx, cursor)
}

// wsConsumer fetches as the SourceActor does: it passes back the cursor of
// the last batch and checks every batch as it goes.
type wsConsumer struct {
	t      *testing.T
	src    *wsSource
	cursor string
	// seqs holds the seq of every record delivered, in order; -1 marks a
	// malformed message.
	seqs      []int
	malformed []*MalformedError
	// handedOut holds every cursor a batch moved to.
	handedOut []string
}

// fetch fetches once and records what came.
func (c *wsConsumer) fetch() {
	t := c.t
	t.Helper()
	b, err := wsFetch(t, c.src, c.cursor)
	if m, ok := AsMalformed(err); ok {
		c.malformed = append(c.malformed, m)
		c.seqs = append(c.seqs, -1)
		return
	}
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if len(b.Records) == 0 && (len(b.Body) != 0 || b.Cursor != "" || b.More) {
		t.Fatalf("empty batch with body %q, cursor %q, more %v", b.Body, b.Cursor, b.More)
	}
	largest := 0
	for _, r := range b.Records {
		seq, err := strconv.Atoi(r.Cursor)
		if err != nil || r.Key != testupstream.WSID(seq) || r.Time.IsZero() {
			t.Fatalf("record %+v: key, cursor or time wrong", r)
		}
		if !bytes.HasPrefix(b.Body[r.Off:r.Off+r.Len], []byte(`{"id":"`+r.Key+`"`)) {
			t.Fatalf("record %s does not point at its bytes: %q", r.Key, b.Body[r.Off:r.Off+r.Len])
		}
		c.seqs = append(c.seqs, seq)
		largest = max(largest, seq)
	}
	if len(b.Records) > 0 {
		if p, err := c.src.Parse(b.Body, b.FetchedAt); err != nil || !reflect.DeepEqual(p.Records, b.Records) {
			t.Fatalf("Parse does not match Fetch: %v\n%+v\n%+v", err, p, b)
		}
	}
	if b.Cursor != "" {
		if c.cursor != "" && CompareCursor(b.Cursor, c.cursor) <= 0 {
			t.Fatalf("cursor went from %s to %s", c.cursor, b.Cursor)
		}
		if b.Cursor != strconv.Itoa(largest) {
			t.Fatalf("cursor %s, want the largest seq %d", b.Cursor, largest)
		}
		c.cursor = b.Cursor
		c.handedOut = append(c.handedOut, b.Cursor)
	}
}

// until fetches until every seq from..to has been delivered.
func (c *wsConsumer) until(from, to int) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !c.has(from, to) {
		if time.Now().After(deadline) {
			c.t.Fatalf("records %d..%d not all delivered; got %v", from, to, c.seqs)
		}
		c.fetch()
	}
}

func (c *wsConsumer) has(from, to int) bool {
	seen := map[int]bool{}
	for _, s := range c.seqs {
		seen[s] = true
	}
	for n := from; n <= to; n++ {
		if !seen[n] {
			return false
		}
	}
	return true
}

func sinceNumber(t *testing.T, since string) int {
	if since == "" {
		return 0
	}
	n, err := strconv.Atoi(since)
	if err != nil {
		t.Fatalf("since %q", since)
	}
	return n
}

// TestWebSocketCursorInURLAndHeader checks that every handshake carries the
// cursor in place of {cursor} in the url (URL-escaped) and in a header
// value: initial_cursor on the first, then the newest cursor handed out,
// and that the connect log line shows the URL as sent.
func TestWebSocketCursorInURLAndHeader(t *testing.T) {
	const total = 120
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: total, SinceInURL: true, DropAfter: 30, Drops: 2})
	var logs testsync.LockedBuffer
	src := openWS(t, wsSpec(feed, func(s *WebSocketSpec) {
		s.URL += "/v1/{cursor}/events?since={cursor}&token=s3cret"
		s.Subscribe = ""
		s.Headers = map[string]string{"X-Since": "after {cursor}"}
		s.InitialCursor = "10"
		s.MaxBatch = 9
	}), Env{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	c := &wsConsumer{t: t, src: src}
	c.until(11, total)
	if slices.Contains(c.seqs, 10) {
		t.Errorf("record 10 delivered, but initial_cursor is 10")
	}
	if refused := feed.Refused(); len(refused) > 0 {
		t.Fatalf("handshakes refused: since = %q", refused)
	}
	conns := feed.Connections()
	if len(conns) < 3 || conns[0].Since != "10" {
		t.Fatalf("connections %+v, want 3 or more, the first from initial_cursor 10", conns)
	}
	for i, conn := range conns {
		if got, want := conn.Header.Get("X-Since"), "after "+conn.Since; got != want {
			t.Errorf("connection %d: X-Since %q, want %q", i, got, want)
		}
		if i > 0 && !slices.Contains(c.handedOut, conn.Since) {
			t.Errorf("connection %d resumed from %q, which was never handed out (%v)", i, conn.Since, c.handedOut)
		}
		want := fmt.Sprintf("url=%q", fmt.Sprintf("%s/v1/%s/events?since=%s&token=REDACTED", feed.URL, conn.Since, conn.Since))
		if !strings.Contains(logs.String(), want) {
			t.Errorf("connection %d: no connect log line with %s:\n%s", i, want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "s3cret") {
		t.Errorf("a secret was logged:\n%s", logs.String())
	}
}

// TestFillURLCursor checks the escaping of a cursor put in a URL: as a
// path segment before the "?", as a query value after it.
func TestFillURLCursor(t *testing.T) {
	for _, tc := range []struct{ raw, cursor, want string }{
		{"ws://h/a", "x y", "ws://h/a"},
		{"ws://h/{cursor}?since={cursor}", "a b/c&d=e", "ws://h/a%20b%2Fc&d=e?since=a+b%2Fc%26d%3De"},
		{"https://h/p?since={cursor}&n=1", "", "https://h/p?since=&n=1"},
	} {
		if got := fillURLCursor(tc.raw, tc.cursor); got != tc.want {
			t.Errorf("fillURLCursor(%q, %q) = %q, want %q", tc.raw, tc.cursor, got, tc.want)
		}
	}
}

func TestWebSocketDeliversEveryRecordAcrossDrops(t *testing.T) {
	const total = 300
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: total, DropAfter: 40, Drops: 4})
	src := openWS(t, wsSpec(feed, func(s *WebSocketSpec) { s.MaxBatch = 7 }), Env{})
	c := &wsConsumer{t: t, src: src}
	c.until(1, total)

	conns := feed.Connections()
	if len(conns) < 5 {
		t.Fatalf("%d connections, want the 4 dropped ones and more", len(conns))
	}
	// Every resubscribe asks for a cursor that was handed out, and they
	// never go back.
	prev := 0
	for i, conn := range conns {
		if i > 0 && !slices.Contains(c.handedOut, conn.Since) && conn.Since != "" {
			t.Errorf("connection %d subscribed from %q, which was never handed out (%v)", i, conn.Since, c.handedOut)
		}
		if n := sinceNumber(t, conn.Since); n < prev {
			t.Errorf("connection %d subscribed from %d, before %d", i, n, prev)
		} else {
			prev = n
		}
	}
	// A record comes again only because a later connection asked for it
	// again: at most once per connection that asked for it.
	deliveries := map[int]int{}
	for _, s := range c.seqs {
		deliveries[s]++
	}
	for seq, n := range deliveries {
		asked := 0
		for _, conn := range conns {
			if sinceNumber(t, conn.Since) < seq {
				asked++
			}
		}
		if n > asked {
			t.Errorf("record %d delivered %d times, but only %d connections asked for it", seq, n, asked)
		}
	}
}

func TestWebSocketDropResubscribesFromHandedOutCursor(t *testing.T) {
	// The buffer (4 * max_batch) holds every record, so the reader is
	// never paused on it and sees the drop while nobody fetches.
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 50})
	src := openWS(t, wsSpec(feed, func(s *WebSocketSpec) { s.MaxBatch = 20 }), Env{})
	c := &wsConsumer{t: t, src: src}
	for c.cursor == "" {
		c.fetch()
	}
	handedOut := c.cursor
	feed.Drop()
	testsync.WaitFor(t, "the resubscribe", 15*time.Second, func() bool { return len(feed.Connections()) == 2 })
	if got := feed.Connections()[1].Since; got != handedOut {
		t.Fatalf("resubscribed from %q, want the cursor handed out, %q", got, handedOut)
	}
	c.until(1, 50)
}

func TestWebSocketRestartResumesFromDurableCursor(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 40})
	spec := wsSpec(feed, func(s *WebSocketSpec) { s.MaxBatch = 5 })
	first := openWS(t, spec, Env{})
	c := &wsConsumer{t: t, src: first}
	for len(c.handedOut) < 2 {
		c.fetch()
	}
	durable := c.handedOut[0] // the second batch was never made durable
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := openWS(t, spec, Env{})
	c2 := &wsConsumer{t: t, src: second, cursor: durable}
	from := sinceNumber(t, durable) + 1
	c2.until(from, 40)
	conns := feed.Connections()
	if got := conns[len(conns)-1].Since; got != durable {
		t.Fatalf("the restarted source subscribed from %q, want the durable cursor %q", got, durable)
	}
	if c2.seqs[0] != from || slices.Min(c2.seqs) != from {
		t.Fatalf("the restarted source delivered %v, want %d first and nothing older", c2.seqs, from)
	}
}

func TestWebSocketMalformedMessageIsDeadLetteredAlone(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 20, MalformedAt: 8})
	src := openWS(t, wsSpec(feed, nil), Env{})
	c := &wsConsumer{t: t, src: src}
	c.until(1, 20)
	want := []int{1, 2, 3, 4, 5, 6, 7, -1, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	if !slices.Equal(c.seqs, want) {
		t.Fatalf("delivered %v, want %v", c.seqs, want)
	}
	m := c.malformed[0]
	if string(m.Body) != testupstream.WSMalformed || m.FetchedAt.IsZero() || !strings.Contains(m.Reason, "not valid JSON") {
		t.Fatalf("malformed error %+v", m)
	}
	if n := len(feed.Connections()); n != 1 {
		t.Fatalf("%d connections: a malformed message must not break the connection", n)
	}
}

func TestWebSocketOversizedMessageIsSkipped(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 3, BodySize: 2000})
	src := openWS(t, wsSpec(feed, func(s *WebSocketSpec) { s.MaxMessageBytes = 1000 }), Env{})
	c := &wsConsumer{t: t, src: src}
	for len(c.malformed) < 3 {
		c.fetch()
	}
	for _, m := range c.malformed {
		if len(m.Body) != 1000 || !strings.Contains(m.Reason, "max_message_bytes") {
			t.Fatalf("malformed error: %d bytes, %s", len(m.Body), m.Reason)
		}
	}
	if n := len(feed.Connections()); n != 1 {
		t.Fatalf("%d connections: an oversized message must not break the connection", n)
	}
}

func TestWebSocketDeadConnectionIsReconnected(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 3, NoPong: true})
	src := openWS(t, wsSpec(feed, func(s *WebSocketSpec) {
		s.PingInterval, s.ReadTimeout = "100ms", "300ms"
	}), Env{})
	c := &wsConsumer{t: t, src: src}
	var lastAt time.Time
	for !c.has(1, 3) {
		b, err := wsFetch(t, src, c.cursor)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Records) > 0 {
			lastAt, c.cursor = b.FetchedAt, b.Cursor
			for _, r := range b.Records {
				c.seqs = append(c.seqs, sinceNumber(t, r.Cursor))
			}
		}
	}
	testsync.WaitFor(t, "the reconnect", 15*time.Second, func() bool { return len(feed.Connections()) == 2 })
	took := time.Since(lastAt)
	if took < 290*time.Millisecond || took > 2*time.Second {
		t.Fatalf("dead connection replaced %v after the last message, want about read_timeout (300ms)", took)
	}
	if feed.Pings() == 0 {
		t.Fatal("no ping was sent")
	}
	if got := feed.Connections()[1].Since; got != "3" {
		t.Fatalf("resubscribed from %q, want 3", got)
	}
}

func TestWebSocketPongsKeepQuietConnection(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 1})
	src := openWS(t, wsSpec(feed, func(s *WebSocketSpec) {
		s.PingInterval, s.ReadTimeout = "100ms", "500ms"
	}), Env{})
	c := &wsConsumer{t: t, src: src}
	c.until(1, 1)
	// Twelve pings take at least 1.2s, over twice read_timeout with no
	// message: only the pongs keep the connection.
	testsync.WaitFor(t, "twelve pings", 15*time.Second, func() bool { return feed.Pings() >= 12 })
	if n := len(feed.Connections()); n != 1 {
		t.Fatalf("%d connections: a quiet connection that answers pings was dropped", n)
	}
}

func TestWebSocketBufferIsBounded(t *testing.T) {
	const total = 100_000
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: total, BodySize: 1000})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const maxBatch = 10
	// limit is the most messages the source may hold while nobody fetches:
	// 4 * max_batch, the documented buffer.
	const limit = 4 * maxBatch
	src := openWS(t, wsSpec(feed, func(s *WebSocketSpec) { s.MaxBatch = maxBatch }), Env{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := src.Fetch(ctx, ""); err != nil { // starts the reader
		t.Fatal(err)
	}
	testsync.WaitFor(t, "a full buffer", 15*time.Second, func() bool { return len(src.buf) >= limit })
	// The upstream stalls once the socket buffers are full too: wait until
	// it has sent nothing for half a second.
	stalled := 0
	for last := -1; stalled < 10; time.Sleep(50 * time.Millisecond) {
		if sent := feed.Sent(); sent == last {
			stalled++
		} else {
			last, stalled = sent, 0
		}
		if n := len(src.buf); n > limit {
			t.Fatalf("%d messages buffered, over 4 * max_batch (%d)", n, limit)
		}
	}
	sent := feed.Sent()
	if sent >= total/4 {
		t.Fatalf("the upstream sent %d of %d messages with nobody fetching: no backpressure", sent, total)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 32<<20 {
		t.Fatalf("heap grew by %d bytes while flooded", grown)
	}
	t.Logf("stalled after %d messages sent, %d buffered", sent, len(src.buf))
	// Fetching releases the backpressure: records the upstream had not
	// sent yet arrive.
	c := &wsConsumer{t: t, src: src}
	c.until(1, sent+100)
}

// wsOutageError fetches from a source that cannot connect until Fetch
// reports the outage with the cause of the last failed attempt.
func wsOutageError(t *testing.T, src Source) error {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		b, err := wsFetch(t, src, "")
		switch {
		case err == nil && len(b.Records) > 0:
			t.Fatalf("records from a source that cannot connect: %+v", b)
		case err != nil && !strings.Contains(err.Error(), "still connecting"):
			return err
		}
	}
	t.Fatal("the outage was never reported with its cause")
	return nil
}

func TestWebSocketLongOutageIsAnError(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // nothing listens there now
	src := openWS(t, &WebSocketSpec{URL: "ws" + strings.TrimPrefix(dead.URL, "http"), MaxBatch: 10,
		PingInterval: "50ms", ReadTimeout: "200ms", MaxMessageBytes: 1 << 10, ReconnectMax: "20ms"}, Env{})

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if b, err := src.Fetch(ctx, ""); err != nil || len(b.Records) != 0 {
		t.Fatalf("a short outage: %+v, %v; want an empty batch and no error", b, err)
	}
	start := time.Now()
	err := wsOutageError(t, src)
	var perm *PermanentError
	if err == nil || errors.As(err, &perm) || !strings.Contains(err.Error(), "dial") {
		t.Fatalf("after read_timeout without a connection: %v, want a plain error naming the dial", err)
	}
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Fatalf("the outage was reported after %v, want about read_timeout", took)
	}

	refused := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "who are you", http.StatusUnauthorized)
	}))
	t.Cleanup(refused.Close)
	src = openWS(t, &WebSocketSpec{URL: "ws" + strings.TrimPrefix(refused.URL, "http"), MaxBatch: 10,
		PingInterval: "50ms", ReadTimeout: "200ms", MaxMessageBytes: 1 << 10, ReconnectMax: "20ms"}, Env{})
	if err := wsOutageError(t, src); !errors.As(err, &perm) || !strings.Contains(err.Error(), "401") {
		t.Fatalf("a refused handshake: %v, want a *PermanentError naming the status", err)
	}
}

func TestWebSocketSecretsStayOutOfTracesAndLogs(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 2})
	var logs bytes.Buffer
	var mu sync.Mutex
	var traces []TraceEvent
	env := Env{
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Trace: func(ev TraceEvent) {
			mu.Lock()
			defer mu.Unlock()
			traces = append(traces, ev)
		},
	}
	src := openWS(t, wsSpec(feed, func(s *WebSocketSpec) {
		s.URL += "/feed?token=s3cret"
		s.Headers = map[string]string{"Authorization": "Bearer s3cret"}
	}), env)
	c := &wsConsumer{t: t, src: src}
	c.until(1, 2)
	feed.Drop()
	testsync.WaitFor(t, "the reconnect", 15*time.Second, func() bool { return len(feed.Connections()) == 2 })
	if got := feed.Connections()[0].Header.Get("Authorization"); got != "Bearer s3cret" {
		t.Fatalf("Authorization %q", got)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(traces) < 3 { // connected, lost, connected
		t.Fatalf("traces %+v", traces)
	}
	for _, ev := range traces {
		// The URL is traced as sent, with the secret query value redacted.
		if ev.Method != "WS" || !strings.HasSuffix(ev.URL, "/feed?token=REDACTED") || strings.Contains(ev.URL+ev.Note, "s3cret") {
			t.Errorf("trace %+v", ev)
		}
	}
	if !strings.Contains(traces[0].Note, `subscribed from cursor ""`) {
		t.Errorf("first trace %+v", traces[0])
	}
	if strings.Contains(logs.String(), "s3cret") {
		t.Errorf("a secret was logged:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "/feed?token=REDACTED") {
		t.Errorf("the connect log line lacks the URL as sent, secrets redacted:\n%s", logs.String())
	}
}

func TestWebSocketTLSVerification(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 2, TLS: true})
	if !strings.HasPrefix(feed.URL, "wss://") {
		t.Fatalf("feed URL %s", feed.URL)
	}
	verified := openWS(t, wsSpec(feed, func(s *WebSocketSpec) { s.PingInterval, s.ReadTimeout = "50ms", "200ms" }), Env{})
	if err := wsOutageError(t, verified); !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("an unknown certificate: %v, want the dial error naming it", err)
	}

	var logs bytes.Buffer
	insecure := openWS(t, wsSpec(feed, func(s *WebSocketSpec) { s.TLSInsecureSkipVerify = true }),
		Env{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	c := &wsConsumer{t: t, src: insecure}
	c.until(1, 2)
	if err := insecure.Close(); err != nil { // and stops its logging
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n < 2 || !strings.Contains(logs.String(), "VERIFICATION IS DISABLED") {
		t.Fatalf("want a warning at Open and at connect, got:\n%s", logs.String())
	}
}

func TestWebSocketTLSCAFile(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 2, TLS: true})
	src := openWS(t, wsSpec(feed, func(s *WebSocketSpec) { s.TLSCAFile = writeCAFile(t, feed.Certificate()) }), Env{})
	c := &wsConsumer{t: t, src: src}
	c.until(1, 2)
}

func TestWebSocketRefusesAnOldTLSVersion(t *testing.T) {
	old := testupstream.NewWS(t, testupstream.WSOptions{Total: 2, TLS: true, TLSMaxVersion: tls.VersionTLS11})
	src := openWS(t, wsSpec(old, func(s *WebSocketSpec) {
		s.TLSCAFile = writeCAFile(t, old.Certificate())
		s.PingInterval, s.ReadTimeout = "50ms", "200ms"
	}), Env{})
	if err := wsOutageError(t, src); !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("a TLS 1.1 server: %v, want the dial error naming the protocol version", err)
	}
	if n := len(old.Connections()); n != 0 {
		t.Fatalf("%d connections subscribed to a TLS 1.1 server", n)
	}
}
