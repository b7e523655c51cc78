package edge

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestStoredAckDeletesTheRow sends three events and checks that the
// daemon got each once, completed by the forwarder, and that every
// "stored" ACK emptied the outbox.
func TestStoredAckDeletesTheRow(t *testing.T) {
	d := newFakeDaemon(t)
	f := startForwarder(t, testOptions(t, d))
	status, r := post(t, f.HTTPAddr(), `{"type":"t","payload":{"n":1}}
{"type":"t","payload":{"n":2}}
{"type":"t","payload":{"n":3},"event_id":"mine-3","device_id":"dev-9"}`)
	if status != 200 || r.Status != replyAccepted || len(r.EventIDs) != 3 || r.EventIDs[2] != "mine-3" {
		t.Fatalf("post: %d %+v", status, r)
	}
	waitEmpty(t, f)
	if n := d.storedCount(); n != 3 {
		t.Fatalf("daemon stored %d events, want 3", n)
	}
	var session string
	for i, id := range r.EventIDs {
		got := d.receivedOf(id)
		if len(got) != 1 {
			t.Fatalf("event %s received %d times, want once", id, len(got))
		}
		e := got[0]
		if session == "" {
			session = e.Session
		}
		wantDevice, wantSeq := "dev-1", int64(i+1)
		if i == 2 {
			wantDevice, wantSeq = "dev-9", 1 // the producer's device_id, with its own counter
		}
		if e.Type != "t" || e.Device != wantDevice || e.Seq != wantSeq || e.Session != session || len(e.Session) != 32 ||
			!bytes.Contains(e.raw, []byte(`"schema_version":1`)) || string(e.Payload) != fmt.Sprintf(`{"n":%d}`, i+1) {
			t.Errorf("envelope %d = %s", i, e.raw)
		}
		if _, err := time.Parse(time.RFC3339, e.TS); err != nil {
			t.Errorf("envelope %d: ts %q: %v", i, e.TS, err)
		}
	}
}

// TestRejectedMovesToTheDeadLetters answers "rejected" for one event and
// checks it leaves the outbox for the dead letters with the reason and is
// never sent again.
func TestRejectedMovesToTheDeadLetters(t *testing.T) {
	d := newFakeDaemon(t)
	d.setOnEnvelope(func(c *fakeConn, env fakeEnvelope) {
		if env.Type == "bad" {
			c.answer(map[string]any{"event_id": env.EventID, "status": "rejected", "reason": "type bad is not allowed"})
			return
		}
		c.store(env)
	})
	f := startForwarder(t, testOptions(t, d))
	_, bad := post(t, f.HTTPAddr(), `{"type":"bad","payload":1}`)
	waitEmpty(t, f)
	post(t, f.HTTPAddr(), `{"type":"good","payload":2}`)
	testsync.WaitFor(t, "the good event stored", 10*time.Second, func() bool { return d.storedCount() == 1 })
	waitEmpty(t, f)
	if n := len(d.receivedOf(bad.EventIDs[0])); n != 1 {
		t.Errorf("rejected event sent %d times, want once", n)
	}
	s := f.ob.stats()
	if s.DeadLetters != 1 || s.LastDeadLetter != "type bad is not allowed" || s.Events != 0 {
		t.Errorf("stats = %+v, want one dead letter with the reason and nothing pending", s)
	}
}

// TestRetryWaitsRetryAfter answers "retry" with retry_after_ms to the
// first copy of each event and checks the second comes no sooner, with
// the same bytes, and is then stored.
func TestRetryWaitsRetryAfter(t *testing.T) {
	const retryAfter = 300 * time.Millisecond
	d := newFakeDaemon(t)
	var mu sync.Mutex
	seen := map[string]bool{}
	d.setOnEnvelope(func(c *fakeConn, env fakeEnvelope) {
		mu.Lock()
		first := !seen[env.EventID]
		seen[env.EventID] = true
		mu.Unlock()
		if first {
			c.answer(map[string]any{"event_id": env.EventID, "status": "retry", "reason": "queue full", "retry_after_ms": retryAfter.Milliseconds()})
			return
		}
		c.store(env)
	})
	f := startForwarder(t, testOptions(t, d))
	_, r := post(t, f.HTTPAddr(), `{"type":"t","payload":1}`)
	testsync.WaitFor(t, "the retried event stored", 10*time.Second, func() bool { return d.storedCount() == 1 })
	waitEmpty(t, f)
	got := d.receivedOf(r.EventIDs[0])
	if len(got) != 2 {
		t.Fatalf("event sent %d times, want twice", len(got))
	}
	if gap := got[1].at.Sub(got[0].at); gap < retryAfter {
		t.Errorf("resent after %v, before retry_after_ms %v", gap, retryAfter)
	}
	if !bytes.Equal(got[0].raw, got[1].raw) {
		t.Errorf("resent with other bytes:\n%s\n%s", got[0].raw, got[1].raw)
	}
}

// TestDropMidWindowResendsUnacked lets the daemon take a window of
// envelopes without answering, drops the connection, and checks the
// forwarder reconnects and resends every one, byte for byte.
func TestDropMidWindowResendsUnacked(t *testing.T) {
	const n = 5
	d := newFakeDaemon(t)
	var mu sync.Mutex
	var first *fakeConn
	held := 0
	d.setOnEnvelope(func(c *fakeConn, env fakeEnvelope) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = c
		}
		if c != first {
			c.store(env)
			return
		}
		if held++; held == n {
			c.drop()
		}
	})
	f := startForwarder(t, testOptions(t, d))
	_, r := post(t, f.HTTPAddr(), strings.Repeat(`{"type":"t","payload":"x"}`+"\n", n))
	testsync.WaitFor(t, "every event stored after the reconnection", 10*time.Second, func() bool { return d.storedCount() == n })
	waitEmpty(t, f)
	for _, id := range r.EventIDs {
		got := d.receivedOf(id)
		if len(got) != 2 || !bytes.Equal(got[0].raw, got[1].raw) {
			t.Errorf("event %s: received %d copies, want 2 identical ones", id, len(got))
		}
	}
}

// TestReorderedAcks answers a whole window in reverse order and checks
// every row is matched by its event_id and deleted.
func TestReorderedAcks(t *testing.T) {
	const n = 8
	d := newFakeDaemon(t)
	var mu sync.Mutex
	var batch []fakeEnvelope
	d.setOnEnvelope(func(c *fakeConn, env fakeEnvelope) {
		mu.Lock()
		defer mu.Unlock()
		if batch = append(batch, env); len(batch) < n {
			return
		}
		for _, e := range slices.Backward(batch) {
			c.store(e)
		}
		batch = nil
	})
	o := testOptions(t, d)
	o.Window = n
	f := startForwarder(t, o)
	_, r := post(t, f.HTTPAddr(), strings.Repeat(`{"type":"t","payload":"x"}`+"\n", n))
	waitEmpty(t, f)
	for _, id := range r.EventIDs {
		if got := len(d.receivedOf(id)); got != 1 {
			t.Errorf("event %s sent %d times, want once", id, got)
		}
	}
}

// TestWindowBoundsUnacked checks that no more than Window envelopes are
// sent before an answer.
func TestWindowBoundsUnacked(t *testing.T) {
	d := newFakeDaemon(t)
	release := make(chan struct{})
	var mu sync.Mutex
	var held []fakeEnvelope
	d.setOnEnvelope(func(c *fakeConn, env fakeEnvelope) {
		mu.Lock()
		held = append(held, env)
		mu.Unlock()
		d.spawn(func() {
			select {
			case <-release:
				c.store(env)
			case <-d.done:
			}
		})
	})
	o := testOptions(t, d)
	o.Window = 3
	f := startForwarder(t, o)
	post(t, f.HTTPAddr(), strings.Repeat(`{"type":"t","payload":"x"}`+"\n", 10))
	testsync.WaitFor(t, "a full window", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(held) == 3
	})
	// The forwarder has had every chance to send more: a later event
	// only goes out once an answer arrives.
	post(t, f.HTTPAddr(), `{"type":"t","payload":"y"}`)
	if n := f.ob.stats().Events; n != 11 {
		t.Fatalf("outbox holds %d, want 11", n)
	}
	mu.Lock()
	sent := len(held)
	mu.Unlock()
	if sent != 3 {
		t.Fatalf("%d envelopes sent without an answer, window is 3", sent)
	}
	close(release)
	waitEmpty(t, f)
}

// TestWrongTokenKeepsEverything points the forwarder at a daemon that
// refuses its token: it keeps retrying, deletes nothing, and never logs
// the token.
func TestWrongTokenKeepsEverything(t *testing.T) {
	d := newFakeDaemon(t)
	var logs testsync.LockedBuffer
	o := testOptions(t, d)
	o.Token = "wrong-token-that-must-not-be-logged"
	o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f := startForwarder(t, o)
	post(t, f.HTTPAddr(), `{"type":"t","payload":1}`)
	testsync.WaitFor(t, "three refused handshakes", 10*time.Second, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.handshakes >= 3
	})
	if n, _ := f.ob.backlog(); n != 1 {
		t.Errorf("outbox holds %d, want the 1 event", n)
	}
	if out := logs.String(); strings.Contains(out, o.Token) || !strings.Contains(out, "401") {
		t.Errorf("log shows the token, or not the 401:\n%s", out)
	}
}

// TestAckTimeoutReconnectsAndResends lets the daemon swallow the first
// copy of an event: after ack_timeout the forwarder drops the connection
// and sends it again on a new one.
func TestAckTimeoutReconnectsAndResends(t *testing.T) {
	d := newFakeDaemon(t)
	var mu sync.Mutex
	seen := map[string]bool{}
	d.setOnEnvelope(func(c *fakeConn, env fakeEnvelope) {
		mu.Lock()
		first := !seen[env.EventID]
		seen[env.EventID] = true
		mu.Unlock()
		if !first {
			c.store(env)
		}
	})
	o := testOptions(t, d)
	o.AckTimeout = 200 * time.Millisecond
	f := startForwarder(t, o)
	_, r := post(t, f.HTTPAddr(), `{"type":"t","payload":1}`)
	testsync.WaitFor(t, "the event stored", 10*time.Second, func() bool { return d.storedCount() == 1 })
	waitEmpty(t, f)
	got := d.receivedOf(r.EventIDs[0])
	if len(got) != 2 || got[1].at.Sub(got[0].at) < o.AckTimeout {
		t.Fatalf("event sent %d times (want 2, the second after ack_timeout)", len(got))
	}
	d.mu.Lock()
	conns := len(d.conns)
	d.mu.Unlock()
	if conns < 2 {
		t.Errorf("%d connections, want a new one after the ack timeout", conns)
	}
}
