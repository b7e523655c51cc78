package testupstream

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// dialWS connects to feed and subscribes with body.
func dialWS(t *testing.T, feed *WSFeed, body string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.Dial(t.Context(), feed.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.CloseNow(); err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("close: %v", err)
		}
	})
	if err := c.Write(t.Context(), websocket.MessageText, []byte(body)); err != nil {
		t.Fatal(err)
	}
	return c
}

// readSeqs reads n messages and returns their seq, -1 for a malformed one.
func readSeqs(t *testing.T, c *websocket.Conn, n int) []int {
	t.Helper()
	var out []int
	for range n {
		_, msg, err := c.Read(t.Context())
		if err != nil {
			t.Fatalf("after %v: %v", out, err)
		}
		if string(msg) == WSMalformed {
			out = append(out, -1)
			continue
		}
		val, _, ok := jsonscan.Field(msg, "seq")
		id, _, _ := jsonscan.Field(msg, "id")
		seq, err := strconv.Atoi(string(val))
		if !ok || err != nil || string(id) != WSID(seq) {
			t.Fatalf("message %s", msg)
		}
		out = append(out, seq)
	}
	return out
}

func TestWSFeedStreamsFromSince(t *testing.T) {
	feed := NewWS(t, WSOptions{Total: 6, MalformedAt: 5, SinceField: "from"})
	c := dialWS(t, feed, `{"op":"subscribe","from":3}`)
	if got := readSeqs(t, c, 4); !slices.Equal(got, []int{4, -1, 5, 6}) {
		t.Fatalf("read %v", got)
	}
	c2 := dialWS(t, feed, `{"op":"subscribe","from":"4"}`)
	if got := readSeqs(t, c2, 2); !slices.Equal(got, []int{5, 6}) {
		t.Fatalf("second connection read %v: the malformed message is sent once", got)
	}
	conns := feed.Connections()
	if len(conns) != 2 || conns[0].Since != "3" || conns[1].Since != "4" {
		t.Fatalf("connections %+v", conns)
	}
}

func TestWSFeedDropsAbruptly(t *testing.T) {
	feed := NewWS(t, WSOptions{Total: 10, DropAfter: 3, Drops: 1})
	c := dialWS(t, feed, `{"since":""}`)
	if got := readSeqs(t, c, 3); !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("read %v", got)
	}
	_, _, err := c.Read(t.Context())
	if err == nil || websocket.CloseStatus(err) != -1 {
		t.Fatalf("after the drop: %v, want a broken connection without a close frame", err)
	}
	c2 := dialWS(t, feed, `{"since":"3"}`)
	if got := readSeqs(t, c2, 7); !slices.Equal(got, []int{4, 5, 6, 7, 8, 9, 10}) {
		t.Fatalf("second connection read %v", got)
	}
	if conns := feed.Connections(); !conns[0].Dropped || conns[0].Sent != 3 || conns[1].Dropped {
		t.Fatalf("connections %+v", conns)
	}
}

func TestWSFeedPongs(t *testing.T) {
	for _, noPong := range []bool{false, true} {
		feed := NewWS(t, WSOptions{Total: 1, NoPong: noPong})
		c := dialWS(t, feed, `{}`)
		readSeqs(t, c, 1)
		// Ping needs a concurrent reader to see the pong.
		ctx := c.CloseRead(t.Context())
		wait := 10 * time.Second // a pong comes long before
		if noPong {
			wait = 300 * time.Millisecond
		}
		pctx, cancel := context.WithTimeout(ctx, wait)
		err := c.Ping(pctx)
		cancel()
		if (err == nil) == noPong {
			t.Fatalf("NoPong %v: ping %v", noPong, err)
		}
		for deadline := time.Now().Add(10 * time.Second); feed.Pings() != 1; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("NoPong %v: %d pings seen, want 1", noPong, feed.Pings())
			}
		}
	}
}

func TestWSFeedSinceInURL(t *testing.T) {
	var drops atomic.Int32
	feed := NewWS(t, WSOptions{Total: 10, SinceInURL: true, DropAfter: 4, Drops: 1, OnDrop: func() { drops.Add(1) }})
	for _, q := range []string{"", "?since=", "?since={cursor}", "?since=-1"} {
		_, resp, err := websocket.Dial(t.Context(), feed.URL+"/ws"+q, nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("handshake %q: %v, %v; want a 400", q, resp, err)
		}
	}
	if got, want := feed.Refused(), []string{"", "", "{cursor}", "-1"}; !slices.Equal(got, want) {
		t.Fatalf("refused %q, want %q", got, want)
	}
	c, _, err := websocket.Dial(t.Context(), feed.URL+"/ws?since=3", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if got := readSeqs(t, c, 4); !slices.Equal(got, []int{4, 5, 6, 7}) {
		t.Fatalf("got %v, want 4..7", got)
	}
	if _, _, err := c.Read(t.Context()); err == nil {
		t.Fatal("read after DropAfter messages succeeded; want the connection dropped")
	}
	if n := drops.Load(); n != 1 {
		t.Fatalf("OnDrop called %d times, want 1", n)
	}
	if conns := feed.Connections(); len(conns) != 1 || conns[0].Since != "3" || !conns[0].Dropped {
		t.Fatalf("connections %+v, want one from since 3, dropped", conns)
	}
}

func TestWSFeedScriptedHandshakes(t *testing.T) {
	feed := NewWS(t, WSOptions{Total: 2})
	feed.Script(RetryAfter(429, 2), RetryAfterDate(503, 3*time.Second), Status(400))
	u := feed.URL + "/events?since=7"
	for i, want := range []struct {
		status int
		check  func(string) bool
	}{
		{429, func(v string) bool { return v == "2" }},
		{503, func(v string) bool { _, err := http.ParseTime(v); return err == nil }},
		{400, func(v string) bool { return v == "" }},
	} {
		_, resp, err := websocket.Dial(t.Context(), u, nil)
		if err == nil || resp == nil || resp.StatusCode != want.status || !want.check(resp.Header.Get("Retry-After")) {
			t.Fatalf("handshake %d: err %v, response %+v, want status %d", i, err, resp, want.status)
		}
	}
	c := dialWS(t, feed, `{"since":""}`)
	if got := readSeqs(t, c, 2); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("after the scripted handshakes got %v", got)
	}
	hs := feed.Handshakes()
	if len(hs) != 4 {
		t.Fatalf("%d handshakes recorded, want 4", len(hs))
	}
	for i, want := range []int{429, 503, 400, 0} {
		if hs[i].Status != want || (i < 3 && (hs[i].Path != "/events" || hs[i].Query.Get("since") != "7")) {
			t.Errorf("handshake %d: %+v, want status %d on /events?since=7", i, hs[i], want)
		}
		if i > 0 && hs[i].Time.Before(hs[i-1].Time) {
			t.Errorf("handshake %d recorded before the one before it", i)
		}
	}
}
