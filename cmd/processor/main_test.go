package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/wire"
)

func TestParseFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if want := (config{connect: "tcp://127.0.0.1:5557", ack: "tcp://127.0.0.1:5558", logEvery: 2 * time.Second, logFormat: "text"}); c != want {
		t.Errorf("defaults = %+v, want %+v", c, want)
	}
	_, err = parseFlags([]string{"-log-every", "0s", "-log-format", "xml", "extra"}, io.Discard)
	for _, want := range []string{`unexpected arguments ["extra"]`, "-log-every must be positive, not 0s", `-log-format must be text or json, not "xml"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not contain %q", err, want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRunCountsAcksAndSummarises runs the command against a daemon played
// by the test on real ZeroMQ sockets.
func TestRunCountsAcksAndSummarises(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	var socks []*zmq.Socket
	t.Cleanup(func() {
		for _, s := range socks {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}
		if err := zctx.Term(); err != nil {
			t.Error(err)
		}
	})
	bind := func(typ zmq.Type) (*zmq.Socket, string) {
		s, err := zctx.NewSocket(typ)
		if err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
		for _, err := range []error{s.SetLinger(0), s.SetSndtimeo(10 * time.Second), s.SetRcvtimeo(10 * time.Second), s.Bind("tcp://127.0.0.1:*")} {
			if err != nil {
				t.Fatal(err)
			}
		}
		ep, err := s.GetLastEndpoint()
		if err != nil {
			t.Fatal(err)
		}
		return s, ep
	}
	push, endpoint := bind(zmq.PUSH)
	pull, ackEndpoint := bind(zmq.PULL)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-connect", endpoint, "-ack", ackEndpoint, "-log-every", "10ms", "-log-format", "json"}, &logs)
	}()

	var enc wire.Encoder
	enc.Begin(1, 2, "file://./data/raw")
	for i, src := range []string{"github", "hn", "github"} {
		ev := wire.Event{Key: src + string(rune('a'+i)), Source: src, Seq: int64(i + 1), FetchedAt: time.Now()}
		enc.Add(&ev, []byte(`{}`), true)
	}
	if _, err := push.SendBytes(enc.End(), 0); err != nil {
		t.Fatalf("send: %v", err)
	}
	data, err := pull.RecvBytes(0) // bounded by the receive timeout
	if err != nil {
		t.Fatalf("receive ack: %v", err)
	}
	if a, err := wire.DecodeAck(data); err != nil || len(a.Frames) != 1 || a.Frames[0] != 1 {
		t.Fatalf("ack = %s (%v), want frame 1 acked", data, err)
	}
	// Wait for a progress log that has seen the frame, then stop.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), `"msg":"progress","events_per_sec"`) || !strings.Contains(logs.String(), `"events":3`) {
		if time.Now().After(deadline) {
			t.Fatalf("no progress log with 3 events:\n%s", logs.String())
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancellation")
	}

	var summary struct {
		Msg          string           `json:"msg"`
		Events       int64            `json:"events"`
		Sources      map[string]int64 `json:"sources"`
		Acked        int64            `json:"acked"`
		Redeliveries int64            `json:"redeliveries"`
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &summary); err != nil {
		t.Fatalf("last log line %q: %v", lines[len(lines)-1], err)
	}
	if summary.Msg != "summary" || summary.Events != 3 || summary.Acked != 3 || summary.Redeliveries != 1 ||
		summary.Sources["github"] != 2 || summary.Sources["hn"] != 1 {
		t.Errorf("summary = %+v, want 3 events (github 2, hn 1), 3 acked, 1 redelivery", summary)
	}
}
