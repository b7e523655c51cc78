package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/ingestorhq/ingestor/internal/curvekey"
	"github.com/ingestorhq/ingestor/internal/telemetry/otlptest"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/wire"
	"github.com/ingestorhq/ingestor/processor"
)

func TestParseFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if want := (config{connect: "tcp://127.0.0.1:5557", ack: "tcp://127.0.0.1:5558", logEvery: 2 * time.Second, logFormat: "text", workers: 1, cluster: "ingestor",
		retention: processor.DefaultDedupeRetention, otlpProtocol: "grpc"}); c != want {
		t.Errorf("defaults = %+v, want %+v", c, want)
	}
	c, err = parseFlags([]string{"-fail-keys", "^bad", "-sqlite", "x.db", "-workers", "3", "-drop-acks", "0.5", "-retention", "48h"}, io.Discard)
	if err != nil || c.failKeys.String() != "^bad" || c.failRetryableKeys != nil || c.sqlite != "x.db" || c.workers != 3 || c.dropAcks != 0.5 ||
		c.retention != 48*time.Hour {
		t.Errorf("parseFlags = %+v, %v", c, err)
	}
	_, err = parseFlags([]string{"-curve-server-key", "daemon.pub", "-log-every", "0s", "-log-format", "xml", "-workers", "0", "-drop-acks", "2", "-fail-retryable-keys", "(", "extra"}, io.Discard)
	for _, want := range []string{`unexpected arguments ["extra"]`, "-log-every must be positive, not 0s", `-log-format must be text or json, not "xml"`,
		"-workers must be at least 1, not 0", "-drop-acks must be between 0 and 1, not 2", "-fail-retryable-keys: error parsing regexp",
		"-curve-server-key and -curve-secret-key go together"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not contain %q", err, want)
		}
	}
	c, err = parseFlags([]string{"-etcd", "https://etcd-0:2379,https://etcd-1:2379", "-cluster", "prod", "-etcd-ca", "ca.crt", "-etcd-cert", "tls.crt", "-etcd-key", "tls.key"}, io.Discard)
	if err != nil || c.etcd != "https://etcd-0:2379,https://etcd-1:2379" || c.cluster != "prod" || c.etcdCA != "ca.crt" || c.etcdCert != "tls.crt" || c.etcdKey != "tls.key" {
		t.Errorf("parseFlags with etcd's client certificate = %+v, %v", c, err)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"-etcd", "https://etcd-0:2379", "-etcd-cert", "tls.crt"}, "-etcd-cert and -etcd-key go together"},
		{[]string{"-etcd", "https://etcd-0:2379", "-etcd-key", "tls.key"}, "-etcd-cert and -etcd-key go together"},
		{[]string{"-etcd-cert", "tls.crt", "-etcd-key", "tls.key"}, "-etcd-ca, -etcd-cert and -etcd-key need -etcd"},
		{[]string{"-etcd-ca", "ca.crt"}, "-etcd-ca, -etcd-cert and -etcd-key need -etcd"},
		{[]string{"-otlp-endpoint", "collector:4317"}, "-otlp-endpoint must be http://HOST:PORT or https://HOST:PORT"},
		{[]string{"-otlp-endpoint", "http://collector:4317", "-otlp-protocol", "zipkin"}, "-otlp-protocol must be grpc or http/protobuf"},
		{[]string{"-gomaxprocs", "-1"}, "-gomaxprocs must not be negative, not -1"},
	} {
		if _, err := parseFlags(bad.args, io.Discard); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("parseFlags(%q) = %v, want an error with %q", bad.args, err, bad.want)
		}
	}
}

// TestGoMaxProcs checks the order of -gomaxprocs, $GOMAXPROCS and
// -workers up to the CPUs.
func TestGoMaxProcs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		cpus int
		env  string
		want int
	}{
		{nil, 2, "", 1},
		{[]string{"-workers", "4"}, 2, "", 2},
		{[]string{"-workers", "4"}, 8, "", 4},
		{[]string{"-workers", "4"}, 8, "3", 3},
		{nil, 8, "not a number", 1},
		{[]string{"-gomaxprocs", "6"}, 2, "3", 6},
	} {
		c, err := parseFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.goMaxProcs(tc.cpus, tc.env); got != tc.want {
			t.Errorf("%q with %d CPUs and GOMAXPROCS=%q: %d, want %d", tc.args, tc.cpus, tc.env, got, tc.want)
		}
	}
}

// TestDeployKubernetesProcessorArgs parses the args of the processors'
// Deployment in deploy/kubernetes/cluster, so that the manifest cannot
// name a flag the command does not have (internal/daemon
// TestDeployKubernetesCluster checks their values against the members').
func TestDeployKubernetesProcessorArgs(t *testing.T) {
	data, err := os.ReadFile("../../deploy/kubernetes/cluster/processor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	if err := yaml.UnmarshalStrict(data, &dep); err != nil {
		t.Fatalf("processor.yaml: %v", err)
	}
	cs := dep.Spec.Template.Spec.Containers
	if len(cs) != 1 || !slices.Equal(cs[0].Command, []string{"processor"}) {
		t.Fatalf("processor.yaml: want one container running processor, have %+v", cs)
	}
	c, err := parseFlags(cs[0].Args, io.Discard)
	if err != nil {
		t.Fatalf("processor.yaml: args %q: %v", cs[0].Args, err)
	}
	if c.etcd == "" || c.etcdCert == "" || c.curveSecretKey == "" {
		t.Errorf("processor.yaml: args %q: want -etcd with a client certificate, and CURVE", cs[0].Args)
	}
}

// TestRunPresentsEtcdClientCertificate runs the command with -etcd against
// a TLS listener that requires a client certificate from the test's CA,
// as etcd's --client-cert-auth does: the handshake sees the certificate of
// -etcd-cert, so the files reach the etcd client. A key file that is
// missing is an error naming it.
func TestRunPresentsEtcdClientCertificate(t *testing.T) {
	pki := testsync.NewPKI(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	key, err := x509.MarshalPKCS8PrivateKey(pki.Client.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(
		os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.Client.Certificate[0]}), 0o600),
		os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600)); err != nil {
		t.Fatal(err)
	}
	server, err := tls.LoadX509KeyPair(pki.ServerCertFile, pki.ServerKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{server},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pki.CAs, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	clients := make(chan string, 16)
	var accepting sync.WaitGroup
	accepting.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // the listener is closed
			}
			tc := conn.(*tls.Conn)
			if err := tc.HandshakeContext(t.Context()); err == nil && len(tc.ConnectionState().PeerCertificates) > 0 {
				select {
				case clients <- tc.ConnectionState().PeerCertificates[0].Subject.CommonName:
				default:
				}
			}
			if err := conn.Close(); err != nil {
				t.Log(err)
			}
		}
	})
	t.Cleanup(func() {
		if err := ln.Close(); err != nil {
			t.Error(err)
		}
		accepting.Wait()
	})

	endpoint := "https://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-etcd", endpoint, "-cluster", "prod", "-etcd-ca", pki.CAFile,
			"-etcd-cert", certFile, "-etcd-key", keyFile, "-log-every", "1h"}, io.Discard)
	}()
	select {
	case cn := <-clients:
		if cn != "test client" {
			t.Errorf("etcd's listener saw the client certificate of %q, want the test's client", cn)
		}
	case err := <-done:
		t.Fatalf("run returned before connecting to etcd: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no TLS handshake with a client certificate within 10s")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}

	missing := filepath.Join(dir, "missing.key")
	err = run(t.Context(), []string{"-etcd", endpoint, "-etcd-cert", certFile, "-etcd-key", missing}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-etcd "+endpoint) || !strings.Contains(err.Error(), missing) {
		t.Errorf("run with a missing -etcd-key: %v, want an error naming -etcd and %s", err, missing)
	}
}

// TestRunCountsAcksAndSummarises runs the command against a daemon played
// by the test on real ZeroMQ sockets.
func TestRunCountsAcksAndSummarises(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	var socks []*zmq.Socket
	t.Cleanup(func() {
		for _, s := range socks {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}
		if err := zctx.Term(); err != nil {
			t.Error(err)
		}
	})
	bind := func(typ zmq.Type) (*zmq.Socket, string) {
		s, err := zctx.NewSocket(typ)
		if err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
		for _, err := range []error{s.SetLinger(0), s.SetSndtimeo(10 * time.Second), s.SetRcvtimeo(10 * time.Second), s.Bind("tcp://127.0.0.1:*")} {
			if err != nil {
				t.Fatal(err)
			}
		}
		ep, err := s.GetLastEndpoint()
		if err != nil {
			t.Fatal(err)
		}
		return s, ep
	}
	push, endpoint := bind(zmq.PUSH)
	pull, ackEndpoint := bind(zmq.PULL)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs testsync.LockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-connect", endpoint, "-ack", ackEndpoint, "-log-every", "10ms", "-log-format", "json"}, &logs)
	}()

	var enc wire.Encoder
	enc.Begin(1, 2, "file://./data/raw")
	for i, src := range []string{"github", "hn", "github"} {
		ev := wire.Event{Key: src + string(rune('a'+i)), Source: src, Seq: int64(i + 1), FetchedAt: time.Now()}
		enc.Add(&ev, []byte(`{}`), true)
	}
	if _, err := push.SendBytes(enc.End(), 0); err != nil {
		t.Fatalf("send: %v", err)
	}
	data, err := pull.RecvBytes(0) // bounded by the receive timeout
	if err != nil {
		t.Fatalf("receive ack: %v", err)
	}
	if a, err := wire.DecodeAck(data); err != nil || len(a.Frames) != 1 || a.Frames[0] != 1 {
		t.Fatalf("ack = %s (%v), want frame 1 acked", data, err)
	}
	// Wait for a progress log that has seen the frame, then stop.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), `"msg":"progress","events_per_sec"`) || !strings.Contains(logs.String(), `"events":3`) {
		if time.Now().After(deadline) {
			t.Fatalf("no progress log with 3 events:\n%s", logs.String())
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancellation")
	}

	var summary struct {
		Msg          string           `json:"msg"`
		Events       int64            `json:"events"`
		Sources      map[string]int64 `json:"sources"`
		Acked        int64            `json:"acked"`
		Redeliveries int64            `json:"redeliveries"`
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &summary); err != nil {
		t.Fatalf("last log line %q: %v", lines[len(lines)-1], err)
	}
	if summary.Msg != "summary" || summary.Events != 3 || summary.Acked != 3 || summary.Redeliveries != 1 ||
		summary.Sources["github"] != 2 || summary.Sources["hn"] != 1 {
		t.Errorf("summary = %+v, want 3 events (github 2, hn 1), 3 acked, 1 redelivery", summary)
	}
}

// fakeDaemon binds the daemon's two sockets on free loopback ports, after
// applying setup to each.
func fakeDaemon(t *testing.T, setup ...func(*zmq.Socket) error) (push, pull *zmq.Socket, endpoint, ackEndpoint string) {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	var socks []*zmq.Socket
	t.Cleanup(func() {
		for _, s := range socks {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}
		if err := zctx.Term(); err != nil {
			t.Error(err)
		}
	})
	bind := func(typ zmq.Type) (*zmq.Socket, string) {
		s, err := zctx.NewSocket(typ)
		if err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
		for _, f := range setup {
			if err := f(s); err != nil {
				t.Fatal(err)
			}
		}
		for _, err := range []error{s.SetLinger(0), s.SetSndtimeo(10 * time.Second), s.SetRcvtimeo(10 * time.Second), s.Bind("tcp://127.0.0.1:*")} {
			if err != nil {
				t.Fatal(err)
			}
		}
		ep, err := s.GetLastEndpoint()
		if err != nil {
			t.Fatal(err)
		}
		return s, ep
	}
	push, endpoint = bind(zmq.PUSH)
	pull, ackEndpoint = bind(zmq.PULL)
	return push, pull, endpoint, ackEndpoint
}

// TestRunWithCurve runs the command with CURVE key files against a daemon
// whose sockets are CURVE servers: the frame arrives and its ack returns,
// which needs both sockets to speak CURVE with the daemon's key.
func TestRunWithCurve(t *testing.T) {
	dir := t.TempDir()
	if _, _, _, err := curvekey.Generate(filepath.Join(dir, "daemon")); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := curvekey.Generate(filepath.Join(dir, "processor")); err != nil {
		t.Fatal(err)
	}
	secret, err := curvekey.ReadSecret(filepath.Join(dir, "daemon.key"))
	if err != nil {
		t.Fatal(err)
	}
	push, pull, endpoint, ackEndpoint := fakeDaemon(t, func(s *zmq.Socket) error {
		return errors.Join(s.SetCurveServer(1), s.SetCurveSecretkey(secret))
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs testsync.LockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-connect", endpoint, "-ack", ackEndpoint,
			"-curve-server-key", filepath.Join(dir, "daemon.pub"), "-curve-secret-key", filepath.Join(dir, "processor.key")}, &logs)
	}()
	var enc wire.Encoder
	enc.Begin(7, 1, "file://./data/raw")
	ev := wire.Event{Key: "k", Source: "s", Seq: 1, FetchedAt: time.Now()}
	enc.Add(&ev, []byte(`{}`), true)
	if _, err := push.SendBytes(enc.End(), 0); err != nil {
		t.Fatalf("send: %v", err)
	}
	data, err := pull.RecvBytes(0) // bounded by the receive timeout
	if err != nil {
		t.Fatalf("receive ack over CURVE: %v\n%s", err, logs.String())
	}
	if a, err := wire.DecodeAck(data); err != nil || len(a.Frames) != 1 || a.Frames[0] != 7 {
		t.Fatalf("ack = %s (%v), want frame 7 acked", data, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if strings.Contains(logs.String(), secret) {
		t.Error("the daemon's secret key was logged")
	}

	if err := os.Chmod(filepath.Join(dir, "daemon.pub"), 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	err = run(t.Context(), []string{"-curve-server-key", filepath.Join(dir, "daemon.pub"),
		"-curve-secret-key", filepath.Join(dir, "daemon.pub")}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-curve-secret-key: "+filepath.Join(dir, "daemon.pub")+": a secret key must not be readable by every user") {
		t.Errorf("a world-readable secret key file: %v", err)
	}
}

// TestSQLiteModeWritesEachEventOnce runs -sqlite against a daemon that
// sends a frame twice: the second delivery is recognised and acked, a
// poison key is nacked permanently, and the table holds each event once.
// With -sqlite-count the table applied counts them instead: 3 for the
// source, and events stays empty.
func TestSQLiteModeWritesEachEventOnce(t *testing.T) {
	for _, counting := range []bool{false, true} {
		t.Run(fmt.Sprintf("sqlite-count=%v", counting), func(t *testing.T) { testSQLiteMode(t, counting) })
	}
}

func testSQLiteMode(t *testing.T, counting bool) {
	push, pull, endpoint, ackEndpoint := fakeDaemon(t)
	dbPath := filepath.Join(t.TempDir(), "events.db")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs testsync.LockedBuffer
	done := make(chan error, 1)
	go func() {
		args := []string{"-connect", endpoint, "-ack", ackEndpoint, "-log-format", "json",
			"-sqlite", dbPath, "-workers", "2", "-fail-keys", "^poison"}
		if counting {
			args = append(args, "-sqlite-count")
		}
		done <- run(ctx, args, &logs)
	}()

	send := func(delivery int) *wire.Ack {
		t.Helper()
		var enc wire.Encoder
		enc.Begin(1, delivery, "file://./data/raw")
		for i, key := range []string{"a", "poison-1", "b", "c"} {
			ev := wire.Event{Key: key, Source: "github", Seq: int64(i + 1), FetchedAt: time.Now()}
			enc.Add(&ev, []byte(`{"n":1}`), true)
		}
		if _, err := push.SendBytes(enc.End(), 0); err != nil {
			t.Fatalf("send: %v", err)
		}
		data, err := pull.RecvBytes(0) // bounded by the receive timeout
		if err != nil {
			t.Fatalf("receive ack: %v", err)
		}
		a, err := wire.DecodeAck(data)
		if err != nil {
			t.Fatalf("ack %s: %v", data, err)
		}
		return a
	}
	for delivery := 1; delivery <= 2; delivery++ {
		a := send(delivery)
		if len(a.Keys) != 3 || len(a.Nacks) != 1 || a.Nacks[0].Key != "poison-1" || !a.Nacks[0].Permanent {
			t.Errorf("delivery %d: ack = %+v, want a, b, c acked and poison-1 nacked permanently", delivery, a)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancellation")
	}

	var summary struct {
		Msg                string `json:"msg"`
		ExactlyOnceRows    int64  `json:"exactly_once_rows"`
		DoubleApplications int64  `json:"double_applications"`
		Duplicates         int64  `json:"duplicates"`
		Permanent          int64  `json:"permanent"`
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &summary); err != nil {
		t.Fatalf("last log line %q: %v", lines[len(lines)-1], err)
	}
	if summary.Msg != "summary" || summary.ExactlyOnceRows != 3 || summary.DoubleApplications != 0 ||
		summary.Duplicates != 3 || summary.Permanent != 2 {
		t.Errorf("summary = %+v, want 3 rows, no double application, 3 duplicates, 2 permanent failures", summary)
	}

	db, err := sql.Open("sqlite3", "file:"+dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	}()
	var rows, applied int
	if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM events WHERE source = 'github' AND key IN ('a', 'b', 'c')`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(t.Context(), `SELECT coalesce(sum(n), 0) FROM applied WHERE source = 'github'`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if want := [2]int{3, 0}; counting && [2]int{applied, rows} != want || !counting && [2]int{rows, applied} != want {
		t.Errorf("events rows for a, b, c = %d, applied count %d; want 3 in %s and none in the other",
			rows, applied, map[bool]string{false: "events", true: "applied"}[counting])
	}
}

func TestDoubleApplicationIsCountedAsABug(t *testing.T) {
	var logs testsync.LockedBuffer
	store, err := openEventStore(t.Context(), filepath.Join(t.TempDir(), "events.db"), false, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := store.db.Close(); err != nil {
			t.Error(err)
		}
	}()
	ev := &processor.Event{Key: "k", Source: "s", Seq: 1, Payload: []byte(`{}`)}
	for i := range 2 {
		tx, err := store.db.BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		err = store.insert(t.Context(), tx, ev)
		if i == 1 && (!processor.IsPermanent(err) || store.doubles.Load() != 1 || !strings.Contains(logs.String(), "BUG: event applied twice")) {
			t.Errorf("second insert = %v, doubles = %d; want a permanent error counted and logged as a bug", err, store.doubles.Load())
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRecordAppendsEveryDelivery runs the command with -record on a file
// that already has a line: each delivery of each event appends one line,
// source, percent-encoded key and delivery number, written before the ack
// so it is in the file while the processor still runs (a kill cannot lose
// it); keys with spaces, percent signs or newlines stay one field of one
// line and decode back.
func TestRecordAppendsEveryDelivery(t *testing.T) {
	push, pull, endpoint, ackEndpoint := fakeDaemon(t)
	path := filepath.Join(t.TempDir(), "received.txt")
	if err := os.WriteFile(path, []byte("earlier line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs testsync.LockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-connect", endpoint, "-ack", ackEndpoint, "-record", path, "-fail-retryable-keys", "^retry"}, &logs)
	}()
	keys := []string{"ev-1", "a key with spaces", "line\nbreak", `quo"te 100%`, "retry-me"}
	for delivery := 1; delivery <= 2; delivery++ {
		var enc wire.Encoder
		enc.Begin(1, delivery, "file://./data/raw")
		for i, key := range keys {
			ev := wire.Event{Key: key, Source: "github", Seq: int64(i + 1), FetchedAt: time.Now()}
			enc.Add(&ev, []byte(`{}`), true)
		}
		if _, err := push.SendBytes(enc.End(), 0); err != nil {
			t.Fatalf("send: %v", err)
		}
		if _, err := pull.RecvBytes(0); err != nil { // bounded by the receive timeout
			t.Fatalf("receive ack: %v", err)
		}
	}
	var want strings.Builder
	want.WriteString("earlier line\n")
	for delivery := 1; delivery <= 2; delivery++ {
		for _, key := range keys {
			fmt.Fprintf(&want, "github %s %d\n", url.PathEscape(key), delivery)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want.String() {
		t.Fatalf("record file while running:\n%s\nwant:\n%s\nlogs:\n%s", got, want.String(), logs.String())
	}
	for _, line := range strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Errorf("line %q has %d fields, want 3", line, len(f))
			continue
		}
		if key, err := url.PathUnescape(f[1]); f[0] != "github" || err != nil || !slices.Contains(keys, key) || (f[2] != "1" && f[2] != "2") {
			t.Errorf("line %q does not parse back: source %q key %q (%v) delivery %q", line, f[0], key, err, f[2])
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
}

// TestRecordFileErrors checks that a -record file that cannot be opened is
// a clear error naming the flag and the file.
func TestRecordFileErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing-dir", "received.txt")
	err := run(t.Context(), []string{"-connect", "tcp://127.0.0.1:1", "-ack", "tcp://127.0.0.1:2", "-record", path}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-record") || !strings.Contains(err.Error(), path) {
		t.Fatalf("run with an unopenable -record file: %v, want an error naming -record and %s", err, path)
	}
}

// TestRunExportsProcessSpans: with -otlp-endpoint, the command exports a
// "process" span for each event the daemon traced, in the event's trace,
// to an OTLP receiver; an event without a traceparent gets none.
func TestRunExportsProcessSpans(t *testing.T) {
	recv := otlptest.Start(t)
	push, pull, endpoint, ackEndpoint := fakeDaemon(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs testsync.LockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-connect", endpoint, "-ack", ackEndpoint, "-otlp-endpoint", recv.Endpoint()}, &logs)
	}()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	var enc wire.Encoder
	enc.Begin(1, 1, "file://./data/raw")
	traced := wire.Event{Key: "a", Source: "hooks", Seq: 1, FetchedAt: time.Now(), Traceparent: "00-" + traceID + "-00f067aa0ba902b7-01"}
	enc.Add(&traced, []byte(`{}`), true)
	plain := wire.Event{Key: "b", Source: "hooks", Seq: 2, FetchedAt: time.Now()}
	enc.Add(&plain, []byte(`{}`), true)
	if _, err := push.SendBytes(enc.End(), 0); err != nil {
		t.Fatalf("send: %v", err)
	}
	if _, err := pull.RecvBytes(0); err != nil {
		t.Fatalf("no ack: %v", err)
	}
	cancel() // the spans are exported as the command stops
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	spans := recv.Spans()
	if len(spans) != 1 || spans[0].Name != "process" || spans[0].TraceID != traceID || spans[0].ParentSpanID != "00f067aa0ba902b7" ||
		spans[0].Attrs["ingestor.key"] != "a" || spans[0].Service != "ingestor-processor" {
		t.Errorf("spans %+v, want one process span of event a in trace %s", spans, traceID)
	}
}
