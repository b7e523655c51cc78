package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
)

// startDevices starts a daemon with a ws_ingress source "devices" on a
// loopback push listener, whose tokens file holds tokens.
func startDevices(t *testing.T, tokens string) *harness {
	t.Helper()
	file := filepath.Join(t.TempDir(), "device-tokens")
	if err := os.WriteFile(file, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	return startDaemon(t, "", "", fmt.Sprintf(`
[push]
addr = "127.0.0.1:0"

[source.devices]
kind = "ws_ingress"
tokens_file = %q
`, file))
}

// TestWSIngressThroughTheDaemon has two devices, each with its own token,
// send 50 envelopes each to a ws_ingress source of a whole daemon: every
// envelope is answered stored, and a processor receives each one, its
// payload the envelope byte for byte, its key the event_id and its event
// time the ts; the source's metrics count them.
func TestWSIngressThroughTheDaemon(t *testing.T) {
	const each = 50
	h := startDevices(t, "pump-1 pump-1-token-0123456789\npump-2 pump-2-token-0123456789\n")
	type got struct {
		payload string
		at      time.Time
	}
	var mu sync.Mutex
	seen := map[string]got{}
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if ev.Source != "devices" {
			t.Errorf("event %s from source %q", ev.Key, ev.Source)
		}
		seen[ev.Key] = got{string(ev.Payload), ev.EventTime}
		return nil
	})
	sent := map[string]string{}
	base := time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)
	for _, dev := range []string{"pump-1", "pump-2"} {
		hdr := http.Header{"Authorization": {"Bearer " + dev + "-token-0123456789"}}
		conn, _, err := websocket.Dial(t.Context(), "ws://"+h.d.PushAddr()+"/ingest/devices/ws", &websocket.DialOptions{HTTPHeader: hdr})
		if err != nil {
			t.Fatalf("%s: dial: %v", dev, err)
		}
		for n := range each {
			id := fmt.Sprintf("%s-%d", dev, n)
			msg := fmt.Sprintf(`{"schema_version":1,"event_id":%q,"type":"flow","ts":%q,"session_id":"boot-1","device_id":%q,"payload":{"l_min":%d}}`,
				id, base.Add(time.Duration(n)*time.Second).Format(time.RFC3339), dev, n)
			sent[id] = msg
			if err := conn.Write(t.Context(), websocket.MessageText, []byte(msg)); err != nil {
				t.Fatalf("%s: send: %v", dev, err)
			}
		}
		for range each {
			_, b, err := conn.Read(t.Context())
			if err != nil {
				t.Fatalf("%s: read an answer: %v", dev, err)
			}
			var a struct {
				EventID string `json:"event_id"`
				Status  string `json:"status"`
			}
			if err := json.Unmarshal(b, &a); err != nil || a.Status != "stored" {
				t.Fatalf("%s: answer %s (%v), want stored", dev, b, err)
			}
		}
		if v := metric(t, h.d.Registry(), "ingestor_push_devices_connected", "source", "devices"); v != 1 {
			t.Errorf("devices connected = %v, want 1", v)
		}
		if err := conn.Close(websocket.StatusNormalClosure, ""); err != nil {
			t.Errorf("%s: close: %v", dev, err)
		}
	}
	testsync.WaitFor(t, "the processor to receive every envelope", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == len(sent)
	})
	mu.Lock()
	defer mu.Unlock()
	for id, msg := range sent {
		var n int
		if _, err := fmt.Sscanf(id[len("pump-1-"):], "%d", &n); err != nil {
			t.Fatal(err)
		}
		if g := seen[id]; g.payload != msg || !g.at.Equal(base.Add(time.Duration(n)*time.Second)) {
			t.Errorf("event %s: payload %q at %v, want %q at %v", id, g.payload, g.at, msg, base.Add(time.Duration(n)*time.Second))
		}
	}
	if v := metric(t, h.d.Registry(), "ingestor_source_events_total", "source", "devices"); v != 2*each {
		t.Errorf("ingestor_source_events_total{source=devices} = %v, want %d", v, 2*each)
	}
	if v := metric(t, h.d.Registry(), "ingestor_push_device_envelopes_total", "source", "devices", "device", "pump-2", "status", "stored"); v != each {
		t.Errorf("envelopes of pump-2 = %v, want %d", v, each)
	}
}

// TestDocsDeviceExample runs the Go device of docs/push.md's "Devices
// over WebSocket" section, as written there, against a daemon: it prints
// the "stored" answer and the envelope is counted for its device.
func TestDocsDeviceExample(t *testing.T) {
	code := docBlock(t, "../../docs/push.md", "## Devices over WebSocket (`kind = \"ws_ingress\"`)", "go")
	// Inside the module, so that the program builds with its go.mod; a
	// directory starting with "_" is ignored by ./... patterns.
	dir, err := os.MkdirTemp(".", "_docs-device-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Error(err)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(code+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const token = "pump-1-token-0123456789"
	h := startDevices(t, "pump-1 "+token+"\n")
	cmd := exec.Command("go", "run", "./"+filepath.Join(dir, "main.go"))
	cmd.Env = append(os.Environ(), "INGEST_URL=ws://"+h.d.PushAddr()+"/ingest/devices/ws", "DEVICE_TOKEN="+token)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run the docs device: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `{"event_id":"pump-1-boot-7-000042","status":"stored","ack_ts":`) {
		t.Fatalf("the docs device printed %s, want its stored answer", out)
	}
	if v := metric(t, h.d.Registry(), "ingestor_push_device_envelopes_total", "source", "devices", "device", "pump-1", "status", "stored"); v != 1 {
		t.Errorf("envelopes of pump-1 = %v, want 1", v)
	}
}

// TestSilentDevicesAreForgotten: with device_retention "2s", a device that
// sent seqs 1 and 3 (2 missing) and then nothing is forgotten by the
// daemon (its unreported seq logged), while a device that keeps sending
// stays tracked; the forgotten one, back with seq 9, starts again with no
// gap or reset reported. Before, every device kept its row for good.
func TestSilentDevicesAreForgotten(t *testing.T) {
	h := startDaemon(t, "", "prune_interval = \"100ms\"\n", `
[push]
addr = "127.0.0.1:0"

[source.devices]
kind = "ws_ingress"
token = "fleet-token-0123456789"
seq_gap_grace = "1s"
device_retention = "2s"
`)
	h.startProcessor(func(context.Context, *processor.Event) error { return nil })
	hdr := http.Header{"Authorization": {"Bearer fleet-token-0123456789"}}
	conn, _, err := websocket.Dial(t.Context(), "ws://"+h.d.PushAddr()+"/ingest/devices/ws", &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow() //nolint:errcheck // the test's end
	n := 0
	send := func(dev string, seq int) {
		t.Helper()
		n++
		msg := fmt.Sprintf(`{"schema_version":1,"event_id":"e-%d","type":"t","ts":"2026-11-28T10:00:00Z","session_id":"s","device_id":%q,"seq":%d,"payload":{}}`, n, dev, seq)
		if err := conn.Write(t.Context(), websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, b, err := conn.Read(t.Context()); err != nil || !strings.Contains(string(b), `"stored"`) {
			t.Fatalf("answer %s, %v; want stored", b, err)
		}
	}
	send("gone", 1)
	send("gone", 3)
	tracked := func() int64 {
		s, err := h.d.Queue().DeviceSeqs(t.Context(), "devices", 10)
		if err != nil {
			t.Fatal(err)
		}
		return s.Devices
	}
	seq := 0
	testsync.WaitFor(t, "the silent device forgotten", 30*time.Second, func() bool {
		seq++
		send("live", seq) // the live device keeps sending
		return tracked() == 1
	})
	if s, err := h.d.Queue().DeviceSeqs(t.Context(), "devices", 10); err != nil || len(s.Notable) != 0 {
		t.Errorf("devices after forgetting = %+v, %v; want the live one only, with nothing notable", s, err)
	}

	// Logged once ForgetDevices has returned, which may be just after the
	// row is seen gone.
	testsync.WaitFor(t, "the forgotten device's missing seq 2 logged", 10*time.Second, func() bool {
		return strings.Contains(h.logs.String(), "unreported_seqs=1")
	})
	send("gone", 9)
	if s, err := h.d.Queue().DeviceSeqs(t.Context(), "devices", 10); err != nil || s.Devices != 2 || len(s.Notable) != 0 {
		t.Errorf("after the forgotten device came back: %+v, %v; want 2 devices, no gap or reset", s, err)
	}
	// Everything acked, so that the shutdown has nothing to wait for.
	testsync.WaitFor(t, "the queue empty", 30*time.Second, func() bool { return h.d.Queue().PendingEvents() == 0 })
}
