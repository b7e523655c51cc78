package processor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/wire"
	"github.com/ingestorhq/ingestor/processor"
)

// waitTimeout bounds every wait for a condition; conditions normally hold
// within milliseconds.
const waitTimeout = 10 * time.Second

// fakeDaemon plays the daemon's side of the protocol on real ZeroMQ
// sockets bound to free loopback ports. Its sockets are used only by the
// test goroutine.
type fakeDaemon struct {
	push, pull            *zmq.Socket
	pullPoller            *zmq.Poller
	endpoint, ackEndpoint string
	enc                   wire.Encoder
}

func newFakeDaemon(t *testing.T) *fakeDaemon {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatalf("new ZeroMQ context: %v", err)
	}
	d := &fakeDaemon{}
	t.Cleanup(func() {
		for _, s := range []*zmq.Socket{d.push, d.pull} {
			if s != nil {
				if err := s.Close(); err != nil {
					t.Errorf("close daemon socket: %v", err)
				}
			}
		}
		if err := zctx.Term(); err != nil {
			t.Errorf("terminate daemon context: %v", err)
		}
	})
	bind := func(typ zmq.Type) (*zmq.Socket, string) {
		s, err := zctx.NewSocket(typ)
		if err != nil {
			t.Fatalf("new %v socket: %v", typ, err)
		}
		if err := s.SetLinger(0); err != nil {
			t.Fatalf("set linger: %v", err)
		}
		// A send waits for a processor to connect, but never forever.
		if err := s.SetSndtimeo(waitTimeout); err != nil {
			t.Fatalf("set send timeout: %v", err)
		}
		if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
			t.Fatalf("bind %v socket: %v", typ, err)
		}
		ep, err := s.GetLastEndpoint()
		if err != nil {
			t.Fatalf("last endpoint: %v", err)
		}
		return s, ep
	}
	d.push, d.endpoint = bind(zmq.PUSH)
	d.pull, d.ackEndpoint = bind(zmq.PULL)
	d.pullPoller = zmq.NewPoller()
	d.pullPoller.Add(d.pull, zmq.POLLIN)
	return d
}

// event returns an event of source with key.
func event(source, key string, seq int64) wire.Event {
	return wire.Event{
		Key: key, Source: source, Seq: seq,
		FetchedAt: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC),
		Raw:       wire.RawRef{Key: source + "/2024/05/01/raw-1.json", Off: int(seq) * 20, Len: 20},
	}
}

// sendFrame sends frame id holding evs, each with a small JSON payload.
func (d *fakeDaemon) sendFrame(t *testing.T, id int64, delivery int, evs ...wire.Event) {
	t.Helper()
	d.enc.Begin(id, delivery, "file://./data/raw")
	for i := range evs {
		d.enc.Add(&evs[i], fmt.Appendf(nil, `{"key":%q}`, evs[i].Key), true)
	}
	d.send(t, d.enc.End())
}

// send sends one message made of parts.
func (d *fakeDaemon) send(t *testing.T, parts ...[]byte) {
	t.Helper()
	for i, p := range parts {
		flags := zmq.Flag(0)
		if i < len(parts)-1 {
			flags = zmq.SNDMORE
		}
		if _, err := d.push.SendBytes(p, flags); err != nil {
			t.Fatalf("daemon send: %v", err)
		}
	}
}

// acksUntil receives acks until done holds for all received so far.
func (d *fakeDaemon) acksUntil(t *testing.T, what string, done func([]wire.Ack) bool) []wire.Ack {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	var acks []wire.Ack
	for !done(acks) {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("timed out waiting for %s; acks received: %+v", what, acks)
		}
		polled, err := d.pullPoller.Poll(min(left, 100*time.Millisecond))
		if err != nil {
			t.Fatalf("daemon poll: %v", err)
		}
		if len(polled) == 0 {
			continue
		}
		data, err := d.pull.RecvBytes(0)
		if err != nil {
			t.Fatalf("daemon receive: %v", err)
		}
		a, err := wire.DecodeAck(data)
		if err != nil {
			t.Fatalf("processor sent an invalid ack %q: %v", data, err)
		}
		acks = append(acks, *a)
	}
	return acks
}

// framesAcked returns how often each frame was acked whole.
func framesAcked(acks []wire.Ack) map[int64]int {
	n := make(map[int64]int)
	for _, a := range acks {
		for _, id := range a.Frames {
			n[id]++
		}
	}
	return n
}

func keysAcked(acks []wire.Ack) []wire.KeyAck {
	var keys []wire.KeyAck
	for _, a := range acks {
		keys = append(keys, a.Keys...)
	}
	return keys
}

// startProcessor runs a Client against d until the returned stop is called
// or the test ends; stop cancels Run and returns its result.
func startProcessor(t *testing.T, d *fakeDaemon, o processor.Options, h processor.Handler) (*processor.Client, func() error) {
	t.Helper()
	o.Endpoint, o.AckEndpoint = d.endpoint, d.ackEndpoint
	o.Logger = testLogger(t)
	c, err := processor.New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	stop := sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(waitTimeout):
			return errors.New("Run did not return after cancellation")
		}
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return c, stop
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func waitStats(t *testing.T, c *processor.Client, want processor.Stats) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		got := c.Stats()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats() = %+v, want %+v", got, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDeliversEveryEventAndAcksFramesInBatches(t *testing.T) {
	d := newFakeDaemon(t)
	// The handler holds the first event until every frame is sent, so the
	// rest queue up and their acks must be batched.
	gate := make(chan struct{})
	held := false
	var mu sync.Mutex
	var got []string
	c, _ := startProcessor(t, d, processor.Options{AckFlushInterval: time.Hour}, func(ctx context.Context, ev *processor.Event) error {
		if !held {
			held = true
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s/%s/%d/%s", ev.Source, ev.Key, ev.Seq, ev.Data()))
		return nil
	})

	const frames, perFrame = 600, 2
	var want []string
	seq := int64(0)
	for f := int64(1); f <= frames; f++ {
		var evs []wire.Event
		for range perFrame {
			seq++
			source := []string{"github", "hn"}[seq%2]
			key := fmt.Sprintf("k%d", seq)
			evs = append(evs, event(source, key, seq))
			want = append(want, fmt.Sprintf(`%s/%s/%d/{"key":%q}`, source, key, seq, key))
		}
		d.sendFrame(t, f, 1, evs...)
	}
	close(gate)

	acks := d.acksUntil(t, "every frame to be acked", func(acks []wire.Ack) bool {
		return len(framesAcked(acks)) == frames
	})
	for id, n := range framesAcked(acks) {
		if id < 1 || id > frames || n != 1 {
			t.Errorf("frame %d acked %d times, want frames 1..%d acked once", id, n, frames)
		}
	}
	if keys := keysAcked(acks); len(keys) != 0 {
		t.Errorf("got key acks %+v, want whole frames only", keys)
	}
	if len(acks) >= frames {
		t.Errorf("got %d ack messages for %d frames, want them batched", len(acks), frames)
	}
	for i, a := range acks {
		if len(a.Frames) > 256 {
			t.Errorf("ack %d holds %d frames, want at most 256", i, len(a.Frames))
		}
	}
	t.Logf("%d frames acked in %d messages", frames, len(acks))

	mu.Lock()
	if !slices.Equal(got, want) {
		t.Errorf("handler saw %d events, want %d in order; first difference near %d", len(got), len(want), firstDiff(got, want))
	}
	mu.Unlock()
	waitStats(t, c, processor.Stats{Frames: frames, Events: frames * perFrame, Acked: frames * perFrame})
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestFailedEventsStayUnackedAndOthersAreAckedByKey(t *testing.T) {
	d := newFakeDaemon(t)
	var mu sync.Mutex
	attempts := make(map[string]int)
	c, _ := startProcessor(t, d, processor.Options{}, func(ctx context.Context, ev *processor.Event) error {
		mu.Lock()
		attempts[ev.Key]++
		first := attempts[ev.Key] == 1
		mu.Unlock()
		switch {
		case ev.Key == "k2" && first:
			return errors.New("database unavailable")
		case ev.Key == "k3" && first:
			panic("nil map")
		}
		return nil
	})

	d.sendFrame(t, 1, 1, event("a", "k1", 1), event("a", "k2", 2), event("b", "k3", 3), event("b", "k4", 4))
	d.sendFrame(t, 2, 1, event("a", "k5", 5))
	acks := d.acksUntil(t, "frame 2 to be acked", func(acks []wire.Ack) bool { return framesAcked(acks)[2] > 0 })
	if n := framesAcked(acks)[1]; n != 0 {
		t.Errorf("frame 1 was acked whole although two of its events failed")
	}
	wantKeys := []wire.KeyAck{{Frame: 1, Source: "a", Key: "k1"}, {Frame: 1, Source: "b", Key: "k4"}}
	if got := keysAcked(acks); !reflect.DeepEqual(got, wantKeys) {
		t.Errorf("key acks = %+v, want %+v", got, wantKeys)
	}
	waitStats(t, c, processor.Stats{Frames: 2, Events: 5, Acked: 3, Failed: 2})

	// The daemon resends frame 1 holding only its unacked events; now they
	// succeed and the frame is acked whole.
	d.sendFrame(t, 1, 2, event("a", "k2", 2), event("b", "k3", 3))
	acks = d.acksUntil(t, "the resent frame 1 to be acked", func(acks []wire.Ack) bool { return framesAcked(acks)[1] > 0 })
	if keys := keysAcked(acks); len(keys) != 0 {
		t.Errorf("key acks %+v for a frame whose events all succeeded", keys)
	}
	waitStats(t, c, processor.Stats{Frames: 3, Events: 7, Acked: 5, Failed: 2, Redeliveries: 1})
}

func TestMalformedMessagesAreDroppedAndCounted(t *testing.T) {
	d := newFakeDaemon(t)
	var mu sync.Mutex
	var keys []string
	c, _ := startProcessor(t, d, processor.Options{}, func(ctx context.Context, ev *processor.Event) error {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, ev.Key)
		return nil
	})
	for _, msg := range [][][]byte{
		{[]byte("garbage")},
		{nil},
		{[]byte(`{"v":1,"type":"events","frame":3,"events":[{"key":`)},
		{[]byte(`{"v":2,"type":"events","frame":4,"delivery":1,"events":[]}`)},
		{[]byte(`{"v":1,"type":"ack","frames":[5]}`)},
		{[]byte(`{"v":1,"type":"events","frame":6,`), []byte(`"delivery":1,"events":[]}`)},
	} {
		d.send(t, msg...)
	}
	d.sendFrame(t, 7, 1, event("a", "good", 1))

	acks := d.acksUntil(t, "frame 7 to be acked", func(acks []wire.Ack) bool { return framesAcked(acks)[7] > 0 })
	if got := framesAcked(acks); len(got) != 1 || len(keysAcked(acks)) != 0 {
		t.Errorf("acks = %+v, want frame 7 alone", acks)
	}
	mu.Lock()
	if !slices.Equal(keys, []string{"good"}) {
		t.Errorf("handler saw %q, want [good]", keys)
	}
	mu.Unlock()
	waitStats(t, c, processor.Stats{Frames: 1, Events: 1, Acked: 1, Malformed: 6})
}

func TestCancellationSendsPendingAcks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []string
		cancel string // the key whose handling cancels Run
		// interrupted makes the handler return the context's error after
		// cancelling, as a handler whose work was cut short does.
		interrupted bool
		want        wire.Ack
	}{
		{
			name:   "whole frame",
			events: []string{"k1", "k2"},
			cancel: "k2",
			want:   wire.Ack{V: 1, Type: "ack", Frames: []int64{1}},
		},
		{
			name:   "cancelled mid-frame",
			events: []string{"k1", "k2", "k3"},
			cancel: "k2",
			want:   wire.Ack{V: 1, Type: "ack", Keys: []wire.KeyAck{{Frame: 1, Source: "s", Key: "k1"}, {Frame: 1, Source: "s", Key: "k2"}}},
		},
		{
			name:        "handler interrupted",
			events:      []string{"k1", "k2", "k3"},
			cancel:      "k2",
			interrupted: true,
			want:        wire.Ack{V: 1, Type: "ack", Keys: []wire.KeyAck{{Frame: 1, Source: "s", Key: "k1"}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newFakeDaemon(t)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var handled []string // used by the Run goroutine until it returns
			done := make(chan error, 1)
			go func() {
				// An hour-long flush interval leaves the acks to the stop.
				done <- processor.Run(ctx, processor.Options{
					Endpoint: d.endpoint, AckEndpoint: d.ackEndpoint,
					Logger: testLogger(t), AckFlushInterval: time.Hour,
				}, func(ctx context.Context, ev *processor.Event) error {
					handled = append(handled, ev.Key)
					if ev.Key == tc.cancel {
						cancel()
						if tc.interrupted {
							return fmt.Errorf("write %s: %w", ev.Key, ctx.Err())
						}
					}
					return nil
				})
			}()
			var evs []wire.Event
			for i, k := range tc.events {
				evs = append(evs, event("s", k, int64(i+1)))
			}
			d.sendFrame(t, 1, 1, evs...)

			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run = %v, want nil after cancellation", err)
				}
			case <-time.After(waitTimeout):
				t.Fatal("Run did not return after cancellation")
			}
			if want := []string{"k1", "k2"}; !slices.Equal(handled, want) {
				t.Errorf("handled %q, want %q", handled, want)
			}
			acks := d.acksUntil(t, "an ack", func(acks []wire.Ack) bool { return len(acks) > 0 })
			if !reflect.DeepEqual(acks[0], tc.want) {
				t.Errorf("ack = %+v, want %+v", acks[0], tc.want)
			}
		})
	}
}

func TestRunStopsPromptlyAndIsNotReentrant(t *testing.T) {
	d := newFakeDaemon(t)
	c, stop := startProcessor(t, d, processor.Options{}, func(context.Context, *processor.Event) error { return nil })
	d.sendFrame(t, 1, 1, event("s", "k", 1))
	d.acksUntil(t, "frame 1 to be acked", func(acks []wire.Ack) bool { return framesAcked(acks)[1] > 0 })

	if err := c.Run(t.Context(), func(context.Context, *processor.Event) error { return nil }); err == nil ||
		!strings.Contains(err.Error(), "already active") {
		t.Errorf("second concurrent Run = %v, want an already active error", err)
	}

	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// Run looks at its context at least every 100ms.
	if took := time.Since(start); took > time.Second {
		t.Errorf("Run took %v to return after cancellation", took)
	}
}

// curveKey is a valid Z85 CURVE key.
const curveKey = "GVUlV?l*1.p)>yIHv=mf>7wK%g*TjJ3uj)$}0L<f"

func TestNewChecksOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    processor.Options
		want []string
	}{
		{"empty", processor.Options{}, []string{"processor: endpoint is required", "ack endpoint is required"}},
		{"same endpoints", processor.Options{Endpoint: "tcp://127.0.0.1:5557", AckEndpoint: "tcp://127.0.0.1:5557"},
			[]string{`ack endpoint must differ from endpoint "tcp://127.0.0.1:5557"`}},
		{"negatives", processor.Options{Endpoint: "tcp://127.0.0.1:5557", AckEndpoint: "tcp://127.0.0.1:5558", ReceiveHWM: -1, AckFlushInterval: -time.Second},
			[]string{"receive HWM must not be negative, not -1", "ack flush interval must not be negative, not -1s"}},
		{"curve server key alone", processor.Options{Endpoint: "tcp://127.0.0.1:5557", AckEndpoint: "tcp://127.0.0.1:5558",
			CurveServerKey: curveKey}, []string{"curve secret key is required with a curve server key"}},
		{"curve secret key alone", processor.Options{Endpoint: "tcp://127.0.0.1:5557", AckEndpoint: "tcp://127.0.0.1:5558",
			CurveSecretKey: curveKey}, []string{"curve server key is required with a curve secret key"}},
		{"bad curve keys", processor.Options{Endpoint: "tcp://127.0.0.1:5557", AckEndpoint: "tcp://127.0.0.1:5558",
			CurveServerKey: curveKey[:39], CurveSecretKey: curveKey}, []string{"curve server key: not a Z85 CURVE key: want 40 characters, got 39"}},
		{"bad curve secret key", processor.Options{Endpoint: "tcp://127.0.0.1:5557", AckEndpoint: "tcp://127.0.0.1:5558",
			CurveServerKey: curveKey, CurveSecretKey: curveKey[:20] + "~" + curveKey[21:]},
			[]string{"curve secret key: not a Z85 CURVE key: character 21 is outside the Z85 alphabet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := processor.New(tc.o)
			if err == nil {
				t.Fatalf("New = %v, want an error", c)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), curveKey[:20]) {
				t.Errorf("error %q repeats a key", err)
			}
		})
	}
}

func TestRunReportsSetupErrors(t *testing.T) {
	err := processor.Run(t.Context(), processor.Options{
		Endpoint: "bogus://nowhere", AckEndpoint: "tcp://127.0.0.1:5558", Logger: testLogger(t),
	}, func(context.Context, *processor.Event) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "processor: connect PULL socket to bogus://nowhere") {
		t.Errorf("Run = %v, want a connect error", err)
	}
}
