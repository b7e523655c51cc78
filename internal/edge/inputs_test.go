package edge

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// holdAll makes d take envelopes without answering until release is
// closed, then store them.
func holdAll(d *fakeDaemon) (release func()) {
	ch := make(chan struct{})
	d.setOnEnvelope(func(c *fakeConn, env fakeEnvelope) {
		d.spawn(func() {
			select {
			case <-ch:
				c.store(env)
			case <-d.done:
			}
		})
	})
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// TestHTTPInput checks the answers of POST /events: one JSON object
// (even spread over lines), NDJSON, a body with an invalid line (400,
// nothing stored), an empty body, another method, and requests a web page
// could make (403).
func TestHTTPInput(t *testing.T) {
	d := newFakeDaemon(t)
	release := holdAll(d)
	defer release()
	f := startForwarder(t, testOptions(t, d))
	if status, r := post(t, f.HTTPAddr(), "{\n  \"type\": \"t\",\n  \"payload\": {\"a\": 1}\n}\n"); status != 200 || len(r.EventIDs) != 1 {
		t.Errorf("pretty object: %d %+v", status, r)
	}
	if status, r := post(t, f.HTTPAddr(), "{\"type\":\"t\",\"payload\":1}\n\n{\"type\":\"t\",\"payload\":2}\n"); status != 200 || len(r.EventIDs) != 2 {
		t.Errorf("NDJSON: %d %+v", status, r)
	}
	status, r := post(t, f.HTTPAddr(), "{\"type\":\"t\",\"payload\":1}\n{\"payload\":2}\nnope\n")
	if status != 400 || r.Status != replyInvalid || len(r.Errors) != 2 ||
		!strings.Contains(r.Errors[0], `line 2: "type" is required`) || !strings.Contains(r.Errors[1], "line 3: event is not a JSON object") {
		t.Errorf("invalid lines: %d %+v", status, r)
	}
	if n, _ := f.ob.backlog(); n != 3 {
		t.Errorf("outbox holds %d events, want 3 (nothing of the invalid body)", n)
	}
	if status, r := post(t, f.HTTPAddr(), " \n"); status != 400 || !strings.Contains(r.Error, "empty body") {
		t.Errorf("empty body: %d %+v", status, r)
	}
	resp, err := http.Get("http://" + f.HTTPAddr() + "/events")
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", resp.StatusCode)
	}
	for _, h := range []http.Header{{"Origin": {"http://evil.example"}}, {"Sec-Fetch-Site": {"cross-site"}}, {"Host": {"evil.example:9470"}}} {
		req, err := http.NewRequest(http.MethodPost, "http://"+f.HTTPAddr()+"/events", strings.NewReader(`{"type":"t","payload":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = h
		req.Host = h.Get("Host")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := resp.Body.Close(); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("request with %v: %d, want 403", h, resp.StatusCode)
		}
	}
	if n, _ := f.ob.backlog(); n != 3 {
		t.Errorf("outbox holds %d events, want 3 (nothing from a web page)", n)
	}
	release()
	waitEmpty(t, f)
}

// TestHTTPFullAnswers503 fills the outbox while the daemon answers
// nothing: the event that does not fit gets 503 with Retry-After and a
// JSON error, and is accepted once the daemon has stored the backlog.
func TestHTTPFullAnswers503(t *testing.T) {
	d := newFakeDaemon(t)
	release := holdAll(d)
	defer release()
	o := testOptions(t, d)
	o.MaxEnvelopeBytes = 1024
	o.MaxOutboxBytes = 2048
	f := startForwarder(t, o)
	event := `{"type":"t","payload":"` + strings.Repeat("x", 500) + `"}`
	accepted := 0
	for {
		resp, err := http.Post("http://"+f.HTTPAddr()+"/events", "application/json", strings.NewReader(event))
		if err != nil {
			t.Fatal(err)
		}
		var r reply
		decodeErr := json.NewDecoder(resp.Body).Decode(&r)
		if err := resp.Body.Close(); err != nil {
			t.Fatal(err)
		}
		if decodeErr != nil {
			t.Fatalf("reply: %v", decodeErr)
		}
		if resp.StatusCode == 200 {
			if accepted++; accepted > 4 {
				t.Fatalf("accepted %d events of ~650 bytes in a 2048-byte outbox", accepted)
			}
			continue
		}
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "5" ||
			r.Status != replyFull || !strings.Contains(r.Error, "outbox full") || !strings.Contains(r.Error, "max_outbox_bytes 2048") {
			t.Fatalf("full outbox: %d Retry-After %q %+v", resp.StatusCode, resp.Header.Get("Retry-After"), r)
		}
		break
	}
	if accepted == 0 {
		t.Fatal("nothing accepted before the outbox was full")
	}
	release()
	waitEmpty(t, f)
	if status, _ := post(t, f.HTTPAddr(), event); status != 200 {
		t.Errorf("after the daemon stored the backlog: %d", status)
	}
}

// TestSocketInput sends NDJSON over the Unix socket and reads one reply
// line per event, in order.
func TestSocketInput(t *testing.T) {
	d := newFakeDaemon(t)
	o := testOptions(t, d)
	o.HTTPAddr = ""
	o.Socket = filepath.Join(t.TempDir(), "edge.sock")
	f := startForwarder(t, o)
	c, err := net.Dial("unix", o.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	if _, err := io.WriteString(c, "{\"type\":\"t\",\"payload\":1}\n{\"type\":\"t\"}\n{\"type\":\"t\",\"payload\":3,\"event_id\":\"e3\"}\n"); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(c)
	var replies []reply
	for len(replies) < 3 && sc.Scan() {
		var r reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("reply %q: %v", sc.Bytes(), err)
		}
		replies = append(replies, r)
	}
	if len(replies) != 3 || replies[0].Status != replyAccepted || replies[0].EventID == "" ||
		replies[1].Status != replyInvalid || !strings.Contains(replies[1].Error, `line 2: "payload" is required`) ||
		replies[2].Status != replyAccepted || replies[2].EventID != "e3" {
		t.Fatalf("replies = %+v (%v)", replies, sc.Err())
	}
	testsync.WaitFor(t, "both events stored", 10*time.Second, func() bool { return d.storedCount() == 2 })
	waitEmpty(t, f)
}

// TestStdinPausesWhenFull writes more to stdin than the outbox holds
// while the daemon answers nothing: the forwarder stops reading instead
// of dropping lines, and once the daemon stores, every line arrives.
func TestStdinPausesWhenFull(t *testing.T) {
	const lines = 20
	d := newFakeDaemon(t)
	release := holdAll(d)
	defer release()
	o := testOptions(t, d)
	o.HTTPAddr = ""
	o.MaxEnvelopeBytes = 1024
	o.MaxOutboxBytes = 2048
	pr, pw := io.Pipe()
	o.Stdin, o.StdinReader = true, pr
	var logs testsync.LockedBuffer
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	f := startForwarder(t, o)
	written := make(chan error, 1)
	go func() {
		for i := range lines {
			if _, err := fmt.Fprintf(pw, `{"type":"t","payload":{"n":%d,"pad":"%s"}}`+"\n", i, strings.Repeat("x", 300)); err != nil {
				written <- err
				return
			}
		}
		written <- pw.Close()
	}()
	testsync.WaitFor(t, "stdin paused on a full outbox", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), "stdin: paused") && strings.Contains(logs.String(), "outbox full")
	})
	select {
	case err := <-written:
		t.Fatalf("all %d lines were taken by a full outbox (%v)", lines, err)
	default:
	}
	release()
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "every line stored", 20*time.Second, func() bool { return d.storedCount() == lines })
	payloads := d.storedPayloads()
	for i := range lines {
		if !payloads[fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, strings.Repeat("x", 300))] {
			t.Errorf("line %d never reached the daemon", i)
		}
	}
	waitEmpty(t, f)
}

// TestSocketFullReply fills a small outbox through the Unix socket while
// the daemon answers nothing: the event that does not fit gets a "full"
// line, and the connection goes on.
func TestSocketFullReply(t *testing.T) {
	d := newFakeDaemon(t)
	release := holdAll(d)
	defer release()
	o := testOptions(t, d)
	o.HTTPAddr = ""
	o.Socket = filepath.Join(t.TempDir(), "edge.sock")
	o.MaxEnvelopeBytes = 1024
	o.MaxOutboxBytes = 2048
	f := startForwarder(t, o)
	c, err := net.Dial("unix", o.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	sc := bufio.NewScanner(c)
	event := `{"type":"t","payload":"` + strings.Repeat("x", 500) + `"}` + "\n"
	for i := 0; ; i++ {
		if i > 4 {
			t.Fatalf("%d events of ~650 bytes accepted in a 2048-byte outbox", i)
		}
		if _, err := io.WriteString(c, event); err != nil {
			t.Fatal(err)
		}
		if !sc.Scan() {
			t.Fatalf("no reply: %v", sc.Err())
		}
		var r reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.Status == replyAccepted {
			continue
		}
		if r.Status != replyFull || !strings.Contains(r.Error, "outbox full") {
			t.Fatalf("reply %+v, want full", r)
		}
		break
	}
	release()
	waitEmpty(t, f)
	if _, err := io.WriteString(c, event); err != nil {
		t.Fatal(err)
	}
	var r reply
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &r) != nil || r.Status != replyAccepted {
		t.Fatalf("after the daemon stored the backlog: %q (%v)", sc.Bytes(), sc.Err())
	}
}
