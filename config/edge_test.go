package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/edge/edgeconfig"
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
	want := &Edge{File: filepath.Join(edgeTestdata, "minimal.good.toml"), Config: edgeconfig.Config{
		URL: "wss://ingest.example.com/ingest/devices/ws", Token: "s3cret-token", DeviceID: "dev-1", Outbox: "./edge/outbox.db",
		MaxOutboxBytes: 256 << 20, MaxEnvelopeBytes: 1 << 20, Stdin: true, Window: 64, AckTimeout: 30 * time.Second,
		ReconnectBase: 500 * time.Millisecond, ReconnectMax: 30 * time.Second},
		Telemetry: Telemetry{Protocol: "grpc", SamplingRatio: 1, ServiceName: "ingestor", ExportTimeout: 10 * time.Second}}
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
	if e.Token != "t0ken" || e.HTTPAddr != "127.0.0.1:9470" || e.DeviceID != "sensor-0042" {
		t.Errorf("example = %+v", e)
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[edgeconfig.Config]()) {
		key := f.Tag.Get("toml")
		if !strings.Contains(EdgeExampleTOML, "\n"+key+" = ") && !strings.Contains(EdgeExampleTOML, "\n# "+key+" = ") {
			t.Errorf("edge.example.toml does not document %s", key)
		}
	}
}

// TestEdgeNoInputHidesNoKey checks that the problem of the [edge] table
// itself (no input) does not hide those of its keys.
func TestEdgeNoInputHidesNoKey(t *testing.T) {
	data := "[edge]\nurl = \"ws://127.0.0.1:9465/ingest/d/ws\"\ntoken = \"t\"\ndevice_id = \"d\"\nack_timeout = \"soon\"\nreconnect_base = \"1m\"\nreconnect_max = \"1s\"\n"
	_, err := ParseEdgeWithEnv("edge.toml", []byte(data), envOf(nil))
	for _, want := range []string{
		`edge.toml:1: edge: no input: set http, socket or stdin = true`,
		`edge.toml:5: edge.ack_timeout: must be a duration such as "500ms", "30s" or "1m30s", not "soon"`,
		`edge.toml:7: edge.reconnect_max: 1s is less than reconnect_base 1m0s`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
}

// sqlitePackage is the import path of the SQLite driver, which only the
// forwarder's outbox and the daemon's queue need.
const sqlitePackage = "github.com/mattn/go-sqlite3"

// TestConfigImportsNoSQLite keeps SQLite out of the config package, which
// reading the edge forwarder's file needs: it walks the imports of config
// as `go list -deps` reports them and fails naming the path from config to
// the SQLite driver. (The edge options once lived in internal/edge, whose
// outbox is SQLite.)
func TestConfigImportsNoSQLite(t *testing.T) {
	const root = "github.com/ingestorhq/ingestor/config"
	// The go command of the toolchain that built this test.
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.CommandContext(t.Context(), goCmd, "list", "-deps", "-json=ImportPath,Imports", root).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", root, err)
	}
	imports := map[string][]string{}
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list -deps %s: %v", root, err)
		}
		imports[p.ImportPath] = p.Imports
	}
	// The walk must find what config does import, or it proves nothing.
	if importPath(imports, root, "github.com/BurntSushi/toml") == nil {
		t.Fatalf("go list -deps %s: no path to github.com/BurntSushi/toml in %d packages", root, len(imports))
	}
	if chain := importPath(imports, root, sqlitePackage); chain != nil {
		t.Errorf("config imports SQLite: %s", strings.Join(chain, " -> "))
	}
}

// importPath returns the shortest chain of imports from one package to
// another (or to a package below it), or nil when there is none.
func importPath(imports map[string][]string, from, to string) []string {
	prev := map[string]string{from: ""}
	for queue := []string{from}; len(queue) > 0; queue = queue[1:] {
		pkg := queue[0]
		if pkg == to || strings.HasPrefix(pkg, to+"/") {
			var chain []string
			for p := pkg; p != ""; p = prev[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, imp := range imports[pkg] {
			if _, seen := prev[imp]; !seen {
				prev[imp] = pkg
				queue = append(queue, imp)
			}
		}
	}
	return nil
}
