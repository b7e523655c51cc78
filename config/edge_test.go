package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const edgeTestdata = "../testdata/config/edge"

// parseEdgeFile parses a file under testdata/config/edge.
func parseEdgeFile(t *testing.T, name string, env map[string]string) (*Edge, error) {
	t.Helper()
	path := filepath.Join(edgeTestdata, name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return ParseEdgeWithEnv(path, data, envOf(env))
}

func TestEdgeGoodFiles(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(edgeTestdata, "*.good.toml"))
	if err != nil || len(files) != 1 {
		t.Fatalf("good files %v (%v): add each to this test", files, err)
	}
	e, err := parseEdgeFile(t, "minimal.good.toml", map[string]string{"EDGE_TOKEN": "s3cret-token"})
	if err != nil {
		t.Fatal(err)
	}
	want := &Edge{File: filepath.Join(edgeTestdata, "minimal.good.toml"), URL: "wss://ingest.example.com/ingest/devices/ws",
		Token: "s3cret-token", DeviceID: "dev-1", Outbox: "./edge/outbox.db", MaxOutboxBytes: 256 << 20,
		MaxEnvelopeBytes: 1 << 20, Stdin: true, Window: 64, AckTimeout: 30 * time.Second,
		ReconnectBase: 500 * time.Millisecond, ReconnectMax: 30 * time.Second}
	if !reflect.DeepEqual(e, want) {
		t.Errorf("got  %+v\nwant %+v", e, want)
	}
}

func TestEdgeBadFiles(t *testing.T) {
	tests := map[string][]string{
		"many.bad.toml": {
			`many.bad.toml:2: edge.url: must be a ws:// or wss:// URL such as "wss://ingest.example.com:9465/ingest/NAME/ws", not "http://ingest.example.com/ingest/devices/ws"`,
			`many.bad.toml:3: edge.token: the token must be printable ASCII without spaces (it is sent in an HTTP header)`,
			`many.bad.toml:4: edge.device_id: is required: it fills the device_id of every event that has none`,
			`many.bad.toml:5: edge.http: must be a loopback address such as "127.0.0.1:9470", not "0.0.0.0:9470": the HTTP input has no authentication`,
			`many.bad.toml:6: edge.window: must be between 1 and 10000, not 0`,
			`many.bad.toml:7: edge.ack_timeout: must be a duration such as "500ms", "30s" or "1m30s", not "soon"`,
			`many.bad.toml:8: edge.max_outbox_bytes: must be at least 1048576, not 10`,
			`many.bad.toml:9: edge.colour: unknown key`,
			`many.bad.toml:11: daemon: unknown key`,
		},
		"token.bad.toml": {
			`token.bad.toml:4: edge.token_file: set edge.token or edge.token_file, not both`,
			`token.bad.toml:8: edge.reconnect_max: 1s is less than reconnect_base 1m0s`,
		},
		"missing.bad.toml": {
			`missing.bad.toml:1: edge: no input: set http, socket or stdin = true`,
			`missing.bad.toml:1: edge.url: is required, e.g. "ws://127.0.0.1:9465/ingest/NAME/ws"`,
			`missing.bad.toml:1: edge.token: is required (the daemon answers 401 without it)`,
			`missing.bad.toml:3: edge.metrics: must be host:port such as "127.0.0.1:9466", not "9466"`,
		},
	}
	checkTestdata(t, "edge/*.bad.toml", tests)
	for name, wants := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := parseEdgeFile(t, name, map[string]string{"EDGE_TOKEN": "secret-from-env"})
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("err = %v, want Errors", err)
			}
			if len(errs) != len(wants) {
				t.Errorf("%d errors, want %d:\n%v", len(errs), len(wants), err)
			}
			for _, w := range wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing %q in:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), "secret-from-env") {
				t.Errorf("an error shows the token from the environment:\n%v", err)
			}
		})
	}
}

// TestEdgeExampleLoads keeps edge.example.toml valid and complete: every
// key of [edge] is in it.
func TestEdgeExampleLoads(t *testing.T) {
	e, err := ParseEdgeWithEnv("edge.example.toml", []byte(EdgeExampleTOML), envOf(map[string]string{"EDGE_TOKEN": "t0ken"}))
	if err != nil {
		t.Fatal(err)
	}
	if e.Token != "t0ken" || e.HTTP != "127.0.0.1:9470" || e.DeviceID != "sensor-0042" {
		t.Errorf("example = %+v", e)
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[edgeTOML]()) {
		key := f.Tag.Get("toml")
		if !strings.Contains(EdgeExampleTOML, "\n"+key+" = ") && !strings.Contains(EdgeExampleTOML, "\n# "+key+" = ") {
			t.Errorf("edge.example.toml does not document %s", key)
		}
	}
}
