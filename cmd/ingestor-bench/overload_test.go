package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestOverloadModeShort is make bench's overload shape in small, for make
// test: it builds the binaries and runs -mode overload with 200 devices
// after a 2-second unloaded phase. It fails when the commits stall (no
// commit for 2 s while requests wait for one), a device does not finish,
// a device or webhook sender starves, or an event does not reach the
// processor exactly once. The goodput target is logged, not checked: the
// test shares the machine with the rest of make test, and make bench
// checks it.
func TestOverloadModeShort(t *testing.T) {
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "o")
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), filepath.Join(bin, "ingestor-bench"), "-mode", "overload", "-devices", "200", "-duration", "2s",
		"-json", "-dir", dir)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	runErr := cmd.Run() // non-nil when a target is missed: the checks below say which
	var res overloadResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("ingestor-bench -mode overload: %v; its output %q does not decode: %v\nstderr:\n%s", runErr, out.String(), err, errOut.String())
	}
	checked := map[string]bool{}
	for _, c := range res.Checks {
		checked[c.Name] = true
		switch {
		case c.OK:
			t.Logf("%s: %s", c.Name, c.Detail)
		case c.Name == "goodput":
			t.Logf("%s (not checked here): %s", c.Name, c.Detail)
		default:
			t.Errorf("%s: %s", c.Name, c.Detail)
		}
	}
	for _, name := range []string{"goodput", "every device finishes", "no sender starves", "every event reaches the processor once", "no commit stall"} {
		if !checked[name] {
			t.Errorf("no check %q in %+v", name, res.Checks)
		}
	}
	if o := res.Overload; o == nil || len(o.Windows) == 0 || o.DeviceStored != 200*validEnvelopes(150) || o.WebhookStored == 0 || o.DeviceRejected != 200*15 {
		t.Errorf("implausible overload phase: %+v", o)
	}
	if u := res.Unloaded; u == nil || u.Goodput <= 0 || u.CPUPerEventUS <= 0 {
		t.Errorf("implausible unloaded phase: %+v", u)
	}
	var text bytes.Buffer
	if err := printOverload(&text, &res, false); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", text.String())
	for _, want := range []string{"| window s | committed/s | of unloaded |", "target no commit stall: met", "devices finished: 200 of 200"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the text output lacks %q", want)
		}
	}
}

// TestOverloadWindows: 5-second windows every second, the last one ending
// where the phase ends; a phase shorter than a window is one window.
func TestOverloadWindows(t *testing.T) {
	if got := windows(0, 30); len(got) != 1 || got[0] != [2]int{0, 30} {
		t.Errorf("a 3 s phase: %v, want one window of it all", got)
	}
	got := windows(0, 123)
	want := [][2]int{{0, 50}, {10, 60}, {20, 70}, {30, 80}, {40, 90}, {50, 100}, {60, 110}, {70, 120}, {73, 123}}
	if len(got) != len(want) {
		t.Fatalf("a 12.3 s phase: %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("a 12.3 s phase: %v, want %v", got, want)
		}
	}
}

// TestOverloadChecks: each target fails on its own when missed.
func TestOverloadChecks(t *testing.T) {
	good := func() *overloadResult {
		return &overloadResult{EventsPerDevice: 150, Received: counts{Events: 300, DistinctKeys: 300},
			Unloaded: &phaseResult{Goodput: 1000, NewEvents: 100, LongestStallS: 0.1},
			Overload: &phaseResult{Devices: 2, DevicesFinished: 2, MinDeviceStored: 135, MaxDeviceStored: 135, MinWebhookStored: 5,
				NewEvents: 200, LongestDeviceWaitS: 1, LongestWebhookWaitS: 1, LongestStallS: 0.5,
				Windows: []windowResult{{PerSec: 900}, {FromS: 1, ToS: 6, PerSec: 850}}}}
	}
	missed := func(r *overloadResult) []string {
		r.check()
		var names []string
		for _, c := range r.Checks {
			if !c.OK {
				names = append(names, c.Name)
			}
		}
		return names
	}
	r := good()
	if got := missed(r); len(got) != 0 || r.MinWindowRatio != 0.85 {
		t.Errorf("a good run missed %v, lowest window %v; want none and 0.85", got, r.MinWindowRatio)
	}
	for _, c := range []struct {
		name  string
		spoil func(*overloadResult)
	}{
		{"goodput", func(r *overloadResult) { r.Overload.Windows[1].PerSec = 790 }},
		{"every device finishes", func(r *overloadResult) { r.Overload.DevicesFinished = 1 }},
		{"every device finishes", func(r *overloadResult) { r.Overload.MinDeviceStored = 134 }},
		{"no sender starves", func(r *overloadResult) { r.Overload.LongestDeviceWaitS = 10.5 }},
		{"no sender starves", func(r *overloadResult) { r.Overload.MinWebhookStored = 0 }},
		{"every event reaches the processor once", func(r *overloadResult) { r.Received.DistinctKeys = 299 }},
		{"no commit stall", func(r *overloadResult) { r.Unloaded.LongestStallS = (2 * time.Second).Seconds() }},
	} {
		r := good()
		c.spoil(r)
		if got := missed(r); len(got) != 1 || got[0] != c.name {
			t.Errorf("spoiling %q missed %v", c.name, got)
		}
	}
}

// TestParseFlagsOverloadMode: the mode's defaults, -devices, and its
// checks.
func TestParseFlagsOverloadMode(t *testing.T) {
	o, err := parseFlags([]string{"-mode", "overload"}, &bytes.Buffer{})
	if err != nil || o.devices != overloadDevices || o.events != overloadEvents || o.clients != overloadSenders || o.duration != overloadUnloaded {
		t.Errorf("defaults: devices %d, events %d, clients %d, duration %v, err %v", o.devices, o.events, o.clients, o.duration, err)
	}
	if o, err := parseFlags([]string{"-mode", "overload", "-devices", "1000", "-clients", "3"}, &bytes.Buffer{}); err != nil || o.devices != 1000 || o.clients != 3 {
		t.Errorf("-devices 1000 -clients 3: devices %d, clients %d, err %v", o.devices, o.clients, err)
	}
	_, err = parseFlags([]string{"-mode", "overload", "-devices", "0", "-duration", "1s"}, &bytes.Buffer{})
	for _, want := range []string{"-devices must be at least 1", "-duration (the unloaded phase) must be at least 2s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not contain %q", err, want)
		}
	}
}

// TestOverloadLoad runs a device and a webhook sender against stand-in
// servers that refuse their first attempts: the device sends its
// messages, resends each envelope answered "retry" after retry_after_ms
// and finishes once each has its final answer; the webhook sender waits
// out a 429's Retry-After and counts the request's latency from its first
// POST.
func TestOverloadLoad(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	ws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		// A failed read or write has closed the connection.
		for {
			_, msg, err := conn.Read(r.Context())
			if err != nil {
				return
			}
			a := answer{Status: "rejected"}
			var env struct {
				EventID string `json:"event_id"`
			}
			if json.Unmarshal(msg, &env) == nil {
				mu.Lock()
				seen[env.EventID]++
				a = answer{EventID: env.EventID, Status: "stored"}
				if seen[env.EventID] == 1 {
					a = answer{EventID: env.EventID, Status: "retry", RetryAfterMS: 5}
				}
				mu.Unlock()
			}
			b, err := json.Marshal(a)
			if err != nil {
				return
			}
			if err := conn.Write(r.Context(), websocket.MessageText, b); err != nil {
				return
			}
		}
	}))
	t.Cleanup(ws.Close)
	var posts atomic.Int64
	hooks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if posts.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(hooks.Close)

	tl := newTimeline(time.Now())
	d, err := dialDevice(t.Context(), "ws"+strings.TrimPrefix(ws.URL, "http"), "dev", 30, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.tl = tl
	stop := make(chan struct{})
	s := &hookSender{prefix: "test", url: hooks.URL, client: hooks.Client(), tl: tl, stop: stop}
	var wg sync.WaitGroup
	wg.Go(func() { d.run(t.Context()) })
	wg.Go(func() { s.run(t.Context()) })
	testsync.WaitFor(t, "the webhook sender's third stored request", 10*time.Second, func() bool { return tl.committed(0, len(tl.ref)) >= validEnvelopes(30)+3 })
	close(stop)
	wg.Wait()
	if err := errors.Join(d.err, s.err, d.close()); err != nil {
		t.Fatal(err)
	}
	if d.finished.IsZero() || d.stored.Load() != validEnvelopes(30) || d.rejected != 3 || d.retries.Load() == 0 {
		t.Errorf("device: finished %v, %d stored, %d rejected, %d retries; want finished, 27, 3 and some", !d.finished.IsZero(),
			d.stored.Load(), d.rejected, d.retries.Load())
	}
	if s.refused != 1 || s.stored < 3 || len(s.latencies) != int(s.stored) || s.latencies[0].latency < time.Second {
		t.Errorf("webhook sender: %d refused, %d stored, latencies %v; want 1, at least 3, the first over the 1 s Retry-After", s.refused, s.stored, s.latencies)
	}
	if n := tl.inflight.Load(); n != 0 {
		t.Errorf("%d requests still counted in flight", n)
	}
}
