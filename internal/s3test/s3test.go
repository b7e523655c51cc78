// Package s3test runs a real S3-compatible server (versitygw with a posix
// backend in a temporary directory) for tests that exercise S3 code paths.
//
// `make test` installs the pinned server into the project's .tools
// directory and points $VERSITYGW at it; by hand:
//
//	go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
//
// Without it, Start fails the test: a test that skipped for a missing
// server would hide the S3 path.
package s3test

import (
	"context"
	"fmt"
	"go/build"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// Version is the versitygw release the tests run against; the Makefile's
// VERSITYGW_VERSION installs the same one.
const Version = "v1.8.0"

// installHint tells how to get the server binary.
const installHint = "run make test, which installs it, or go install github.com/versity/versitygw/cmd/versitygw@" + Version + " (or set $VERSITYGW to its path)"

// Server is a running versitygw with one empty bucket. Its fields are
// fixed for its lifetime, across Stop and Restart.
type Server struct {
	// Endpoint is the server's base URL, http://127.0.0.1:PORT.
	Endpoint string
	// Bucket is the bucket Start created.
	Bucket string
	// AccessKey is the root user's access key ID.
	AccessKey string
	// SecretKey is the root user's secret access key.
	SecretKey string
	// Region is the region the server answers for.
	Region string

	t    testing.TB
	bin  string
	addr string
	dir  string

	client *s3.Client
	svc    *testsync.Service
}

// Start runs a server on a free loopback port with a fresh data directory,
// waits until it answers, creates a bucket and registers a cleanup that
// stops the server.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := findBinary()
	if err != nil {
		t.Fatalf("s3test: %v; install it: %s", err, installHint)
	}
	s := &Server{
		Bucket:    "ingestor-test",
		AccessKey: "ingestor-test-access",
		SecretKey: "ingestor-test-secret",
		Region:    "us-east-1",
		t:         t,
		bin:       bin,
		dir:       t.TempDir(),
	}
	s.svc = testsync.NewService(t, "s3test: "+bin, s.launch, s.answers)
	t.Cleanup(s.Stop)

	// The port is free when chosen but may be taken before the server binds
	// it, so a server that exits during startup is retried on a new port.
	var lastErr error
	for range 3 {
		addr := testsync.FreePort(t)
		s.addr = addr
		s.Endpoint = "http://" + addr
		if lastErr = s.svc.Start(); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("s3test: %v", lastErr)
	}

	s.client = s3.New(s3.Options{
		Region:       s.Region,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
	})
	ctx, cancel := context.WithTimeout(context.Background(), testsync.ServiceReadyTimeout)
	defer cancel()
	if _, err := s.client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(s.Bucket)}); err != nil {
		t.Fatalf("s3test: create bucket %q on %s: %v", s.Bucket, s.Endpoint, err)
	}
	return s
}

// Client returns an S3 client for the server with the root credentials and
// path-style addressing, for assertions.
func (s *Server) Client() *s3.Client { return s.client }

// SetEnv points the default AWS credential chain at the server with
// t.Setenv: access key, secret key and region, with shared config files and
// instance metadata disabled so the developer's own AWS setup cannot leak
// in. Like t.Setenv it cannot be used in parallel tests.
func (s *Server) SetEnv(t testing.TB) {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", s.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s.SecretKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_REGION", s.Region)
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

// Stop terminates the server with SIGTERM and waits for it to exit,
// killing it if it does not exit in time. The data directory is kept, so
// Restart brings the same objects back. Stop on a stopped server does
// nothing.
func (s *Server) Stop() { s.svc.Stop() }

// Restart stops the server if it is running and starts it again on the same
// port with the same data directory, waiting until it answers.
func (s *Server) Restart() {
	s.t.Helper()
	s.svc.Restart()
}

// launch starts the binary on s.addr.
func (s *Server) launch() (*testsync.Process, error) {
	cmd := exec.Command(s.bin,
		"--port", s.addr,
		"--access", s.AccessKey,
		"--secret", s.SecretKey,
		"--region", s.Region,
		"--quiet",
		"posix", s.dir)
	cmd.Env = serverEnv()
	return testsync.StartProcess(cmd)
}

// answers reports whether the server answers HTTP on s.addr, with any
// response.
func (s *Server) answers() error {
	resp, err := probeClient.Get(s.Endpoint + "/")
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// probeClient probes a starting server.
var probeClient = &http.Client{Timeout: time.Second}

// serverEnv is the environment for the server process: the test's own,
// minus the variables that would override the command-line flags.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "VGW_") || strings.HasPrefix(name, "ROOT_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// findBinary looks for versitygw in $VERSITYGW, then $PATH, then the
// project's .tools directory where make test-deps installs it, then the bin
// directories that go install writes to.
func findBinary() (string, error) {
	if p := os.Getenv("VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$VERSITYGW: %w", err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	var dirs []string
	// go env reports GOBIN and GOPATH also when they were set with go env -w.
	if out, err := exec.Command("go", "env", "GOMOD", "GOBIN", "GOPATH").Output(); err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) == 3 {
			if gomod := strings.TrimSpace(lines[0]); gomod != "" && gomod != os.DevNull {
				dirs = append(dirs, filepath.Join(filepath.Dir(gomod), ".tools", "versitygw-"+Version))
			}
			if gobin := strings.TrimSpace(lines[1]); gobin != "" {
				dirs = append(dirs, gobin)
			}
			for _, gp := range filepath.SplitList(strings.TrimSpace(lines[2])) {
				dirs = append(dirs, filepath.Join(gp, "bin"))
			}
		}
	}
	for _, gp := range filepath.SplitList(build.Default.GOPATH) {
		dirs = append(dirs, filepath.Join(gp, "bin"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "versitygw")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("versitygw not found in $VERSITYGW, $PATH or %s", strings.Join(dirs, ", "))
}
