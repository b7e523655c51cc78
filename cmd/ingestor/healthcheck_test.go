package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestHealthcheckRunningDaemon runs `ingestor healthcheck` against a real
// daemon's ops listener, as the image's HEALTHCHECK does: 200 on /healthz
// exits 0.
func TestHealthcheckRunningDaemon(t *testing.T) {
	dir := t.TempDir()
	cfg, err := config.Parse("healthcheck.toml", []byte(daemonTOML(dir, "127.0.0.1:0",
		"tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t), "", "")))
	if err != nil {
		t.Fatal(err)
	}
	d, _ := startInProcess(t, cfg)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"healthcheck", "--addr", d.HTTPAddr()}, &stdout, &stderr); code != 0 {
		t.Fatalf("healthcheck of a running daemon = %d, want 0; stderr:\n%s", code, stderr.String())
	}
}

// TestHealthcheckFailures checks that every answer but 200, and no answer,
// exits 1 naming what went wrong, and that bad arguments exit 2.
func TestHealthcheckFailures(t *testing.T) {
	var (
		mu    sync.Mutex
		paths []string
	)
	unhealthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		http.Error(w, "draining", http.StatusServiceUnavailable)
	}))
	defer unhealthy.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"503", []string{"--addr", unhealthy.Listener.Addr().String()}, 1, "503 Service Unavailable"},
		{"nothing listening", []string{"--addr", closedAddr}, 1, "connection refused"},
		{"not host:port", []string{"--addr", "localhost"}, 2, "host:port"},
		{"extra argument", []string{"--addr", "127.0.0.1:9464", "now"}, 2, "unexpected argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"healthcheck"}, tc.args...), &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("healthcheck %q = %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 || paths[0] != "/healthz" {
		t.Errorf("requested paths %q, want [/healthz]", paths)
	}
}
