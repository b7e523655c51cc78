package push

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ingestorhq/ingestor/internal/devicewire"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/sources"
)

// TestWSIngressManyDevices has 200 devices connected at once, each
// sending 25 envelopes without waiting (its window) and then collecting
// its answers (sending again what is answered "retry", as a device must):
// every envelope is answered "stored", the ledger holds each exactly once,
// and processors are handed each once.
func TestWSIngressManyDevices(t *testing.T) {
	const devices, each = 200, 25
	r := startWS(t, nil)
	conns := make([]*testDevice, devices)
	for i := range conns {
		conns[i] = dialDevice(t, r.url, sharedToken)
	}
	testsync.WaitFor(t, "200 devices to be connected", 30*time.Second, func() bool { return r.connected(t) == devices })
	var wg sync.WaitGroup
	var retries atomic.Int64
	for i, d := range conns {
		wg.Go(func() {
			dev := fmt.Sprintf("dev-%03d", i)
			sent := map[string]string{}
			for n := range each {
				id := fmt.Sprintf("%s-%02d", dev, n)
				sent[id] = envelopeFor(dev, id)
				if err := d.conn.Write(t.Context(), websocket.MessageText, []byte(sent[id])); err != nil {
					t.Errorf("%s: send: %v", dev, err)
					return
				}
			}
			got := map[string]bool{}
			for len(got) < each {
				select {
				case a := <-d.acks:
					if a.Status == devicewire.StatusRetry {
						// 5,000 envelopes at once are more than the
						// inbox takes (4,096 waiting commits): a slow
						// machine answers some "retry", and a device
						// then sends them again after the wait, as
						// PROTOCOL.md says.
						retries.Add(1)
						time.Sleep(time.Duration(a.RetryAfterMS) * time.Millisecond)
						if err := d.conn.Write(t.Context(), websocket.MessageText, []byte(sent[a.EventID])); err != nil {
							t.Errorf("%s: send again: %v", dev, err)
							return
						}
						continue
					}
					if a.Status != devicewire.StatusStored || got[a.EventID] {
						t.Errorf("%s: answer %+v (already answered: %v)", dev, a, got[a.EventID])
					}
					got[a.EventID] = true
				case err := <-d.closed:
					t.Errorf("%s: connection closed after %d answers: %v", dev, len(got), err)
					return
				case <-time.After(2 * time.Minute):
					t.Errorf("%s: %d of %d answers after 2 minutes", dev, len(got), each)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d envelopes answered retry and sent again", retries.Load())
	if t.Failed() {
		return
	}
	if got := r.q.PendingEvents(); got != devices*each {
		t.Errorf("queue holds %d events, want %d", got, devices*each)
	}
	keys := map[string]int{}
	r.frames.mu.Lock()
	for _, f := range r.frames.frames {
		for _, e := range f.Events {
			keys[e.Key]++
		}
	}
	r.frames.mu.Unlock()
	if len(keys) != devices*each {
		t.Errorf("processors were handed %d distinct events, want %d", len(keys), devices*each)
	}
	for k, n := range keys {
		if n != 1 {
			t.Errorf("event %s handed %d times", k, n)
		}
	}
	if got := metricValue(t, r.metrics.ws.envelopes.WithLabelValues("devices", "dev-199", devicewire.StatusStored)); got != each {
		t.Errorf("envelopes{device=dev-199,status=stored} = %v, want %d", got, each)
	}
}

// TestWSIngressSilentDeviceIsDropped connects a silent device (it neither
// sends nor reads, so it answers no ping), a quiet one (it sends nothing
// but answers pings) and an active one. The active one is answered while
// the silent one hangs; the silent one is dropped after read_timeout while
// the quiet one, connected as long, stays.
func TestWSIngressSilentDeviceIsDropped(t *testing.T) {
	r := startWS(t, func(s *sources.WSIngressSpec) { s.ReadTimeout, s.PingInterval = "3s", "100ms" })
	silent, err := dialWS(t, r.url, tokenA)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := silent.CloseNow(); err != nil {
			t.Logf("close the silent device: %v", err)
		}
	}()
	quiet, err := dialWS(t, r.url, tokenB)
	if err != nil {
		t.Fatal(err)
	}
	quietCtx := quiet.CloseRead(context.Background()) // reads, so answers pings, and sends nothing
	active := dialDevice(t, r.url, sharedToken)
	testsync.WaitFor(t, "3 devices to be connected", 10*time.Second, func() bool { return r.connected(t) == 3 })
	for n := range 20 {
		active.send(envelopeFor("dev-c", fmt.Sprint("c", n)))
		if a := active.next(); a.Status != devicewire.StatusStored {
			t.Fatalf("active device: %+v, want stored", a)
		}
	}
	testsync.WaitFor(t, "the silent device to be dropped", 30*time.Second, func() bool { return r.connected(t) == 2 })
	if quietCtx.Err() != nil {
		t.Fatal("the quiet device, which answers pings, was dropped")
	}
	if _, _, err := silent.Read(context.Background()); err == nil {
		t.Fatal("the silent device's connection still works")
	}
	active.send(envelopeFor("dev-c", "after"))
	if a := active.next(); a.Status != devicewire.StatusStored {
		t.Fatalf("active device after the drop: %+v, want stored", a)
	}
	if got := r.connected(t); got != 2 {
		t.Errorf("%v devices connected, want 2 (quiet and active)", got)
	}
}

// TestWSIngressMaxConnections answers a handshake beyond max_connections
// 503 with Retry-After, and takes one again once a connection has closed.
func TestWSIngressMaxConnections(t *testing.T) {
	r := startWS(t, func(s *sources.WSIngressSpec) { s.MaxConnections = 2 })
	first := dialDevice(t, r.url, tokenA)
	dialDevice(t, r.url, tokenB)
	_, err := dialWS(t, r.url, sharedToken)
	if err == nil || !strings.Contains(err.Error(), "answered 503") {
		t.Fatalf("third connection: err = %v, want a 503", err)
	}
	if got := metricValue(t, r.metrics.Requests.WithLabelValues("devices", "503")); got != 1 {
		t.Errorf("requests{code=503} = %v, want 1", got)
	}
	if err := first.conn.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "the first connection to be gone", 10*time.Second, func() bool { return r.connected(t) == 1 })
	d := dialDevice(t, r.url, sharedToken)
	d.send(envelopeFor("dev-z", "z1"))
	if a := d.next(); a.Status != devicewire.StatusStored {
		t.Fatalf("after a connection closed: %+v, want stored", a)
	}
}

// TestWSIngressRetryWhenQueueFull answers "retry" with retry_after_ms
// while the queue holds max_pending_events, and stores nothing.
func TestWSIngressRetryWhenQueueFull(t *testing.T) {
	r := startWSPending(t, 1, nil)
	d := dialDevice(t, r.url, tokenA)
	d.send(envelopeFor("dev-a", "first"))
	if a := d.next(); a.Status != devicewire.StatusStored {
		t.Fatalf("first: %+v, want stored", a)
	}
	d.send(envelopeFor("dev-a", "second"))
	a := d.next()
	if a.Status != devicewire.StatusRetry || a.EventID != "second" || a.RetryAfterMS <= 0 || !strings.Contains(a.Reason, "max_pending_events") {
		t.Fatalf("second: %+v, want retry with retry_after_ms and the reason", a)
	}
	if r.stored(t, "second") {
		t.Error("an envelope answered retry is in the ledger")
	}
	if got := metricValue(t, r.metrics.Requests.WithLabelValues("devices", "429")); got != 1 {
		t.Errorf("requests{code=429} = %v, want 1", got)
	}
}

// TestDeviceLabelsAreCapped gives the first maxDeviceLabels devices their
// own label and every later one otherDevice.
func TestDeviceLabelsAreCapped(t *testing.T) {
	var l deviceLabels
	for i := range maxDeviceLabels {
		if got := l.label(fmt.Sprint("d", i)); got != fmt.Sprint("d", i) {
			t.Fatalf("device %d labelled %q", i, got)
		}
	}
	if got := l.label("late"); got != otherDevice {
		t.Errorf("device beyond the cap labelled %q, want %q", got, otherDevice)
	}
	if got := l.label("d7"); got != "d7" {
		t.Errorf("a known device labelled %q after the cap", got)
	}
	if got := l.label(""); got != otherDevice {
		t.Errorf("no device labelled %q, want %q", got, otherDevice)
	}
}
