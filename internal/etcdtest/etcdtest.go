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

const (
	// readyTimeout bounds how long Start and Restart wait for the server
	// to report itself healthy.
	readyTimeout = 30 * time.Second
	// stopTimeout bounds how long Stop waits after SIGTERM before SIGKILL.
	stopTimeout = 10 * time.Second
	// pollInterval is how often health is checked.
	pollInterval = 20 * time.Millisecond
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
	s.svc = testsync.NewService(t, "etcdtest", stopTimeout, s.launch, func(p *testsync.Process) error {
		if err := waitHealthy(s.Endpoint, p); err != nil {
			return fmt.Errorf("%s on %s: %w", s.bin, s.clientAddr, err)
		}
		return nil
	})
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

// waitHealthy polls etcd's /health until it reports true, the process
// exits, or readyTimeout passes.
func waitHealthy(endpoint string, p *testsync.Process) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var last error
	for {
		resp, err := client.Get(endpoint + "/health")
		if err == nil {
			var body []byte
			body, err = io.ReadAll(io.LimitReader(resp.Body, 4096))
			err = errors.Join(err, resp.Body.Close())
			if err == nil && strings.Contains(string(body), `"health":"true"`) {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("%s: %s", resp.Status, body)
			}
		}
		last = err
		select {
		case <-p.Done():
			return fmt.Errorf("exited during startup: %v", p.Err())
		case <-deadline.C:
			return fmt.Errorf("not healthy after %v: %w", readyTimeout, last)
		case <-tick.C:
		}
	}
}

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
