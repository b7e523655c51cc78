package zmqpull

import (
	"bytes"
	"errors"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"
)

// waitTimeout bounds every wait for a condition.
const waitTimeout = 10 * time.Second

// pusher binds a PUSH socket on a free loopback port, closed at the end
// of the test.
func pusher(t *testing.T) (*zmq.Socket, string) {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	push, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := errors.Join(push.Close(), zctx.Term()); err != nil {
			t.Error(err)
		}
	})
	if err := errors.Join(push.SetLinger(0), push.SetSndtimeo(waitTimeout), push.Bind("tcp://127.0.0.1:*")); err != nil {
		t.Fatal(err)
	}
	ep, err := push.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	return push, ep
}

// recvWait receives the next message, waiting on the socket's FD as the
// processor does: receive until ErrAgain, then wait for the FD.
func recvWait(t *testing.T, s *Socket, buf []byte) ([]byte, int) {
	t.Helper()
	fd, err := s.FD()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitTimeout)
	for {
		msg, parts, err := s.Recv(buf)
		if err == nil {
			return msg, parts
		}
		if !errors.Is(err, ErrAgain) {
			t.Fatalf("Recv: %v", err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatal("no message within the timeout")
		}
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(p, int(left/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			t.Fatalf("poll ZMQ_FD: %v", err)
		}
	}
}

// TestRecvIntoCallersBuffer sends messages of several sizes, one of
// several parts, and checks what Recv returns and that it receives into
// the buffer it is given when that is large enough.
func TestRecvIntoCallersBuffer(t *testing.T) {
	push, ep := pusher(t)
	s, err := Dial(ep, Options{ReceiveHWM: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	if _, _, err := s.Recv(nil); !errors.Is(err, ErrAgain) {
		t.Fatalf("Recv with nothing sent: %v, want ErrAgain", err)
	}
	big := bytes.Repeat([]byte("0123456789"), 10_000) // 100 KB, as a frame
	for _, m := range [][]byte{[]byte("first"), {}, big, []byte("small after big")} {
		if _, err := push.SendBytes(m, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := push.SendMessage("part one", "part two", "part three"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 64)
	msg, parts := recvWait(t, s, buf)
	if string(msg) != "first" || parts != 1 || &msg[:1][0] != &buf[:1][0] {
		t.Errorf("first message: %q in %d parts, in the buffer given %v", msg, parts, &msg[:1][0] == &buf[:1][0])
	}
	if msg, parts = recvWait(t, s, buf); len(msg) != 0 || parts != 1 {
		t.Errorf("empty message: %q in %d parts", msg, parts)
	}
	if msg, parts = recvWait(t, s, buf); !bytes.Equal(msg, big) || parts != 1 {
		t.Errorf("100 KB message: %d bytes in %d parts, equal %v", len(msg), parts, bytes.Equal(msg, big))
	}
	grown := msg
	if msg, _ = recvWait(t, s, grown); string(msg) != "small after big" || &msg[0] != &grown[0] {
		t.Errorf("message after the big one: %q, in the grown buffer %v", msg, &msg[0] == &grown[0])
	}
	if msg, parts = recvWait(t, s, buf); string(msg) != "part one" || parts != 3 {
		t.Errorf("message of three parts: %q in %d parts, want \"part one\" in 3", msg, parts)
	}
	if _, _, err := s.Recv(nil); !errors.Is(err, ErrAgain) {
		t.Errorf("Recv after the last message: %v, want ErrAgain", err)
	}
}

// TestDialErrors checks that a bad endpoint and a bad key are errors that
// do not show the key.
func TestDialErrors(t *testing.T) {
	if _, err := Dial("nonsense://x", Options{}); err == nil {
		t.Error("Dial accepted an endpoint of an unknown transport")
	}
	const secret = "not a key at all, forty chars long......"
	_, err := Dial("tcp://127.0.0.1:1", Options{CurveServerKey: "short", CurveSecretKey: secret})
	if err == nil || bytes.Contains([]byte(err.Error()), []byte(secret)) {
		t.Errorf("Dial with a malformed CURVE key: %v", err)
	}
}
