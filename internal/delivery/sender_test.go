package delivery

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/ingest/ingesttest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/wire"
)

func TestAckWaitBacksOffWithinCeiling(t *testing.T) {
	timeout := 100 * time.Millisecond
	s := &Sender{o: SenderOptions{AckTimeout: timeout}}
	if got := s.ackWait(1); got != timeout {
		t.Fatalf("first delivery waits %v, want the ack timeout %v", got, timeout)
	}
	for delivery := 2; delivery <= 8; delivery++ {
		ceiling := min(timeout<<(delivery-1), 10*timeout)
		var longest time.Duration
		for range 500 {
			w := s.ackWait(delivery)
			if w < timeout || w > ceiling {
				t.Fatalf("delivery %d waits %v, outside [%v, %v]", delivery, w, timeout, ceiling)
			}
			longest = max(longest, w)
		}
		// Full jitter reaches well into the upper half of the range.
		if longest < timeout+(ceiling-timeout)/2 {
			t.Errorf("delivery %d: longest of 500 waits %v, want above the middle of [%v, %v]", delivery, longest, timeout, ceiling)
		}
	}
}

// TestMissingRawObjectIsDeadLettered queues a frame whose raw object was
// never stored before a good one: the backlog scan dead-letters the first
// frame's events and goes on to deliver the second.
func TestMissingRawObjectIsDeadLettered(t *testing.T) {
	ctx := t.Context()
	q, raw := openStores(t)
	body := []byte(`[{"id":"g0"},{"id":"g1"}]`)
	if err := raw.Put(ctx, "src/good", body); err != nil {
		t.Fatal(err)
	}
	for _, b := range []queue.Batch{
		{Source: "src", RawKey: "src/gone", FetchedAt: time.Now(), Events: []queue.NewEvent{{Key: "m0", RawLen: 2}, {Key: "m1", RawOff: 2, RawLen: 2}}},
		{Source: "src", RawKey: "src/good", FetchedAt: time.Now(), Events: []queue.NewEvent{{Key: "g0", RawOff: 1, RawLen: 11}, {Key: "g1", RawOff: 13, RawLen: 11}}},
	} {
		if _, err := q.Append(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	_, pull := startSender(t, q, raw)

	msg, err := pull.RecvBytes(0)
	if err != nil {
		t.Fatalf("no frame delivered: %v", err)
	}
	if !strings.Contains(string(msg), `"key":"g0"`) || strings.Contains(string(msg), `"key":"m0"`) {
		t.Fatalf("first frame delivered = %s, want the good frame only", msg)
	}
	dl, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dl) != 2 {
		t.Fatalf("dead letters = %+v %v, want m0 and m1", dl, err)
	}
	for _, d := range dl {
		if d.Reason != "raw object missing: src/gone" {
			t.Errorf("dead letter %s reason %q", d.Key, d.Reason)
		}
	}
	if q.PendingEvents() != 2 || q.PendingFrames() != 1 {
		t.Errorf("pending = %d events %d frames, want the good frame's 2 and 1", q.PendingEvents(), q.PendingFrames())
	}
}

// TestChangedRawObjectStillMakesValidFrames queues events whose raw object
// no longer holds JSON at their ranges (changed behind the daemon's back):
// ASCII that is not JSON, and bytes that are not UTF-8. The backlog frame
// is still valid UTF-8 JSON: both travel as payload_b64 with those bytes,
// and the JSON event next to them as payload.
func TestChangedRawObjectStillMakesValidFrames(t *testing.T) {
	ctx := t.Context()
	q, raw := openStores(t)
	body := []byte("not json|hello\xffwor\n|{\"ok\":1}")
	if err := raw.Put(ctx, "src/changed", body); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Append(ctx, queue.Batch{Source: "src", RawKey: "src/changed", FetchedAt: time.Now(),
		Events: []queue.NewEvent{{Key: "ascii", RawLen: 8}, {Key: "binary", RawOff: 9, RawLen: 10}, {Key: "json", RawOff: 20, RawLen: 8}}}); err != nil {
		t.Fatal(err)
	}
	_, pull := startSender(t, q, raw)
	msg, err := pull.RecvBytes(0)
	if err != nil {
		t.Fatalf("no frame delivered: %v", err)
	}
	if !utf8.Valid(msg) || !json.Valid(msg) {
		t.Fatalf("frame is not valid UTF-8 JSON: %q", msg)
	}
	f, err := wire.DecodeFrame(msg)
	if err != nil || len(f.Events) != 3 {
		t.Fatalf("decode frame %q: %+v, %v", msg, f, err)
	}
	for i, want := range []struct{ payload, b64 string }{{b64: "not json"}, {b64: "hello\xffwor\n"}, {payload: `{"ok":1}`}} {
		if e := f.Events[i]; string(e.Payload) != want.payload || string(e.PayloadBase64) != want.b64 {
			t.Errorf("event %s: payload %q payload_b64 %q, want %q and %q", e.Key, e.Payload, e.PayloadBase64, want.payload, want.b64)
		}
	}
}

// TestSlowRawStoreDoesNotBlockAcks stalls the raw store (a file store whose
// Get waits for the test) while the Sender reads a backlog frame from it.
// Acks must keep being applied meanwhile: the frame in flight is cleared,
// and Acked, which the ack receiver calls for every burst, never waits for
// the stalled read. Once the store answers, the backlog frame is sent.
func TestSlowRawStoreDoesNotBlockAcks(t *testing.T) {
	ctx := t.Context()
	q, file := openStores(t)
	raw := &gatedStore{Store: file, release: make(chan struct{}), waiting: make(chan struct{}, 1)}
	t.Cleanup(raw.open)
	for _, key := range []string{"src/a", "src/b"} {
		if err := raw.Put(ctx, key, []byte(`[{"id":"x"}]`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Append(ctx, queue.Batch{Source: "src", RawKey: "src/a", FetchedAt: time.Now(),
		Events: []queue.NewEvent{{Key: "a", RawOff: 1, RawLen: 10}}}); err != nil {
		t.Fatal(err)
	}
	s, pull := startSender(t, q, raw)
	if msg, err := pull.RecvBytes(0); err != nil || !strings.Contains(string(msg), `"key":"a"`) {
		t.Fatalf("first frame = %s (%v), want the one holding a", msg, err)
	}

	raw.stall()
	frames, err := q.Append(ctx, queue.Batch{Source: "src", RawKey: "src/b", FetchedAt: time.Now(),
		Events: []queue.NewEvent{{Key: "b", RawOff: 1, RawLen: 10}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range frames {
		for j := range frames[i].Events {
			frames[i].Events[j].Payload = nil // read back from the raw store, as for a replay
		}
	}
	s.Submit(frames)
	select {
	case <-raw.waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the Sender never read the second frame's raw object")
	}

	cleared, err := q.Ack(ctx, []int64{1}, nil)
	if err != nil || len(cleared) != 1 {
		t.Fatalf("ack frame 1: cleared %v, %v", cleared, err)
	}
	// More bursts than the Sender buffers: each must be taken promptly.
	const bound = 5 * time.Second
	for i := range 2 * cap(s.acked) {
		actx, cancel := context.WithTimeout(ctx, bound)
		s.Acked(actx, cleared)
		blocked := actx.Err() != nil
		cancel()
		if blocked {
			t.Fatalf("Acked call %d waited %v while the raw store was stalled", i+1, bound)
		}
	}
	testsync.WaitFor(t, "the acked frame cleared from the window during the stall", 10*time.Second, func() bool { return s.Inflight() == 0 })

	raw.open()
	msg, err := pull.RecvBytes(0)
	if err != nil || !strings.Contains(string(msg), `"key":"b"`) {
		t.Fatalf("frame after the stall = %s (%v), want the one holding b", msg, err)
	}
}

// gatedStore is a raw store whose Get waits, once stall was called, until
// open is called or its context ends.
type gatedStore struct {
	rawstore.Store
	stalled atomic.Bool
	once    sync.Once
	release chan struct{}
	// waiting receives a value when a Get starts waiting.
	waiting chan struct{}
}

func (g *gatedStore) stall() { g.stalled.Store(true) }

func (g *gatedStore) open() { g.once.Do(func() { close(g.release) }) }

func (g *gatedStore) Get(ctx context.Context, key string) ([]byte, error) {
	if g.stalled.Load() {
		select {
		case g.waiting <- struct{}{}:
		default:
		}
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Store.Get(ctx, key)
}

// openStores opens a queue and a file raw store in a temp dir.
func openStores(t *testing.T) (*queue.Queue, rawstore.Store) {
	t.Helper()
	dir := t.TempDir()
	q, err := queue.Open(queue.Options{Path: filepath.Join(dir, "q.db"), EventsPerFrame: 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	})
	raw, err := rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + filepath.Join(dir, "raw")})
	if err != nil {
		t.Fatal(err)
	}
	return q, raw
}

// startSender runs a Sender on q and raw until the test ends, with a PULL
// socket connected to it that waits up to 10s for a frame.
func startSender(t *testing.T, q *queue.Queue, raw rawstore.Store) (*Sender, *zmq.Socket) {
	t.Helper()
	return startSenderAckTimeout(t, q, raw, time.Minute)
}

// startSenderAckTimeout is startSender with the sender's ack timeout.
func startSenderAckTimeout(t *testing.T, q *queue.Queue, raw rawstore.Store, ackTimeout time.Duration) (*Sender, *zmq.Socket) {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("inproc://sender-%d", time.Now().UnixNano())
	s, err := NewSender(zctx, q, raw, SenderOptions{Endpoint: endpoint, HighWaterMark: 100, AckTimeout: ackTimeout})
	if err != nil {
		t.Fatal(err)
	}
	pull, err := zctx.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	if err := pull.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := pull.SetRcvtimeo(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if err := pull.Close(); err != nil {
			t.Error(err)
		}
		if err := zctx.Term(); err != nil {
			t.Error(err)
		}
	})
	return s, pull
}

// TestFramePassedInFlightThenExpiredIsScannedAgain covers a frame the
// prefetcher found in flight whose ack wait ran out before the loop took
// that answer: the scan restarts from it, so it is sent again, while a
// frame acked meanwhile is just skipped.
func TestFramePassedInFlightThenExpiredIsScannedAgain(t *testing.T) {
	s := &Sender{o: SenderOptions{MaxInflight: 10}, inflight: map[int64]inflight{}, settled: map[int64]bool{},
		backlog: true, scanFrom: 4, epoch: 1, requested: true}
	s.clearAcked([]int64{6}) // acked while in flight, after the prefetcher passed it
	s.handle(prefetched{epoch: 1, id: 6, inFlight: true})
	if s.epoch != 1 || s.scanFrom != 6 {
		t.Fatalf("acked frame 6: epoch %d scanFrom %d, want the scan to go on past it (1, 6)", s.epoch, s.scanFrom)
	}
	s.handle(prefetched{epoch: 1, id: 7, inFlight: true}) // 7's ack wait ran out: not in flight, not acked
	if s.epoch != 2 || s.scanFrom != 6 || s.requested {
		t.Fatalf("expired frame 7: epoch %d scanFrom %d requested %v, want a new scan from 7 (2, 6, false)", s.epoch, s.scanFrom, s.requested)
	}
	s.handle(prefetched{epoch: 1, id: 8, inFlight: true})
	if s.scanFrom != 6 {
		t.Errorf("an answer of the old scan moved scanFrom to %d", s.scanFrom)
	}
}

// TestFetchToAckBucketsMeasureTheTargets checks that the latency histogram
// can tell a p99 on either side of the 50 ms target of `make bench` and of
// the 60 s threshold of IngestorAckLatencyHigh: with the old bounds
// (doubling from 1 ms to 32.8 s) a p99 above 60 s read as 32.8 s, so the
// alert could never fire.
func TestFetchToAckBucketsMeasureTheTargets(t *testing.T) {
	has := func(v float64) bool { return slices.Contains(FetchToAckBuckets, v) }
	if !has(0.05) || !has(0.06) || !has(60) {
		t.Errorf("buckets %v lack a bound at 50 ms, 60 ms or 60 s", FetchToAckBuckets)
	}
	if last := FetchToAckBuckets[len(FetchToAckBuckets)-1]; last <= 60 {
		t.Errorf("the highest bound is %v s: a p99 above the alert's 60 s would read as %v", last, last)
	}
	if !slices.IsSorted(FetchToAckBuckets) {
		t.Errorf("buckets %v are not sorted", FetchToAckBuckets)
	}
}

// TestBacklogFromPageSegmentReadsOnlyItsPages queues three pages of ten
// events appended to one page segment (as a polled source on the file
// store does), between two large pages nothing references. The sender
// reads each backlog frame's page once (to check it against its
// checksum), never the whole segment, and every payload sent is the bytes
// at its raw offset.
func TestBacklogFromPageSegmentReadsOnlyItsPages(t *testing.T) {
	ctx := t.Context()
	q, file := openStores(t)
	var segKey string
	var segSize, pagesSize int
	want := map[string]string{}
	unreferenced := func() {
		ref := ingesttest.WritePage(t, file, "src", time.Now(), bytes.Repeat([]byte(" "), 1<<20))
		segKey, segSize = ref.Key, ref.Off+1<<20
	}
	unreferenced()
	for p := range 3 {
		var recs []string
		for i := range 10 {
			recs = append(recs, fmt.Sprintf(`{"id":"p%d-%d"}`, p, i))
		}
		page := "[" + strings.Join(recs, ",") + "]" + strings.Repeat(" ", 64<<10)
		ref := ingesttest.WritePage(t, file, "src", time.Now(), []byte(page))
		key, off := ref.Key, ref.Off
		segKey, segSize, pagesSize = key, off+len(page), pagesSize+len(page)
		b := queue.Batch{Source: "src", RawKey: key, FetchedAt: time.Now()}
		at := 1
		for i, r := range recs {
			id := fmt.Sprintf("p%d-%d", p, i)
			b.Events = append(b.Events, queue.NewEvent{Key: id, RawOff: off + at, RawLen: len(r)})
			want[id] = r
			at += len(r) + 1
		}
		if _, err := q.Append(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	unreferenced()
	counted := &countingStore{Store: file, pages: file.(rawstore.PageReader)}
	_, pull := startSender(t, q, counted)
	for range 3 {
		msg, err := pull.RecvBytes(0)
		if err != nil {
			t.Fatalf("frame: %v", err)
		}
		f, err := wire.DecodeFrame(msg)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range f.Events {
			if string(e.Payload) != want[e.Key] {
				t.Errorf("event %s: payload %q, want %q", e.Key, e.Payload, want[e.Key])
			}
			delete(want, e.Key)
		}
	}
	if len(want) != 0 {
		t.Errorf("events never sent: %v", want)
	}
	gets, read := counted.gets.Load(), counted.read.Load()
	if gets != 0 || read != int64(pagesSize) {
		t.Errorf("%d whole-object reads and %d bytes read by page for 30 events in 3 pages of %d bytes in all, in a %d-byte segment %s; want only each page read once",
			gets, read, pagesSize, segSize, segKey)
	}
}

// TestBacklogReadsALargePageOnce sends from the backlog one page whose
// events fill more frames than one scan of the backlog takes (scanPage):
// the page is read from the raw store once, not once a scan, and so held
// once by the frames waiting to be sent.
func TestBacklogReadsALargePageOnce(t *testing.T) {
	ctx := t.Context()
	q, file := openStores(t)
	const events = (scanPage + 44) * 10 // 10 events a frame (openStores)
	var page bytes.Buffer
	b := queue.Batch{Source: "src", FetchedAt: time.Now()}
	page.WriteByte('[')
	for i := range events {
		if i > 0 {
			page.WriteByte(',')
		}
		r := fmt.Sprintf(`{"id":%d}`, i)
		b.Events = append(b.Events, queue.NewEvent{Key: strconv.Itoa(i), RawOff: page.Len(), RawLen: len(r)})
		page.WriteString(r)
	}
	page.WriteByte(']')
	ref := ingesttest.WritePage(t, file, "src", time.Now(), page.Bytes())
	b.RawKey = ref.Key
	for i := range b.Events {
		b.Events[i].RawOff += ref.Off
	}
	if _, err := q.Append(ctx, b); err != nil {
		t.Fatal(err)
	}
	counted := &countingStore{Store: file, pages: file.(rawstore.PageReader)}
	_, pull := startSender(t, q, counted)
	got := 0
	for got < events {
		msg, err := pull.RecvBytes(0)
		if err != nil {
			t.Fatalf("frame after %d events: %v", got, err)
		}
		f, err := wire.DecodeFrame(msg)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range f.Events {
			if want := `{"id":` + e.Key + `}`; string(e.Payload) != want {
				t.Fatalf("event %s: payload %q, want %q", e.Key, e.Payload, want)
			}
		}
		got += len(f.Events)
	}
	if read := counted.read.Load(); read != int64(page.Len()) {
		t.Errorf("%d bytes read by page for a page of %d bytes sent in %d frames, want the page read once", read, page.Len(), events/10)
	}
}

// countingStore counts the whole-object reads and the bytes read by page.
type countingStore struct {
	rawstore.Store
	pages rawstore.PageReader
	gets  atomic.Int64
	read  atomic.Int64
}

func (c *countingStore) Get(ctx context.Context, key string) ([]byte, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, key)
}

func (c *countingStore) FindPage(ctx context.Context, key string, off int, ix *rawstore.PageIndex) (rawstore.PageRef, error) {
	return c.pages.FindPage(ctx, key, off, ix)
}

func (c *countingStore) ReadPage(ctx context.Context, key string, ref rawstore.PageRef) ([]byte, error) {
	b, err := c.pages.ReadPage(ctx, key, ref)
	c.read.Add(int64(len(b)))
	return b, err
}

// TestDeliveringCoversSubmittedFrames is what a drain waits on: frames the
// last commit handed over count from the moment Submit returns, before the
// loop has sent them (TestShutdownDrains once found 100 events pending after
// a drain that waited for in-flight frames only, and the loop had not taken
// the last batch yet); sent frames count until acked; and frames no
// processor can take do not hold a drain up.
func TestDeliveringCoversSubmittedFrames(t *testing.T) {
	ctx := t.Context()
	q, raw := openStores(t)
	body := []byte(`[{"id":"a"}]`)
	if err := raw.Put(ctx, "src/a", body); err != nil {
		t.Fatal(err)
	}
	// A short ack timeout: a frame that ZeroMQ hands to the processor
	// closing below, before it notices the peer is gone (seen on a loaded
	// machine), is taken back after it instead of a minute later.
	s, pull := startSenderAckTimeout(t, q, raw, 2*time.Second)
	testsync.WaitFor(t, "the start-up scan of an empty queue", 10*time.Second, func() bool { return !s.Delivering() })
	frames, err := q.Append(ctx, queue.Batch{Source: "src", RawKey: "src/a", FetchedAt: time.Now(),
		Events: []queue.NewEvent{{Key: "a", RawOff: 1, RawLen: 10, Payload: body[1:11]}}})
	if err != nil || len(frames) != 1 {
		t.Fatalf("append: %v %v", frames, err)
	}
	s.Submit(frames)
	if !s.Delivering() {
		t.Fatal("Delivering is false right after Submit: a drain would stop before the frame is sent")
	}
	if _, err := pull.RecvBytes(0); err != nil {
		t.Fatalf("no frame delivered: %v", err)
	}
	if !s.Delivering() {
		t.Fatal("Delivering is false with the frame sent and unacked")
	}
	s.Acked(ctx, []int64{frames[0].ID})
	testsync.WaitFor(t, "Delivering false once the frame is acked", 10*time.Second, func() bool { return !s.Delivering() })

	// No processor connected: the frame cannot be sent, and nothing waits for it.
	if err := pull.Close(); err != nil {
		t.Fatal(err)
	}
	frames, err = q.Append(ctx, queue.Batch{Source: "src", RawKey: "src/a", FetchedAt: time.Now(),
		Events: []queue.NewEvent{{Key: "b", RawOff: 1, RawLen: 10, Payload: body[1:11]}}})
	if err != nil {
		t.Fatal(err)
	}
	s.Submit(frames)
	testsync.WaitFor(t, "Delivering false with no processor to take the frame", 10*time.Second, func() bool { return !s.Delivering() })
}
