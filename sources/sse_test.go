package sources

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// sseSpec returns a spec for feed with fast reconnects, changed by edit.
func sseSpec(url string, edit func(*SSESpec)) *SSESpec {
	s := newSSESpec()
	s.URL = url
	s.IDField, s.TimeField = "id", "ts"
	s.ReconnectMax = "20ms"
	if edit != nil {
		edit(s)
	}
	return s
}

// openSSE opens spec and closes the source when the test ends.
func openSSE(t *testing.T, spec *SSESpec, env Env) *sseSource {
	t.Helper()
	if env.Name == "" {
		env.Name = "sse"
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
	return src.(*sseSource)
}

// sseConsumer fetches as the SourceActor does, passing back the cursor of
// the last batch, and checks every batch as it goes.
type sseConsumer struct {
	t    *testing.T
	src  *sseSource
	feed *testupstream.SSEFeed
	// byEventID expects keys that are the event ids (no id_field).
	byEventID bool
	cursor    string
	// seqs holds the seq of every record delivered, in order; -1 marks a
	// malformed event.
	seqs      []int
	malformed []*MalformedError
	// handedOut holds every cursor a batch carried, with when.
	handedOut []string
	at        []time.Time
}

// fetch fetches once, waiting at most a second, and records what came.
func (c *sseConsumer) fetch() {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	b, err := c.src.Fetch(ctx, c.cursor)
	cancel()
	if m, ok := AsMalformed(err); ok {
		c.malformed = append(c.malformed, m)
		c.seqs = append(c.seqs, -1)
		return
	}
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if len(b.Records) == 0 && b.Cursor == "" && (len(b.Body) != 0 || b.More) {
		t.Fatalf("empty batch with body %q, more %v", b.Body, b.More)
	}
	last := 0 // the seq of the last record
	for _, r := range b.Records {
		payload := b.Body[r.Off : r.Off+r.Len]
		seq, err := strconv.Atoi(scalarField(payload, "seq"))
		if err != nil || r.Cursor != strconv.Itoa(seq) || r.Time.IsZero() {
			t.Fatalf("record %+v (%s): seq, cursor or time wrong", r, payload)
		}
		if want := testupstream.SSEID(seq); c.byEventID {
			want = strconv.Itoa(seq)
			if r.Key != want {
				t.Fatalf("record %d: key %q, want the event id %q", seq, r.Key, want)
			}
		} else if r.Key != want {
			t.Fatalf("record %d: key %q, want %q", seq, r.Key, want)
		}
		if c.feed != nil && !bytes.Equal(payload, c.feed.Data(seq)) {
			t.Fatalf("record %d: payload %q, want the event's data %q", seq, payload, c.feed.Data(seq))
		}
		c.seqs = append(c.seqs, seq)
		last = seq
	}
	if len(b.Records) > 0 {
		if p, err := c.src.Parse(b.Body, b.FetchedAt); err != nil || !reflect.DeepEqual(p.Records, b.Records) {
			t.Fatalf("Parse does not match Fetch: %v\n%+v\n%+v", err, p, b)
		}
	}
	if b.Cursor != "" {
		// The last event may be one without records, after the last
		// record; events before it, of an earlier stream, may have larger
		// ids than a stream resumed behind them.
		if n, err := strconv.Atoi(b.Cursor); err != nil || n < last {
			t.Fatalf("cursor %q, want the id of the batch's last event, at least %d", b.Cursor, last)
		}
		c.cursor = b.Cursor
		c.handedOut = append(c.handedOut, b.Cursor)
		c.at = append(c.at, time.Now())
	}
}

// until fetches until every seq of want has been delivered.
func (c *sseConsumer) until(want []int) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !c.has(want) {
		if time.Now().After(deadline) {
			c.t.Fatalf("records %v not all delivered; got %v", want, c.seqs)
		}
		c.fetch()
	}
}

func (c *sseConsumer) has(want []int) bool {
	seen := map[int]bool{}
	for _, s := range c.seqs {
		seen[s] = true
	}
	for _, n := range want {
		if !seen[n] {
			return false
		}
	}
	return true
}

// seqRange returns from..to.
func seqRange(from, to int) []int {
	out := make([]int, 0, to-from+1)
	for n := from; n <= to; n++ {
		out = append(out, n)
	}
	return out
}

// TestSSEDeliversEveryEventAcrossDrops streams 300 events whose data
// spans several lines, with comments, CRLF line ends and duplicates after
// every resume, and drops the stream four times, every other time in the
// middle of an event. Every record arrives with its key, every reconnect
// sends a last event ID that was handed out (never the id of the event
// cut off), and a record comes again only because a later stream sent it
// again.
func TestSSEDeliversEveryEventAcrossDrops(t *testing.T) {
	const total = 300
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: total, MultiLine: true, Comments: true, LineEnd: "\r\n",
		DropAfter: 40, Drops: 4, MidEvent: 2, Resend: 2})
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.MaxBatch = 7 }), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	c.until(seqRange(1, total))

	hs := feed.Handshakes()
	if len(hs) < 5 {
		t.Fatalf("%d streams, want the 4 dropped ones and more", len(hs))
	}
	if hs[0].HasLastEventID {
		t.Errorf("the first request sent Last-Event-ID %q, want none", hs[0].LastEventID)
	}
	prev := 0
	for i, h := range hs[1:] {
		if !slices.Contains(c.handedOut, h.LastEventID) {
			t.Errorf("stream %d resumed from %q, which was never handed out (%v)", i+1, h.LastEventID, c.handedOut)
		}
		n, _ := strconv.Atoi(h.LastEventID)
		if n < prev {
			t.Errorf("stream %d resumed from %d, before %d", i+1, n, prev)
		}
		prev = n
	}
	// A record comes again only because a later stream sent it again.
	deliveries := map[int]int{}
	for _, s := range c.seqs {
		deliveries[s]++
	}
	for seq, n := range deliveries {
		sent := 0
		for _, h := range hs {
			if h.Status == http.StatusOK && h.From <= seq && seq < h.From+h.Sent {
				sent++
			}
		}
		if n > sent {
			t.Errorf("record %d delivered %d times, but only %d streams sent it", seq, n, sent)
		}
	}
}

// TestSSEReconnectSendsTheNewestIDHandedOut drops the stream while the
// buffer holds events not yet handed out: the reconnect asks for the
// events after the newest id handed out, not after the newest read.
func TestSSEReconnectSendsTheNewestIDHandedOut(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 50})
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.MaxBatch = 20 }), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	for c.cursor == "" {
		c.fetch()
	}
	handedOut := c.cursor
	feed.Drop()
	testsync.WaitFor(t, "the reconnect", 15*time.Second, func() bool { return len(feed.Handshakes()) == 2 })
	if got := feed.Handshakes()[1].LastEventID; got != handedOut {
		t.Fatalf("reconnected with Last-Event-ID %q, want the id handed out, %q", got, handedOut)
	}
	c.until(seqRange(1, 50))
}

// TestSSERestartResumesFromDurableCursor checks the first request of a
// source: initial_cursor before anything is durable, then the durable
// cursor, not initial_cursor and not an id handed out but never made
// durable.
func TestSSERestartResumesFromDurableCursor(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 40})
	spec := sseSpec(feed.URL, func(s *SSESpec) { s.MaxBatch, s.InitialCursor = 5, "10" })
	first := openSSE(t, spec, Env{})
	c := &sseConsumer{t: t, src: first, feed: feed}
	for len(c.handedOut) < 2 {
		c.fetch()
	}
	if h := feed.Handshakes()[0]; h.LastEventID != "10" || c.seqs[0] != 11 {
		t.Fatalf("first request with Last-Event-ID %q and first record %d, want initial_cursor 10 and 11", h.LastEventID, c.seqs[0])
	}
	durable := c.handedOut[0] // the second batch was never made durable
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := openSSE(t, spec, Env{})
	c2 := &sseConsumer{t: t, src: second, feed: feed, cursor: durable}
	from := sinceNumber(t, durable) + 1
	c2.until(seqRange(from, 40))
	hs := feed.Handshakes()
	if got := hs[len(hs)-1].LastEventID; got != durable {
		t.Fatalf("the restarted source sent Last-Event-ID %q, want the durable cursor %q", got, durable)
	}
	if c2.seqs[0] != from || slices.Min(c2.seqs) != from {
		t.Fatalf("the restarted source delivered %v, want %d first and nothing older", c2.seqs, from)
	}
}

// TestSSEEventTypesFilter keeps the records of the types listed: events
// of other types are not in the batches, but their ids move the cursor.
func TestSSEEventTypesFilter(t *testing.T) {
	const total = 50 // event 50 is a status event
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: total, EventType: "trade", OtherEvery: 5})
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.EventTypes = []string{"trade"}; s.MaxBatch = 3 }), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	var want []int
	for n := 1; n <= total; n++ {
		if n%5 != 0 {
			want = append(want, n)
		}
	}
	c.until(want)
	for c.cursor != "50" {
		c.fetch() // the last status event comes as a cursor alone
	}
	for _, s := range c.seqs {
		if s%5 == 0 {
			t.Fatalf("record %d of a filtered type was delivered", s)
		}
	}
	if len(c.seqs) != len(want) {
		t.Fatalf("delivered %v, want %v", c.seqs, want)
	}
}

// TestSSEKeysAreEventIDs checks that without id_field a record's key is
// its event's id.
func TestSSEKeysAreEventIDs(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 20})
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.IDField = "" }), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed, byEventID: true}
	c.until(seqRange(1, 20))
}

func TestSSEMalformedDataIsDeadLetteredAlone(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 20, MalformedAt: 8})
	src := openSSE(t, sseSpec(feed.URL, nil), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	c.until(seqRange(1, 20))
	want := append(append(seqRange(1, 7), -1), seqRange(8, 20)...)
	if !slices.Equal(c.seqs, want) {
		t.Fatalf("delivered %v, want %v", c.seqs, want)
	}
	m := c.malformed[0]
	if string(m.Body) != testupstream.SSEMalformed || m.FetchedAt.IsZero() || m.Refetch ||
		!strings.Contains(m.Reason, "not valid JSON") || !strings.Contains(m.Reason, `after id "7"`) {
		t.Fatalf("malformed error %+v", m)
	}
	if n := len(feed.Handshakes()); n != 1 {
		t.Fatalf("%d streams: malformed data must not break the stream", n)
	}
}

// TestSSEMalformedLastEventIsNotAskedAgain ends a stream with a malformed
// event: its id is handed out alone by the next fetch, so that it becomes
// durable, and a reconnect does not ask for the event again.
func TestSSEMalformedLastEventIsNotAskedAgain(t *testing.T) {
	var requests testsync.LockedBuffer // the Last-Event-ID of each request, a line each
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(&requests, "%q\n", r.Header.Get("Last-Event-ID"))
		w.Header().Set("Content-Type", "text/event-stream")
		if r.Header.Get("Last-Event-ID") == "" {
			fmt.Fprint(w, "id: 1\ndata: {\"seq\":1}\n\nid: 2\ndata: nope\n\n")
		}
		_ = http.NewResponseController(w).Flush() // a client gone is its own problem
		<-r.Context().Done()
	}))
	t.Cleanup(upstream.Close)
	src := openSSE(t, sseSpec(upstream.URL, func(s *SSESpec) { s.IDField = "" }), Env{})
	var got []string
	for len(got) < 3 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		b, err := src.Fetch(ctx, "")
		cancel()
		switch m, ok := AsMalformed(err); {
		case ok:
			got = append(got, "malformed "+string(m.Body))
		case err != nil:
			t.Fatal(err)
		case b.Cursor != "":
			got = append(got, fmt.Sprintf("%d records %s, cursor %s", len(b.Records), b.Body, b.Cursor))
		}
	}
	want := []string{`1 records [{"id":"1","event":"message","data":{"seq":1}}], cursor 1`, "malformed nope", "0 records [], cursor 2"}
	if !slices.Equal(got, want) {
		t.Fatalf("fetches %q, want %q", got, want)
	}
	upstream.CloseClientConnections()
	testsync.WaitFor(t, "the reconnect", 10*time.Second, func() bool { return strings.Count(requests.String(), "\n") == 2 })
	if lines := strings.Split(strings.TrimSpace(requests.String()), "\n"); lines[1] != `"2"` {
		t.Fatalf("requests with Last-Event-ID %v, want \"\" then \"2\"", lines)
	}
}

func TestSSEOversizedEventIsSkipped(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 3, BodySize: 2000})
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.MaxEventBytes = 1000 }), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	for len(c.malformed) < 3 {
		c.fetch()
	}
	for i, m := range c.malformed {
		if len(m.Body) != 1000 || !bytes.HasPrefix(feed.Data(i+1), m.Body) || !strings.Contains(m.Reason, "max_event_bytes") {
			t.Fatalf("malformed error: %d bytes, %s", len(m.Body), m.Reason)
		}
	}
	for c.cursor != "3" {
		c.fetch() // the last skipped event's id
	}
	if n := len(feed.Handshakes()); n != 1 {
		t.Fatalf("%d streams: an oversized event must not break the stream", n)
	}
}

func TestSSEBufferIsBounded(t *testing.T) {
	const total = 100_000
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: total, BodySize: 1000})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const maxBatch = 10
	const limit = 4 * maxBatch // the documented buffer
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.MaxBatch = maxBatch }), Env{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := src.Fetch(ctx, ""); err != nil { // starts the reader
		t.Fatal(err)
	}
	testsync.WaitFor(t, "a full buffer", 15*time.Second, func() bool { return len(src.buf) >= limit })
	// The upstream stalls once the socket buffers are full too: wait until
	// it has sent nothing for half a second.
	last, since := -1, time.Now()
	testsync.WaitFor(t, "the upstream to stall (nothing sent for half a second)", 30*time.Second, func() bool {
		if n := len(src.buf); n > limit {
			t.Fatalf("%d events buffered, over 4 * max_batch (%d)", n, limit)
		}
		if sent := feed.Sent(); sent != last {
			last, since = sent, time.Now()
		}
		return time.Since(since) >= 500*time.Millisecond
	})
	sent := feed.Sent()
	if sent >= total/4 {
		t.Fatalf("the upstream sent %d of %d events with nobody fetching: no backpressure", sent, total)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 32<<20 {
		t.Fatalf("heap grew by %d bytes while flooded", grown)
	}
	t.Logf("stalled after %d events sent, %d buffered", sent, len(src.buf))
	c := &sseConsumer{t: t, src: src, feed: feed}
	c.until(seqRange(1, sent+100))
}
