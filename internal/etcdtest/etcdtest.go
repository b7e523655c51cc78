// Package etcdtest runs a real etcd server (Debian's etcd-server, 3.4) on
// loopback for the cluster tests, with its data in a temporary directory.
//
// `make test` installs it (apt-get install etcd-server); by hand, the same
// package, or any etcd 3.4+ binary in $ETCD or $PATH. Without it, Start
// fails the test: a cluster test that skipped for a missing server would
// hide the cluster path.
package etcdtest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// Server is a running single-node etcd. Its endpoint and data directory
// are fixed for its lifetime, across Stop and Restart.
type Server struct {
	// Endpoint is the client URL, http://127.0.0.1:PORT.
	Endpoint string

	t          testing.TB
	bin        string
	dir        string
	clientAddr string
	peerAddr   string
	svc        *testsync.Service
}

// Start runs an etcd on free loopback ports with a fresh data directory,
// waits until it is healthy, and registers a cleanup that stops it.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := findBinary()
	if err != nil {
		t.Fatalf("etcdtest: %v; install it: run make test, which installs it, or apt-get install etcd-server (or set $ETCD to its path)", err)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	s.svc = testsync.NewService(t, "etcdtest: "+bin, s.launch, s.healthy)
	t.Cleanup(s.Stop)
	// The ports are free when chosen but may be taken before etcd binds
	// them, so a server that exits during startup is retried on new ones.
	var lastErr error
	for range 3 {
		s.clientAddr, s.peerAddr = testsync.FreePort(t), testsync.FreePort(t)
		s.Endpoint = "http://" + s.clientAddr
		if lastErr = s.svc.Start(); lastErr == nil {
			return s
		}
		if err := os.RemoveAll(s.dir); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("etcdtest: %v", lastErr)
	return nil
}

// Stop terminates the server with SIGTERM and waits for it to exit,
// killing it if it does not exit in time. The data directory is kept, so
// Restart brings the same keys back. etcd renews every lease to its full
// TTL when it starts (a new leader does), so a lease outlives an outage by
// up to its TTL: a member must judge its own lease from its keepalives,
// not from etcd's view. Stop on a stopped server does nothing.
func (s *Server) Stop() { s.svc.Stop() }

// Restart stops the server if it is running and starts it again on the
// same ports with the same data directory, waiting until it is healthy.
func (s *Server) Restart() {
	s.t.Helper()
	s.svc.Restart()
}

// launch starts etcd on s's ports.
func (s *Server) launch() (*testsync.Process, error) {
	peer := "http://" + s.peerAddr
	cmd := exec.Command(s.bin,
		"--name", "etcdtest",
		"--data-dir", s.dir,
		"--listen-client-urls", s.Endpoint,
		"--advertise-client-urls", s.Endpoint,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "etcdtest="+peer,
		"--logger", "zap",
		"--log-level", "error")
	cmd.Env = serverEnv()
	return testsync.StartProcess(cmd)
}

// healthy reports whether etcd's /health says it is healthy.
func (s *Server) healthy() error {
	resp, err := probeClient.Get(s.Endpoint + "/health")
	if err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err = errors.Join(err, resp.Body.Close()); err != nil {
		return err
	}
	if !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	return nil
}

// probeClient probes a starting etcd.
var probeClient = &http.Client{Timeout: time.Second}

// serverEnv is the environment for etcd: the test's own, minus ETCD_*
// variables, which etcd reads as flags.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") && !strings.HasPrefix(kv, "ETCDCTL_") {
			env = append(env, kv)
		}
	}
	return env
}

// findBinary looks for etcd in $ETCD, then $PATH.
func findBinary() (string, error) {
	if p := os.Getenv("ETCD"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$ETCD: %w", err)
		}
		return p, nil
	}
	p, err := exec.LookPath("etcd")
	if err != nil {
		return "", errors.New("etcd not found in $ETCD or $PATH")
	}
	return p, nil
}
