package daemon

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// docBlock returns the first fenced block of language lang under the
// heading (a whole line such as "## Python example") of the document at
// path, relative to this package.
func docBlock(t *testing.T, path, heading, lang string) string {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "\n"+heading+"\n")
	if ok {
		_, rest, ok = strings.Cut(rest, "\n```"+lang+"\n")
	}
	code, _, closed := strings.Cut(rest, "\n```\n")
	if !ok || !closed {
		t.Fatalf("%s has no ```%s block under %q", path, lang, heading)
	}
	return code
}

// pythonExample returns the processor of PROTOCOL.md's "Python example"
// section, written to a file.
func pythonExample(t *testing.T) string {
	t.Helper()
	code := docBlock(t, "../../PROTOCOL.md", "## Python example", "python")
	path := filepath.Join(t.TempDir(), "processor.py")
	if err := os.WriteFile(path, []byte(code+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// pyProcess is the Python example processor running as a child process.
type pyProcess struct {
	mu     sync.Mutex
	stdout []string // lines printed: one per processed event
	stderr []string // log lines
	exited chan struct{}
}

func startPython(t *testing.T, endpoint, ackEndpoint string) *pyProcess {
	t.Helper()
	cmd := exec.Command(testsync.Python3(t), pythonExample(t))
	cmd.Env = append(os.Environ(), "INGESTOR_ENDPOINT="+endpoint, "INGESTOR_ACK_ENDPOINT="+ackEndpoint, "PYTHONUNBUFFERED=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errOut, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyProcess{exited: make(chan struct{})}
	var reading sync.WaitGroup
	collect := func(r io.Reader, into *[]string) {
		defer reading.Done()
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			*into = append(*into, sc.Text())
			p.mu.Unlock()
		}
	}
	reading.Add(2)
	go collect(out, &p.stdout)
	go collect(errOut, &p.stderr)
	go func() {
		reading.Wait()
		err := cmd.Wait()
		p.mu.Lock()
		p.stderr = append(p.stderr, fmt.Sprintf("exit: %v", err))
		p.mu.Unlock()
		close(p.exited)
	}()
	t.Cleanup(func() {
		if err := cmd.Process.Kill(); err != nil {
			select {
			case <-p.exited:
			default:
				t.Errorf("kill python: %v", err)
			}
		}
		<-p.exited
		if t.Failed() {
			t.Logf("python stderr:\n%s", p.stderrText())
		}
	})
	return p
}

func (p *pyProcess) lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.stdout...)
}

func (p *pyProcess) stderrText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.stderr, "\n")
}

func (p *pyProcess) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// TestPythonExampleProcessor runs PROTOCOL.md's Python processor, as a
// reader would copy it, against hostile frames and against the daemon.
func TestPythonExampleProcessor(t *testing.T) {
	t.Run("hostile frames", testPythonHostileFrames)
	t.Run("daemon", testPythonAgainstDaemon)
}

// testPythonHostileFrames plays the daemon with real sockets: it sends the
// processor messages that a strict reader of the spec must drop, each with
// its own frame id, then a valid frame. The processor must survive them
// all and ack only the valid frame.
func testPythonHostileFrames(t *testing.T) {
	push, pull, pubEP, ackEP := bindFakeDaemon(t)
	py := startPython(t, pubEP, ackEP)

	const validID = 99
	hostile, valid := pythonHostileFrames(validID)
	for _, h := range hostile {
		msg := make([]any, len(h.parts))
		for i, p := range h.parts {
			msg[i] = p
		}
		if _, err := push.SendMessage(msg...); err != nil {
			t.Fatalf("send %s: %v", h.name, err)
		}
	}
	if _, err := push.Send(valid, 0); err != nil {
		t.Fatal(err)
	}
	checkPythonAckedOnly(t, pull, py, validID)
	if !py.alive() {
		t.Fatal("the Python processor exited")
	}
	// The processor printed the events before it acked; the goroutine
	// that collects its output may not have read them yet.
	testsync.WaitFor(t, "the processor's output of the valid frame", 10*time.Second, func() bool { return len(py.lines()) >= 2 })
	got := py.lines()
	if len(got) != 2 || !strings.HasPrefix(got[0], "s a 1 {'n': 1}") || !strings.HasPrefix(got[1], `s b 1 b'\xff'`) {
		t.Fatalf("processed %q, want events a and b only", got)
	}
	// Every hostile message was dropped and logged; the log lines were
	// written before the ack, and are read by a goroutine of their own.
	testsync.WaitFor(t, "the processor's log of every hostile frame", 10*time.Second, func() bool {
		logs := py.stderrText()
		return strings.Count(logs, "dropped a malformed frame") >= len(hostile)-2 && strings.Contains(logs, "event s/k12 failed")
	})
	logs := py.stderrText()
	if n := strings.Count(logs, "dropped a malformed frame"); n != len(hostile)-2 {
		t.Fatalf("%d frames logged as dropped, want %d", n, len(hostile)-2)
	}
	for _, want := range []string{"frame 9: malformed event left unacked", "event s/k12 failed"} {
		if !strings.Contains(logs, want) {
			t.Fatalf("the Python processor did not log %q", want)
		}
	}
}

// bindFakeDaemon binds the sockets of a daemon, a PUSH for frames and a
// PULL for acks, on free ports, closed when the test ends, and returns
// them with their endpoints.
func bindFakeDaemon(t *testing.T) (push, pull *zmq.Socket, pubEP, ackEP string) {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	push, err = zctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	pull, err = zctx.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := push.Close(); err != nil {
			t.Error(err)
		}
		if err := pull.Close(); err != nil {
			t.Error(err)
		}
		if err := zctx.Term(); err != nil {
			t.Error(err)
		}
	})
	pubEP, ackEP = "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t)
	for _, err := range []error{push.SetLinger(0), pull.SetLinger(0), push.SetSndtimeo(30 * time.Second),
		pull.SetRcvtimeo(30 * time.Second), push.Bind(pubEP), pull.Bind(ackEP)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return push, pull, pubEP, ackEP
}

// pyHostileMessage is a message a strict reader of the spec must drop,
// in its parts, and what is wrong with it.
type pyHostileMessage struct {
	name  string
	parts []string
}

// pythonHostileFrames returns the hostile messages, each with its own
// frame id, and a valid frame of two events, a and b, with id validID.
func pythonHostileFrames(validID int) (hostile []pyHostileMessage, valid string) {
	event := func(key, payload string) string {
		return `{"key":"` + key + `","source":"s","seq":1,"fetched_at":"2024-05-01T10:00:00Z",` +
			`"raw":{"key":"s/r.json","off":0,"len":2},` + payload + `}`
	}
	frame := func(head string, id int, events ...string) string {
		return fmt.Sprintf(`{%s,"frame":%d,"delivery":1,"raw_store":"file:///r","events":[%s]}`, head, id, strings.Join(events, ","))
	}
	v1 := `"v":1,"type":"events"`
	good := func(id int) string { return frame(v1, id, event(fmt.Sprintf("k%d", id), `"payload":{}`)) }
	deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	// Each is dropped whole, except the two whose fault is in one event:
	// those are left unacked (and logged) without dropping the frame.
	hostile = []pyHostileMessage{
		{"v is true", []string{frame(`"v":true,"type":"events"`, 1, event("k1", `"payload":{}`))}},
		{"v is 1.0", []string{frame(`"v":1.0,"type":"events"`, 2, event("k2", `"payload":{}`))}},
		{"byte-order mark", []string{"\ufeff" + good(3)}},
		{"multi-part", []string{good(4), good(4)}},
		{"nested deeper than Python's recursion limit", []string{frame(v1, 5, event("k5", `"payload":`+deep))}},
		{"invalid UTF-8", []string{frame(v1, 6, event("k6", "\"payload\":\"\xff\""))}},
		{"events not an array", []string{`{"v":1,"type":"events","frame":7,"delivery":1,"raw_store":"file:///r","events":{}}`}},
		{"NaN", []string{frame(v1, 8, event("k8", `"payload":NaN`))}},
		{"event without source", []string{frame(v1, 9, `{"key":"k9","payload":{}}`)}},
		{"not JSON", []string{"not json"}},
		{"trailing data", []string{good(10) + "{}"}},
		{"wrong type", []string{frame(`"v":1,"type":"ack"`, 11, event("k11", `"payload":{}`))}},
		{"payload_b64 not base64", []string{frame(v1, 12, event("k12", `"payload_b64":"%%%"`))}},
	}
	valid = frame(v1, validID, event("a", `"payload":{"n":1}`), event("b", `"payload_b64":"/w=="`))
	return hostile, valid
}

// checkPythonAckedOnly reads the first ack on pull and checks that it acks
// the frame validID alone, no hostile one.
func checkPythonAckedOnly(t *testing.T, pull *zmq.Socket, py *pyProcess, validID int64) {
	t.Helper()
	// The processor handles frames in order and acks each one it accepts,
	// so the first ack tells whether it accepted any hostile frame.
	reply, err := pull.RecvBytes(0)
	if err != nil {
		t.Fatalf("no ack from the Python processor (alive: %v): %v", py.alive(), err)
	}
	var ack struct {
		V      any     `json:"v"`
		Type   string  `json:"type"`
		Frames []int64 `json:"frames"`
		Keys   []any   `json:"keys"`
	}
	if err := json.Unmarshal(reply, &ack); err != nil {
		t.Fatalf("ack %q: %v", reply, err)
	}
	if ack.V != float64(1) || ack.Type != "ack" || len(ack.Frames) != 1 || ack.Frames[0] != validID || len(ack.Keys) != 0 {
		t.Fatalf("first ack is %s, want only frame %d acked: a hostile frame was acked", reply, validID)
	}
}

// testPythonAgainstDaemon runs the example against the daemon with a demo
// source: it processes and acks events until the queue clears them.
func testPythonAgainstDaemon(t *testing.T) {
	h := startDaemon(t, "", "", `
[source.gen]
kind = "demo"
interval = "20ms"
events_per_tick = 50
`)
	py := startPython(t, h.pub, h.ack)
	const want = 500
	testsync.WaitFor(t, "the Python processor to print 500 events", 60*time.Second, func() bool {
		return len(py.lines()) >= want || !py.alive()
	})
	if !py.alive() {
		t.Fatal("the Python processor exited")
	}
	seen := make(map[string]bool)
	for _, l := range py.lines() {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "gen" {
			t.Fatalf("unexpected output line %q", l)
		}
		seen[f[1]] = true
	}
	for n := 1; n <= want/2; n++ {
		if !seen[fmt.Sprintf("gen-%d", n)] {
			t.Fatalf("event gen-%d was not processed", n)
		}
	}
	testsync.WaitFor(t, "acks from the Python processor to clear frames", 30*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_frames_acked_total") >= want/50
	})
	if n := metric(t, h.d.Registry(), "ingestor_acks_malformed_total"); n != 0 {
		t.Fatalf("the daemon found %v of the Python processor's acks malformed", n)
	}
}
