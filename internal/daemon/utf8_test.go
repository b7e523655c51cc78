package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// TestInvalidUTF8TravelsAsBase64 serves a page in which one record holds
// bytes that are not UTF-8 (0xFF and a Latin-1 0xE9, in its id and in a
// string), between good records, followed by an ordinary feed. Every frame
// the daemon sends passes a tap that checks it is valid UTF-8 before the
// processor package gets it: every event is delivered and acked, the bad
// one arrives as payload_b64 holding exactly its upstream bytes under the
// key its id maps to, and nothing is dead-lettered.
func TestInvalidUTF8TravelsAsBase64(t *testing.T) {
	const total = 20
	srv := testupstream.NewServer(t, testupstream.Options{Total: total, PageSize: 10})
	good1 := `{"id":"u-1","seq":0,"body":"caf\u00e9"}`
	bad := "{\"id\":\"u-\xff2\",\"seq\":0,\"body\":\"caf\xe9 \xff\"}"
	good3 := `{"id":"u-3","seq":0,"body":"plain"}`
	srv.Script(testupstream.Body(http.StatusOK, "["+good1+","+bad+","+good3+"]"))
	h := startDaemon(t, "", "events_per_frame = 50", httpSource("mixed", srv.URL))

	tap := newUTF8Tap(t, h.pub)
	type got struct{ payload, b64 []byte }
	var mu sync.Mutex
	seen := make(map[string]got)
	c, err := processor.New(processor.Options{Endpoint: tap.endpoint, AckEndpoint: h.ack,
		Logger: slog.New(slog.NewTextHandler(h.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx, func(_ context.Context, ev *processor.Event) error {
			mu.Lock()
			defer mu.Unlock()
			seen[ev.Key] = got{payload: bytes.Clone(ev.Payload), b64: bytes.Clone(ev.PayloadBase64)}
			return nil
		}); err != nil {
			t.Errorf("processor: %v", err)
		}
	}()
	t.Cleanup(func() { stop(); <-done })

	badKey := "u-\uFFFD2" // the id's text as JSON decodes it
	want := []string{"u-1", badKey, "u-3"}
	for n := 1; n <= total; n++ {
		want = append(want, testupstream.ID(n))
	}
	testsync.WaitFor(t, "every event delivered", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) >= len(want)
	})
	testsync.WaitFor(t, "every event acked", 30*time.Second, func() bool { return h.d.Queue().PendingEvents() == 0 })

	mu.Lock()
	for _, k := range want {
		g, ok := seen[k]
		switch {
		case !ok:
			t.Errorf("event %q never arrived", k)
		case k == badKey && (g.payload != nil || string(g.b64) != bad):
			t.Errorf("bad record arrived as payload %q / payload_b64 %q, want payload_b64 %q", g.payload, g.b64, bad)
		case k != badKey && (g.payload == nil || g.b64 != nil):
			t.Errorf("good record %q arrived as payload %q / payload_b64 %q, want payload", k, g.payload, g.b64)
		}
	}
	if len(seen) != len(want) {
		t.Errorf("received %d distinct keys, want %d: %v", len(seen), len(want), seen)
	}
	mu.Unlock()
	if n, bad := tap.counts(); n == 0 || bad != 0 {
		t.Errorf("tap saw %d frames, %d of them not valid UTF-8", n, bad)
	}
	dl, err := h.d.Queue().DeadLetters(t.Context(), 10)
	if err != nil || len(dl) != 0 {
		t.Errorf("dead letters = %+v (%v), want none", dl, err)
	}
}

// utf8Tap sits between the daemon and a processor: a raw PULL socket
// receives every frame the daemon sends, checks that it is valid UTF-8, and
// forwards it unchanged to a PUSH socket the processor connects to.
type utf8Tap struct {
	endpoint    string
	frames, bad atomic.Int64
}

func newUTF8Tap(t *testing.T, daemonEndpoint string) *utf8Tap {
	t.Helper()
	tap := &utf8Tap{endpoint: "tcp://" + testsync.FreePort(t)}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	pull, err := zctx.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	push, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{pull.SetLinger(0), push.SetLinger(0), push.SetSndtimeo(50 * time.Millisecond),
		pull.Connect(daemonEndpoint), push.Bind(tap.endpoint)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	var stopped atomic.Bool
	done := make(chan struct{})
	// The sockets are used by this goroutine only, and closed by it.
	go func() {
		defer close(done)
		poller := zmq.NewPoller()
		poller.Add(pull, zmq.POLLIN)
		for !stopped.Load() {
			polled, err := poller.Poll(50 * time.Millisecond)
			if err != nil {
				if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
					continue
				}
				t.Errorf("tap poll: %v", err)
				break
			}
			if len(polled) == 0 {
				continue
			}
			msg, err := pull.RecvBytes(0)
			if err != nil {
				t.Errorf("tap receive: %v", err)
				break
			}
			tap.frames.Add(1)
			if !utf8.Valid(msg) {
				tap.bad.Add(1)
				t.Errorf("frame is not valid UTF-8: %q", msg)
			}
			if err := forward(push, msg, &stopped); err != nil {
				t.Errorf("tap forward: %v", err)
				break
			}
		}
		for _, err := range []error{pull.Close(), push.Close()} {
			if err != nil {
				t.Errorf("tap close: %v", err)
			}
		}
	}()
	t.Cleanup(func() {
		stopped.Store(true)
		<-done
		if err := zctx.Term(); err != nil {
			t.Errorf("tap: %v", err)
		}
	})
	return tap
}

// counts returns the frames the tap forwarded and how many were not UTF-8.
func (tap *utf8Tap) counts() (frames, bad int64) { return tap.frames.Load(), tap.bad.Load() }

// forward sends msg on push, waiting for a peer until it is sent or the tap
// stops.
func forward(push *zmq.Socket, msg []byte, stopped *atomic.Bool) error {
	for !stopped.Load() {
		_, err := push.SendBytes(msg, 0)
		if err == nil || zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
			return err
		}
	}
	return nil
}
