package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/curvekey"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// curvePair is a key pair written by curvekey.Generate.
type curvePair struct {
	public, secret, secretFile string
}

func newCurvePair(t *testing.T, dir, name string) curvePair {
	t.Helper()
	pub, secretFile, _, err := curvekey.Generate(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	secret, err := curvekey.ReadSecret(secretFile)
	if err != nil {
		t.Fatal(err)
	}
	return curvePair{public: pub, secret: secret, secretFile: secretFile}
}

// curveEvents is how many events the upstream of these tests serves; the
// daemon queues them in frames of ten.
const curveEvents = 50

// startCurveDaemon starts a daemon with publishExtra reading a feed of
// curveEvents events, and waits until they are all queued.
func startCurveDaemon(t *testing.T, publishExtra string) *harness {
	t.Helper()
	feed := testupstream.New(t, curveEvents, curveEvents)
	h := startDaemon(t, "", "events_per_frame = 10\n"+publishExtra, httpSource("api", feed.URL))
	testsync.WaitFor(t, "the events queued", 30*time.Second, func() bool { return h.d.Queue().PendingEvents() == curveEvents })
	return h
}

// forgeAck connects a PUSH socket to endpoint, as a CURVE client with the
// given keys when server is set, sends an ack for frames 1 to 100 and
// returns whether the handshake succeeded, waiting for the first handshake
// outcome the socket's monitor reports.
func forgeAck(t *testing.T, endpoint, server string, client curvePair) bool {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	mon, err := zctx.NewSocket(zmq.PAIR)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, err := range []error{sock.Close(), mon.Close(), zctx.Term()} {
			if err != nil {
				t.Error(err)
			}
		}
	}()
	if err := sock.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if server != "" {
		if err := sock.ClientAuthCurve(server, client.public, client.secret); err != nil {
			t.Fatal(err)
		}
	}
	const monitor = "inproc://forged-ack-monitor"
	handshake := zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH |
		zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
	if err := sock.Monitor(monitor, handshake); err != nil {
		t.Fatal(err)
	}
	if err := mon.Connect(monitor); err != nil {
		t.Fatal(err)
	}
	ack := `{"v":1,"type":"ack","frames":[`
	for id := 1; id <= 100; id++ {
		ack += fmt.Sprint(id)
		if id < 100 {
			ack += ","
		}
	}
	ack += `]}`
	if err := sock.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	// Queued until a handshake succeeds: ZMQ_IMMEDIATE is off.
	if _, err := sock.Send(ack, 0); err != nil {
		t.Fatal(err)
	}
	poller := zmq.NewPoller()
	poller.Add(mon, zmq.POLLIN)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		polled, err := poller.Poll(100 * time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(polled) == 0 {
			continue
		}
		ev, _, _, err := mon.RecvEvent(0)
		if err != nil {
			t.Fatal(err)
		}
		return ev == zmq.EVENT_HANDSHAKE_SUCCEEDED
	}
	t.Fatal("no handshake outcome within 20s")
	return false
}

// TestPlaintextDaemonAcceptsForgedAcks shows the hole CURVE closes, and
// that forgeAck's ack clears frames when it gets through.
func TestPlaintextDaemonAcceptsForgedAcks(t *testing.T) {
	h := startCurveDaemon(t, "")
	q := h.d.Queue()
	if !forgeAck(t, h.ack, "", curvePair{}) {
		t.Fatal("a plaintext client's handshake failed on a plaintext daemon")
	}
	testsync.WaitFor(t, "the forged ack to clear the frames", 30*time.Second, func() bool { return q.PendingEvents() == 0 })
}

// TestCurveAdmitsOnlyAuthorizedProcessors runs a CURVE daemon with one
// authorized processor key. Forged acks over an unauthorized key and over
// plaintext are refused at the handshake and clear nothing; processors
// with an unauthorized key and without CURVE keep trying and receive
// nothing, while the authorized processor receives every event and its
// acks clear them.
func TestCurveAdmitsOnlyAuthorizedProcessors(t *testing.T) {
	dir := t.TempDir()
	server := newCurvePair(t, dir, "daemon")
	good := newCurvePair(t, dir, "good")
	bad := newCurvePair(t, dir, "bad")
	authorized := filepath.Join(dir, "authorized")
	if err := os.WriteFile(authorized, []byte("# processors allowed to connect\n\n"+good.public+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := startCurveDaemon(t, fmt.Sprintf("curve_secret_key_file = %q\ncurve_authorized_keys_file = %q", server.secretFile, authorized))
	q := h.d.Queue()

	if forgeAck(t, h.ack, server.public, bad) {
		t.Fatal("the handshake of an unauthorized key succeeded")
	}
	if forgeAck(t, h.ack, "", curvePair{}) {
		t.Fatal("a plaintext handshake with a CURVE daemon succeeded")
	}
	if n := metric(t, h.d.Registry(), "ingestor_publish_curve_refused_total"); n == 0 {
		t.Fatal("the unauthorized key was not counted as refused")
	}
	if n := metric(t, h.d.Registry(), "ingestor_acks_received_total"); n != 0 || q.PendingEvents() != curveEvents {
		t.Fatalf("after refused handshakes: %v acks received, %d events pending, want 0 and %d", n, q.PendingEvents(), curveEvents)
	}

	var rogues []*processor.Client
	for _, o := range []processor.Options{{CurveServerKey: server.public, CurveSecretKey: bad.secret}, {}} {
		c, _ := h.startProcessorWith(o, func(context.Context, *processor.Event) error { return nil })
		rogues = append(rogues, c)
	}
	// The rogue processors' handshakes are refused before the authorized
	// one starts, so both are trying all along the delivery.
	refused := h.d.curve.Refused()
	testsync.WaitFor(t, "the unauthorized processor's handshakes refused", 30*time.Second, func() bool {
		return h.d.curve.Refused() >= refused+2
	})
	seen := newSeenSet()
	h.startProcessorWith(processor.Options{CurveServerKey: server.public, CurveSecretKey: good.secret},
		func(_ context.Context, ev *processor.Event) error {
			seen.add(ev.Key)
			return nil
		})
	testsync.WaitFor(t, "every event at the authorized processor", 30*time.Second, func() bool { return seen.len() == curveEvents })
	for n := 1; n <= curveEvents; n++ {
		if seen.count(testupstream.ID(n)) == 0 {
			t.Fatalf("event %s never reached the authorized processor", testupstream.ID(n))
		}
	}
	testsync.WaitFor(t, "its acks to clear the queue", 30*time.Second, func() bool { return q.PendingEvents() == 0 })
	for i, c := range rogues {
		if st := c.Stats(); st.Frames != 0 || st.Malformed != 0 {
			t.Errorf("rogue processor %d received %+v", i, st)
		}
	}
	logs := h.logs.String()
	for _, secret := range []string{server.secret, good.secret, bad.secret} {
		if strings.Contains(logs, secret) {
			t.Error("a secret key was logged")
		}
	}
}

// TestCurveDaemonsInOneProcessKeepTheirOwnKeys runs two CURVE daemons at
// once, each authorizing a different processor key: each admits its own
// processor and refuses the other's, so no authentication state is shared
// between them.
func TestCurveDaemonsInOneProcessKeepTheirOwnKeys(t *testing.T) {
	dir := t.TempDir()
	type daemonKeys struct {
		server, processor curvePair
		h                 *harness
	}
	var ds []daemonKeys
	for _, name := range []string{"one", "two"} {
		k := daemonKeys{server: newCurvePair(t, dir, name), processor: newCurvePair(t, dir, name+"-processor")}
		authorized := filepath.Join(dir, name+"-authorized")
		if err := os.WriteFile(authorized, []byte(k.processor.public+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		k.h = startDaemon(t, "", fmt.Sprintf("curve_secret_key_file = %q\ncurve_authorized_keys_file = %q",
			k.server.secretFile, authorized), "")
		ds = append(ds, k)
	}
	for i, d := range ds {
		other := ds[1-i]
		if !forgeAck(t, d.h.ack, d.server.public, d.processor) {
			t.Errorf("daemon %d refused its own processor", i+1)
		}
		if forgeAck(t, d.h.ack, d.server.public, other.processor) {
			t.Errorf("daemon %d admitted the other daemon's processor", i+1)
		}
	}
}
