package delivery

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// cacheRig is a Sender and an AckReceiver on a real queue and raw store
// (whose reads it counts), with a processor's sockets: pull takes frames,
// push sends acks.
type cacheRig struct {
	s    *Sender
	q    *queue.Queue
	raw  *countingStore
	reg  *prometheus.Registry
	pull *zmq.Socket
	push *zmq.Socket
	seq  int
}

func newCacheRig(t *testing.T, o SenderOptions) *cacheRig {
	t.Helper()
	dir := t.TempDir()
	q, err := queue.Open(queue.Options{Path: filepath.Join(dir, "q.db"), EventsPerFrame: 10})
	if err != nil {
		t.Fatal(err)
	}
	file, err := rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + filepath.Join(dir, "raw")})
	if err != nil {
		t.Fatal(err)
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	r := &cacheRig{q: q, raw: &countingStore{Store: file, pages: file.(rawstore.PageReader)}, reg: prometheus.NewRegistry()}
	m := NewMetrics(r.reg)
	o.Endpoint, o.HighWaterMark, o.Metrics = fmt.Sprintf("inproc://cache-%p", t), 100, m
	if r.s, err = NewSender(zctx, q, r.raw, o); err != nil {
		t.Fatal(err)
	}
	recv, err := NewAckReceiver(zctx, AckOptions{Endpoint: "inproc://acks-" + o.Endpoint[len("inproc://"):], HighWaterMark: 100,
		MaxMessageBytes: 1 << 20, Metrics: m}, q, r.s)
	if err != nil {
		t.Fatal(err)
	}
	r.pull, r.push = mustSocket(t, zctx, zmq.PULL), mustSocket(t, zctx, zmq.PUSH)
	for _, c := range []struct {
		sock     *zmq.Socket
		endpoint string
	}{{r.pull, o.Endpoint}, {r.push, "inproc://acks-" + o.Endpoint[len("inproc://"):]}} {
		if err := c.sock.Connect(c.endpoint); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.pull.SetRcvtimeo(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 2)
	go func() { done <- r.s.Run(ctx) }()
	go func() { done <- recv.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
		for _, s := range []*zmq.Socket{r.pull, r.push} {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}
		if err := zctx.Term(); err != nil {
			t.Error(err)
		}
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

func mustSocket(t *testing.T, zctx *zmq.Context, kind zmq.Type) *zmq.Socket {
	t.Helper()
	s, err := zctx.NewSocket(kind)
	if err == nil {
		err = s.SetLinger(0)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// commit queues a batch of n events as a source does: its raw object
// first, then the events with their payloads, then Submit. It returns the
// events' keys.
func (r *cacheRig) commit(t *testing.T, n int) []string {
	t.Helper()
	r.seq++
	rawKey := fmt.Sprintf("src/%d", r.seq)
	var body []byte
	var keys []string
	var evs []queue.NewEvent
	for i := range n {
		key := fmt.Sprintf("b%d-%d", r.seq, i)
		rec := fmt.Sprintf(`{"id":%q}`, key)
		evs = append(evs, queue.NewEvent{Key: key, RawOff: len(body), RawLen: len(rec)})
		body = append(body, rec...)
		keys = append(keys, key)
	}
	for i := range evs {
		evs[i].Payload = body[evs[i].RawOff : evs[i].RawOff+evs[i].RawLen]
	}
	if err := r.raw.Put(t.Context(), rawKey, body); err != nil {
		t.Fatal(err)
	}
	frames, err := r.q.Append(t.Context(), queue.Batch{Source: "src", RawKey: rawKey, FetchedAt: time.Now(), Events: evs})
	if err != nil {
		t.Fatal(err)
	}
	r.s.Submit(frames)
	return keys
}

// recv takes the next frame, checking every payload against its key.
func (r *cacheRig) recv(t *testing.T) *wire.Frame {
	t.Helper()
	msg, err := r.pull.RecvBytes(0)
	if err != nil {
		t.Fatalf("no frame: %v", err)
	}
	f, err := wire.DecodeFrame(msg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range f.Events {
		if want := fmt.Sprintf(`{"id":%q}`, e.Key); string(e.Payload) != want {
			t.Fatalf("frame %d event %s: payload %q, want %q", f.ID, e.Key, e.Payload, want)
		}
	}
	return f
}

func (r *cacheRig) ack(t *testing.T, msg string) {
	t.Helper()
	if _, err := r.push.SendBytes([]byte(msg), 0); err != nil {
		t.Fatal(err)
	}
}

func (r *cacheRig) reads() int64 { return r.raw.gets.Load() + r.raw.read.Load() }

// TestLaggingProcessorIsServedFromMemory has a processor that takes no
// frame while twenty batches are committed: the in-flight window (two
// frames) fills at once and the rest wait. Once it takes them, acking each,
// every frame it gets comes from memory: nothing is read back from the raw
// store (nor the queue's event rows) for frames committed a moment ago.
func TestLaggingProcessorIsServedFromMemory(t *testing.T) {
	r := newCacheRig(t, SenderOptions{MaxInflight: 2, AckTimeout: time.Minute, CacheBytes: 1 << 20})
	var want []string
	for range 20 {
		want = append(want, r.commit(t, 10)...)
	}
	var got []string
	for len(got) < len(want) {
		f := r.recv(t)
		for _, e := range f.Events {
			got = append(got, e.Key)
		}
		r.ack(t, fmt.Sprintf(`{"v":1,"type":"ack","frames":[%d]}`, f.ID))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("got %d events, want each of %d once", len(got), len(want))
	}
	if n := r.reads(); n != 0 || r.counter(t, "ingestor_publish_frames_read_back_total") != 0 {
		t.Errorf("%d raw store reads for frames committed a moment ago, want none (sent from memory)", n)
	}
	testsync.WaitFor(t, "the cache to be empty once every frame is acked", 10*time.Second, func() bool {
		b, n := r.s.cache.size()
		return b == 0 && n == 0
	})
}

// TestPartlySettledFrameIsReadBack acks one event of a cached frame by key
// and nacks another permanently: when the frame is resent, its copy in
// memory (all three events) must not be: it is read back with the one
// event still pending.
func TestPartlySettledFrameIsReadBack(t *testing.T) {
	r := newCacheRig(t, SenderOptions{MaxInflight: 8, AckTimeout: 200 * time.Millisecond, CacheBytes: 1 << 20})
	keys := r.commit(t, 3)
	f := r.recv(t)
	r.ack(t, fmt.Sprintf(`{"v":1,"type":"ack","keys":[{"frame":%d,"source":"src","key":%q}],"nacks":[{"frame":%d,"source":"src","key":%q,"reason":"bad","permanent":true}]}`,
		f.ID, keys[0], f.ID, keys[1]))
	for {
		again := r.recv(t)
		if again.ID != f.ID {
			t.Fatalf("frame %d, want %d again", again.ID, f.ID)
		}
		if len(again.Events) == 3 && again.Delivery == 2 {
			// Resent before the ack was applied: it may be; wait for the next.
			continue
		}
		if len(again.Events) != 1 || again.Events[0].Key != keys[2] {
			t.Fatalf("resent frame holds %d events (first %s), want only %s", len(again.Events), again.Events[0].Key, keys[2])
		}
		break
	}
	if n := r.reads(); n == 0 {
		t.Error("the partly settled frame was resent without being read back")
	}
}

// TestFrameCacheStaysWithinItsBound commits more than the cache holds
// while the processor lags: frames beyond the bound are read back, every
// event arrives once, the cache never holds more than its bound, and it is
// empty once everything is acked.
func TestFrameCacheStaysWithinItsBound(t *testing.T) {
	const limit = 4 * 10 * (cachedEventBytes + 40) // about four frames of ten events
	r := newCacheRig(t, SenderOptions{MaxInflight: 2, AckTimeout: time.Minute, CacheBytes: limit})
	within := func() {
		t.Helper()
		if b, _ := r.s.cache.size(); b > limit || b < 0 {
			t.Fatalf("cache holds %d bytes, bound %d", b, limit)
		}
	}
	want := map[string]bool{}
	for range 20 {
		for _, k := range r.commit(t, 10) {
			want[k] = true
		}
		within()
	}
	for len(want) > 0 {
		f := r.recv(t)
		within()
		for _, e := range f.Events {
			if !want[e.Key] {
				t.Fatalf("event %s delivered twice or unknown", e.Key)
			}
			delete(want, e.Key)
		}
		r.ack(t, fmt.Sprintf(`{"v":1,"type":"ack","frames":[%d]}`, f.ID))
	}
	if r.reads() == 0 || r.counter(t, "ingestor_publish_frames_read_back_total") == 0 || r.counter(t, "ingestor_publish_frame_cache_full_total") == 0 {
		t.Errorf("reads %d, read-back %v, cache full %v: want frames beyond the bound read back",
			r.reads(), r.counter(t, "ingestor_publish_frames_read_back_total"), r.counter(t, "ingestor_publish_frame_cache_full_total"))
	}
	testsync.WaitFor(t, "the cache to be empty once every frame is acked", 10*time.Second, func() bool {
		b, n := r.s.cache.size()
		return b == 0 && n == 0
	})
}

func (r *cacheRig) counter(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
