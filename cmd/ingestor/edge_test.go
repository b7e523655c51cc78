package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/edge"
	"github.com/ingestorhq/ingestor/internal/edge/edgeconfig"
)

// TestEdgeHelp checks that `ingestor edge -h` prints the forwarder's
// usage, every flag included, on stdout and exits 0.
func TestEdgeHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"edge", "-h"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	for _, want := range []string{"usage:", "ingestor edge -c FILE", "ingestor edge status", "Nothing\naccepted is lost",
		"-url URL", "-token-file file", "-token-env NAME", "-device-id id", "-outbox file", "-max-outbox-bytes n",
		"-http address", "-socket path", "-stdin", "-metrics address", "-window n", "-ca-file file", "-ack-timeout d", "-reconnect-base d", "-reconnect-max d"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	run([]string{"-h"}, &out, &errb)
	if !strings.Contains(out.String(), "ingestor edge status") {
		t.Errorf("ingestor -h does not list edge:\n%s", out.String())
	}
}

// TestEdgeRefusesBadSettings checks the errors of a forwarder that cannot
// start, and that the token is never printed.
func TestEdgeRefusesBadSettings(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("device-secret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"edge", "-url", "http://x", "-token-file", tokenFile, "-http", "0.0.0.0:9470", "-outbox", filepath.Join(dir, "o.db")}, &out, &errb)
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	for _, want := range []string{"url: must be a ws:// or wss:// URL", "device_id: is required", `http: must be a loopback address such as "127.0.0.1:9470", not "0.0.0.0:9470"`} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
	if strings.Contains(errb.String(), "device-secret-token") {
		t.Errorf("the token is printed:\n%s", errb.String())
	}
	errb.Reset()
	cfg := filepath.Join(dir, "edge.toml")
	if err := os.WriteFile(cfg, []byte("[edge]\nurl = \"ws://127.0.0.1:1/ingest/d/ws\"\ndevice_id = \"d\"\nstdin = true\ntoken = \"${UNSET_EDGE_TOKEN}\"\nbogus = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"edge", "-c", cfg}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "edge.toml:5: edge.token: environment variable UNSET_EDGE_TOKEN is not set") ||
		!strings.Contains(errb.String(), "edge.toml:6: edge.bogus: unknown key") {
		t.Errorf("exit %d, stderr:\n%s", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"edge", "-url", "ws://127.0.0.1:1/ingest/d/ws", "-device-id", "d", "-stdin"}, &out, &errb); code != 2 ||
		!strings.Contains(errb.String(), "token: is required (the daemon answers 401 without it)") ||
		!strings.Contains(errb.String(), "-token-file or -token-env gives the token") {
		t.Errorf("no token: exit %d, stderr:\n%s", code, errb.String())
	}
}

// TestEdgeStatus stores an event with a forwarder whose daemon is
// unreachable, then reads the backlog with `ingestor edge status`, by
// -outbox and by -c.
func TestEdgeStatus(t *testing.T) {
	dir := t.TempDir()
	outbox := filepath.Join(dir, "outbox.db")
	ctx, cancel := context.WithCancel(context.Background())
	f, err := edge.Start(ctx, edge.Options{Config: edgeconfig.Config{URL: "ws://127.0.0.1:1/ingest/devices/ws", Token: "t", DeviceID: "d",
		Outbox: outbox, HTTPAddr: "127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+f.HTTPAddr()+"/events", "application/json", strings.NewReader(`{"type":"t","payload":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil || resp.StatusCode != 200 {
		t.Fatalf("post: %d %v", resp.StatusCode, err)
	}
	cancel()
	if err := f.Wait(); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"edge", "status", "-outbox", outbox}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "pending:       1 events") || !strings.Contains(out.String(), "dead letters:  0") {
		t.Errorf("status:\n%s", out.String())
	}
	cfg := filepath.Join(dir, "edge.toml")
	if err := os.WriteFile(cfg, []byte("[edge]\nurl = \"ws://127.0.0.1:1/ingest/d/ws\"\ndevice_id = \"d\"\nstdin = true\ntoken = \"${UNSET_EDGE_TOKEN}\"\noutbox = \""+outbox+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{"edge", "status", "-c", cfg}, &out, &errb); code != 0 || !strings.Contains(out.String(), "pending:       1 events") {
		t.Errorf("status -c: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if code := run([]string{"edge", "status", "-outbox", filepath.Join(dir, "none.db")}, &out, &errb); code != 1 {
		t.Errorf("status of a missing outbox: exit %d", code)
	}
}

// TestEdgeSettings checks how the -c file and the flags combine: the
// file's keys, each flag given overriding its key, the token from
// -token-env, and stdin only when asked for.
func TestEdgeSettings(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.toml")
	if err := os.WriteFile(cfg, []byte(`[edge]
url = "ws://127.0.0.1:9465/ingest/devices/ws"
token = "${TEST_EDGE_TOKEN}"
device_id = "from-file"
outbox = "/var/lib/edge/outbox.db"
http = "127.0.0.1:9470"
window = 8
ack_timeout = "5s"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_EDGE_TOKEN", "file-token")
	t.Setenv("OTHER_EDGE_TOKEN", "env-token")
	stdin := strings.NewReader("")
	var out, errb bytes.Buffer
	o, _, code := edgeSettings([]string{"-c", cfg, "-device-id", "from-flag", "-stdin", "-token-env", "OTHER_EDGE_TOKEN", "-reconnect-max", "2s"}, stdin, &out, &errb)
	if code != -1 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if o.URL != "ws://127.0.0.1:9465/ingest/devices/ws" || o.DeviceID != "from-flag" || o.Token != "env-token" ||
		o.Outbox != "/var/lib/edge/outbox.db" || o.HTTPAddr != "127.0.0.1:9470" || o.Window != 8 ||
		o.AckTimeout != 5*time.Second || !o.Stdin || o.StdinReader != stdin || o.MaxOutboxBytes != edgeconfig.DefaultMaxOutboxBytes ||
		o.ReconnectMax != 2*time.Second || o.ReconnectBase != edgeconfig.DefaultReconnectBase {
		t.Errorf("options = %+v", o)
	}
	o, _, code = edgeSettings([]string{"-c", cfg}, stdin, &out, &errb)
	if code != -1 || o.Token != "file-token" || o.DeviceID != "from-file" || o.Stdin {
		t.Errorf("file only: exit %d, options %+v", code, o)
	}
	o, _, code = edgeSettings([]string{"-url", "wss://h/ingest/d/ws", "-token-env", "OTHER_EDGE_TOKEN", "-device-id", "d", "-socket", filepath.Join(dir, "s")}, stdin, &out, &errb)
	if code != -1 || o.URL != "wss://h/ingest/d/ws" || o.Outbox != edgeconfig.DefaultOutbox || o.Socket == "" || o.Window != edgeconfig.DefaultWindow {
		t.Errorf("flags only: exit %d, options %+v (%s)", code, o, errb.String())
	}
}
