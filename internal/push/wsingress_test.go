package push

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/devicewire"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/queue/queuetest"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/sources"
)

// The tokens of these tests.
const (
	sharedToken = "shared-token-0123456789"
	tokenA      = "device-a-token-0123456789"
	tokenB      = "device-b-token-0123456789"
)

// wsRig is a ws_ingress source "devices" served by a real push listener,
// on a real inbox, queue and file raw store.
type wsRig struct {
	srv     *Server
	inbox   *Inbox
	q       *queue.Queue
	frames  *frameLog
	metrics *Metrics
	dir     string
	url     string
}

// startWS serves a ws_ingress source with the shared token, the tokens of
// devices "dev-a" and "dev-b", and the spec's defaults changed by tune.
func startWS(t *testing.T, tune func(*sources.WSIngressSpec)) *wsRig {
	t.Helper()
	return startWSPending(t, 1_000_000, tune)
}

// startWSPending is startWS with publish.max_pending_events maxPending.
func startWSPending(t *testing.T, maxPending int64, tune func(*sources.WSIngressSpec)) *wsRig {
	t.Helper()
	return startWSInbox(t, maxPending, nil, tune)
}

// startWSInbox is startWSPending with the inbox's options changed by
// inboxTune (nil: none).
func startWSInbox(t *testing.T, maxPending int64, inboxTune func(*InboxOptions), tune func(*sources.WSIngressSpec)) *wsRig {
	t.Helper()
	dir := t.TempDir()
	var tunes []func(*InboxOptions)
	if inboxTune != nil {
		tunes = append(tunes, inboxTune)
	}
	in, q, _, frames := openInboxIn(t, dir, maxPending, tunes...)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# device tokens\ndev-a "+tokenA+"\n\ndev-b "+tokenB+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ := sources.NewSpec("ws_ingress")
	spec := s.(*sources.WSIngressSpec)
	spec.Token, spec.TokensFile = sharedToken, tokens
	if tune != nil {
		tune(spec)
	}
	m := NewMetrics(nil)
	srv := startServer(t, ServerOptions{Push: config.Push{Addr: "127.0.0.1:0"}, Inbox: in, Metrics: m,
		Sources: []config.Source{{Name: "devices", Kind: "ws_ingress", Enabled: true, Spec: spec}}})
	return &wsRig{srv: srv, inbox: in, q: q, frames: frames, metrics: m, dir: dir, url: "ws://" + srv.Addr() + "/ingest/devices/ws"}
}

// connected is the devices_connected gauge.
func (r *wsRig) connected(t testing.TB) float64 {
	return metricValue(t, r.metrics.ws.connected.WithLabelValues("devices"))
}

// metricValue reads the value of a counter or a gauge.
func metricValue(t testing.TB, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// stored reports whether the ledger holds key.
func (r *wsRig) stored(t *testing.T, key string) bool {
	t.Helper()
	_, ok, err := r.q.EventByKey(context.Background(), "devices", key)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// testDevice is a device's connection: a reader goroutine collects the
// answers (and so answers pings, as a real device does).
type testDevice struct {
	t      testing.TB
	conn   *websocket.Conn
	acks   chan devicewire.Ack
	closed chan error // the read error that ended the connection
}

func dialDevice(t testing.TB, url, token string) *testDevice {
	t.Helper()
	conn, err := dialWS(t, url, token)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	d := &testDevice{t: t, conn: conn, acks: make(chan devicewire.Ack, 4096), closed: make(chan error, 1)}
	go func() {
		for {
			_, msg, err := conn.Read(context.Background())
			if err != nil {
				d.closed <- err
				return
			}
			a, err := devicewire.DecodeAck(msg)
			if err != nil {
				t.Errorf("answer %q: %v", msg, err)
			}
			d.acks <- a
		}
	}()
	t.Cleanup(func() {
		if err := conn.CloseNow(); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Logf("close a test device: %v", err)
		}
	})
	return d
}

// dialWS dials url with token as the bearer token ("" for none).
func dialWS(t testing.TB, url, token string) (*websocket.Conn, error) {
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h})
	if resp != nil && resp.Body != nil {
		if cerr := resp.Body.Close(); cerr != nil {
			t.Logf("close the handshake body: %v", cerr)
		}
	}
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("handshake answered %d: %w", resp.StatusCode, err)
		}
		return nil, err
	}
	conn.SetReadLimit(1 << 20)
	return conn, nil
}

func (d *testDevice) send(msg string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		d.t.Fatalf("send %q: %v", msg, err)
	}
}

// next returns the next answer, failing the test if none comes within 30 s.
func (d *testDevice) next() devicewire.Ack {
	d.t.Helper()
	select {
	case a := <-d.acks:
		return a
	case err := <-d.closed:
		d.t.Fatalf("connection closed while waiting for an answer: %v", err)
	case <-time.After(30 * time.Second):
		d.t.Fatal("no answer within 30s")
	}
	return devicewire.Ack{}
}

// closeStatus waits for the daemon to close the connection and returns
// its close status.
func (d *testDevice) closeStatus() websocket.StatusCode {
	d.t.Helper()
	select {
	case err := <-d.closed:
		return websocket.CloseStatus(err)
	case <-time.After(30 * time.Second):
		d.t.Fatal("the connection was not closed within 30s")
	}
	return 0
}

// envelopeFor returns a valid envelope of device with event_id id.
func envelopeFor(device, id string) string {
	return fmt.Sprintf(`{"schema_version":1,"event_id":%q,"type":"reading","ts":"2026-11-24T10:00:00Z","session_id":"s1","device_id":%q,"payload":{"t":21.5}}`, id, device)
}

// TestWSIngressAcksOnlyAfterCommit stalls the queue's writer behind a held
// SQLite write lock: the envelope's raw bytes are written, but no answer
// comes while the ledger row cannot be committed; once the lock is
// released, "stored" arrives and the row is in the ledger.
func TestWSIngressAcksOnlyAfterCommit(t *testing.T) {
	r := startWS(t, nil)
	d := dialDevice(t, r.url, tokenA)
	release := queuetest.HoldWriteLock(t, filepath.Join(r.dir, "queue.db"))
	d.send(envelopeFor("dev-a", "e1"))
	testsync.WaitFor(t, "the raw object to be written", 10*time.Second, func() bool {
		entries, err := os.ReadDir(filepath.Join(r.dir, "raw"))
		return err == nil && len(entries) > 0
	})
	if r.stored(t, "e1") {
		t.Fatal("the row is committed while the write lock is held")
	}
	select {
	case a := <-d.acks:
		t.Fatalf("answer %+v before the commit", a)
	default:
	}
	release()
	a := d.next()
	if a.EventID != "e1" || a.Status != devicewire.StatusStored || a.AckTS == "" {
		t.Fatalf("answer = %+v, want stored e1 with ack_ts", a)
	}
	if _, err := time.Parse(time.RFC3339Nano, a.AckTS); err != nil {
		t.Errorf("ack_ts %q: %v", a.AckTS, err)
	}
	if !r.stored(t, "e1") {
		t.Fatal("stored was answered but the ledger lacks e1")
	}
	if got := r.frames.events(); got != 1 {
		t.Errorf("sender got %d events, want 1", got)
	}
}

// TestWSIngressDuplicateIsStoredAgain sends one event_id twice, on two
// connections: both are answered "stored", the ledger holds one row, and
// processors get it once; the whole envelope is the event's payload.
func TestWSIngressDuplicateIsStoredAgain(t *testing.T) {
	r := startWS(t, nil)
	msg := envelopeFor("dev-a", "dup")
	for i := range 2 {
		d := dialDevice(t, r.url, tokenA)
		d.send(msg)
		if a := d.next(); a.EventID != "dup" || a.Status != devicewire.StatusStored {
			t.Fatalf("answer %d = %+v, want stored", i, a)
		}
	}
	if got := r.q.PendingEvents(); got != 1 {
		t.Errorf("queue holds %d events, want 1", got)
	}
	if got := r.frames.events(); got != 1 {
		t.Fatalf("sender got %d events, want 1", got)
	}
	e := r.frames.frames[0].Events[0]
	if string(e.Payload) != msg || e.Key != "dup" || !e.EventTime.Equal(time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("event = key %q time %v payload %q, want the envelope as sent", e.Key, e.EventTime, e.Payload)
	}
	st, ok, err := r.q.EventByKey(context.Background(), "devices", "dup")
	if err != nil || !ok || st.Received != 2 {
		t.Errorf("ledger row = %+v (ok %v, err %v), want 2 arrivals", st, ok, err)
	}
	for status, want := range map[string]float64{"stored": 1, "duplicate": 1} {
		if got := metricValue(t, r.metrics.ws.envelopes.WithLabelValues("devices", "dev-a", status)); got != want {
			t.Errorf("envelopes{device=dev-a,status=%s} = %v, want %v", status, got, want)
		}
	}
}

// TestWSIngressRejectsInvalidEnvelopes sends each kind of invalid envelope
// on one connection: each is answered "rejected" with its reason and the
// event_id when readable, nothing is stored, and the connection still
// takes a valid envelope afterwards.
func TestWSIngressRejectsInvalidEnvelopes(t *testing.T) {
	r := startWS(t, nil)
	d := dialDevice(t, r.url, tokenA)
	valid := map[string]string{"event_id": `"x1"`, "type": `"reading"`, "ts": `"2026-11-24T10:00:00Z"`,
		"session_id": `"s1"`, "device_id": `"dev-a"`, "payload": `{"t":1}`}
	// without returns the valid envelope without key, with, where set,
	// key's value replaced by value.
	without := func(key, value string) string {
		var parts []string
		for _, k := range []string{"event_id", "type", "ts", "session_id", "device_id", "payload"} {
			v := valid[k]
			if k == key {
				if value == "" {
					continue
				}
				v = value
			}
			parts = append(parts, fmt.Sprintf("%q:%s", k, v))
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	long := `"` + strings.Repeat("x", 257) + `"`
	cases := []struct {
		name, msg, eventID, reason string
	}{
		{"not JSON", `hello`, "", "not JSON"},
		{"not JSON, null-like", `nothing`, "", "not JSON"},
		{"a string", `"x"`, "", "must be a JSON object, not a string"},
		{"truncated", `{"event_id":"t1","type":`, "t1", "not valid JSON"},
		{"trailing data", without("", "") + ` {}`, "x1", "not valid JSON"},
		{"array", `[1,2]`, "", "must be a JSON object, not an array"},
		{"invalid UTF-8", "{\"event_id\":\"\xff\"}", "", "not valid UTF-8"},
		{"missing event_id", without("event_id", ""), "", "event_id is missing"},
		{"missing type", without("type", ""), "x1", "type is missing"},
		{"missing ts", without("ts", ""), "x1", "ts is missing"},
		{"missing session_id", without("session_id", ""), "x1", "session_id is missing"},
		{"missing device_id", without("device_id", ""), "x1", "device_id is missing"},
		{"missing payload", without("payload", ""), "x1", "payload is missing"},
		{"empty event_id", without("event_id", `""`), "", "event_id is empty"},
		{"empty type", without("type", `""`), "x1", "type is empty"},
		{"numeric event_id", without("event_id", `42`), "", "event_id must be a string, not a number"},
		{"null device_id", without("device_id", `null`), "x1", "device_id must be a string, not null"},
		{"long event_id", without("event_id", long), strings.Repeat("x", 257), "event_id is longer than 256 bytes"},
		{"long session_id", without("session_id", long), "x1", "session_id is longer than 256 bytes"},
		{"bad ts", without("ts", `"yesterday"`), "x1", "not an RFC 3339 time"},
		{"schema_version 2", `{"schema_version":2,` + without("", "")[1:], "", "schema_version 2 is not supported"},
		{"schema_version string", `{"schema_version":"1",` + without("", "")[1:], "", "schema_version must be the number 1"},
		{"event_id twice", `{"event_id":"x0",` + without("", "")[1:], "x0", "event_id appears twice"},
		{"another device", without("device_id", `"dev-b"`), "x1", `device_id "dev-b" is not the device of the token ("dev-a")`},
	}
	for _, tc := range cases {
		d.send(tc.msg)
		a := d.next()
		if a.Status != devicewire.StatusRejected || a.EventID != tc.eventID || !strings.Contains(a.Reason, tc.reason) || a.AckTS != "" {
			t.Errorf("%s: answer = %+v, want rejected, event_id %q, reason with %q", tc.name, a, tc.eventID, tc.reason)
		}
	}
	if got := r.q.PendingEvents(); got != 0 {
		t.Errorf("queue holds %d events after rejections, want 0", got)
	}
	if got := r.frames.events(); got != 0 {
		t.Errorf("sender got %d events after rejections, want 0", got)
	}
	if got := metricValue(t, r.metrics.ws.envelopes.WithLabelValues("devices", "dev-a", devicewire.StatusRejected)); got != float64(len(cases)) {
		t.Errorf("rejected envelopes counted %v, want %d", got, len(cases))
	}
	if got := metricValue(t, r.metrics.Requests.WithLabelValues("devices", "400")); got != float64(len(cases)) {
		t.Errorf("requests{code=400} = %v, want %d", got, len(cases))
	}
	d.send(without("", ""))
	if a := d.next(); a.Status != devicewire.StatusStored || a.EventID != "x1" {
		t.Fatalf("valid envelope after the rejections: %+v, want stored", a)
	}
}

// TestWSIngressTokens checks the handshake: no token or a wrong one is
// answered 401 before the upgrade; the shared token may send for any
// device; a device's token only for its own device (TestWSIngressRejects-
// InvalidEnvelopes covers the other device's envelope).
func TestWSIngressTokens(t *testing.T) {
	r := startWS(t, nil)
	for _, token := range []string{"", "wrong-token-0123456789", tokenA + "x"} {
		_, err := dialWS(t, r.url, token)
		if err == nil || !strings.Contains(err.Error(), "answered 401") {
			t.Errorf("token %q: dial err = %v, want a 401", token, err)
		}
	}
	if got := metricValue(t, r.metrics.Requests.WithLabelValues("devices", "401")); got != 3 {
		t.Errorf("requests{code=401} = %v, want 3", got)
	}
	shared := dialDevice(t, r.url, sharedToken)
	for i, dev := range []string{"dev-a", "dev-b", "gateway-7"} {
		shared.send(envelopeFor(dev, fmt.Sprint("s", i)))
		if a := shared.next(); a.Status != devicewire.StatusStored {
			t.Errorf("shared token, device %s: %+v, want stored", dev, a)
		}
	}
	b := dialDevice(t, r.url, tokenB)
	b.send(envelopeFor("dev-b", "b1"))
	if a := b.next(); a.Status != devicewire.StatusStored {
		t.Errorf("dev-b's token, its own envelope: %+v, want stored", a)
	}
	b.send(envelopeFor("dev-a", "b2"))
	if a := b.next(); a.Status != devicewire.StatusRejected || r.stored(t, "b2") {
		t.Errorf("dev-b's token, dev-a's envelope: %+v, want rejected and not stored", a)
	}
}

// TestWSIngressProtocolViolations closes the connection with 1008 on a
// binary message. A message over max_message_bytes is answered "rejected"
// with its event_id instead, and the connection goes on: a forwarder that
// got no answer would send it again forever.
func TestWSIngressProtocolViolations(t *testing.T) {
	r := startWS(t, func(s *sources.WSIngressSpec) { s.MaxMessageBytes = 512 })
	d := dialDevice(t, r.url, tokenA)
	if err := d.conn.Write(context.Background(), websocket.MessageBinary, []byte(envelopeFor("dev-a", "bin"))); err != nil {
		t.Fatal(err)
	}
	if got := d.closeStatus(); got != websocket.StatusPolicyViolation {
		t.Errorf("binary message: close status %v, want 1008", got)
	}
	d = dialDevice(t, r.url, tokenA)
	big := envelopeFor("dev-a", "big")
	big = big[:len(big)-1] + `,"pad":"` + strings.Repeat("p", 4096) + `"}`
	d.send(big)
	if a := d.next(); a.Status != devicewire.StatusRejected || a.EventID != "big" || !strings.Contains(a.Reason, "max_message_bytes") {
		t.Errorf("oversize message: answer %+v, want big rejected over max_message_bytes", a)
	}
	d.send(envelopeFor("dev-a", "after"))
	if a := d.next(); a.Status != devicewire.StatusStored || a.EventID != "after" {
		t.Errorf("the envelope after an oversize one: answer %+v, want stored", a)
	}
	if r.stored(t, "bin") || r.stored(t, "big") {
		t.Error("a message that broke the protocol was stored")
	}
	d.conn.CloseNow()
	testsync.WaitFor(t, "both connections to be gone", 10*time.Second, func() bool { return r.connected(t) == 0 })
}

// TestWSIngressWindowPausesReading has a window of one envelope: while the
// first envelope's commit is stalled, the second (invalid, so answered
// without a commit) is not even read, so its rejection comes after the
// first envelope's "stored".
func TestWSIngressWindowPausesReading(t *testing.T) {
	r := startWS(t, func(s *sources.WSIngressSpec) { s.MaxInflight = 1 })
	d := dialDevice(t, r.url, tokenA)
	release := queuetest.HoldWriteLock(t, filepath.Join(r.dir, "queue.db"))
	d.send(envelopeFor("dev-a", "w1"))
	d.send(`not an envelope`)
	testsync.WaitFor(t, "the raw object to be written", 10*time.Second, func() bool {
		entries, err := os.ReadDir(filepath.Join(r.dir, "raw"))
		return err == nil && len(entries) > 0
	})
	release()
	if a := d.next(); a.Status != devicewire.StatusStored || a.EventID != "w1" {
		t.Fatalf("first answer = %+v, want w1 stored: the window did not pause reading", a)
	}
	if a := d.next(); a.Status != devicewire.StatusRejected {
		t.Fatalf("second answer = %+v, want rejected", a)
	}
}

// TestWSIngressShutdownAnswersPendingThenGoingAway shuts the listener down
// while a commit is stalled: the envelope is still answered "stored" once
// the commit returns, and then the connection is closed with 1001.
func TestWSIngressShutdownAnswersPendingThenGoingAway(t *testing.T) {
	r := startWS(t, nil)
	d := dialDevice(t, r.url, tokenA)
	release := queuetest.HoldWriteLock(t, filepath.Join(r.dir, "queue.db"))
	d.send(envelopeFor("dev-a", "last"))
	testsync.WaitFor(t, "the raw object to be written", 10*time.Second, func() bool {
		entries, err := os.ReadDir(filepath.Join(r.dir, "raw"))
		return err == nil && len(entries) > 0
	})
	shut := make(chan error, 1)
	go func() { shut <- r.srv.Shutdown(context.Background()) }()
	release()
	if a := d.next(); a.Status != devicewire.StatusStored || a.EventID != "last" {
		t.Fatalf("answer = %+v, want last stored", a)
	}
	if got := d.closeStatus(); got != websocket.StatusGoingAway {
		t.Errorf("close status %v, want 1001", got)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if !r.stored(t, "last") {
		t.Error("the answered envelope is not in the ledger")
	}
}
