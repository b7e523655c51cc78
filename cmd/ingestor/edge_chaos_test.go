package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/edge"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
)

// edgeToken is the ws_ingress token of the chaos test.
const edgeToken = "edge-chaos-token-0123456789abcdef"

// proc is a process of the built binary that the chaos test kills.
type proc struct {
	cmd *exec.Cmd
	// done is closed once the process exited; err is then its exit error.
	done chan struct{}
	err  error
}

func startProc(t *testing.T, logs *testsync.LockedBuffer, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "EDGE_TOKEN="+edgeToken)
	p.cmd.Stdout, p.cmd.Stderr = logs, logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	// A failing test must not leave its processes running.
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// wait returns the exit error once the process exited.
func (p *proc) wait() error {
	<-p.done
	return p.err
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// TestEdgeChaosLosesNothing runs the built daemon with a ws_ingress source
// and the built forwarder feeding it, while four producers post events to
// the forwarder and a processor acks. Twenty times, at a random moment, it
// SIGKILLs the daemon, the forwarder or both and starts them again. In the
// end every event the forwarder accepted (answered 200) reached the
// processor, and the forwarder's outbox is empty.
func TestEdgeChaosLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the daemon and the forwarder repeatedly")
	}
	t.Parallel() // long and mostly waiting: overlaps the other long tests (make test's wall time)
	const cycles = 20
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	httpAddr, pushAddr, edgeAddr := testsync.FreePort(t), testsync.FreePort(t), testsync.FreePort(t)
	pub, ack := "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t)
	cfgPath := filepath.Join(dir, "ingestor.toml")
	cfg := daemonTOML(dir, httpAddr, pub, ack, "", `ack_timeout = "2s"`) + fmt.Sprintf(`
[push]
addr = %q

[source.devices]
kind = "ws_ingress"
token = "${EDGE_TOKEN}"
`, pushAddr)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	outbox := filepath.Join(dir, "edge", "outbox.db")

	var mu sync.Mutex
	seen := map[int64]bool{}
	defer startProcessor(t, pub, ack, func(_ context.Context, ev *processor.Event) error {
		var env struct {
			Payload struct {
				N int64 `json:"n"`
			} `json:"payload"`
		}
		if err := json.Unmarshal(ev.Payload, &env); err != nil {
			return processor.Permanent(err)
		}
		mu.Lock()
		seen[env.Payload.N] = true
		mu.Unlock()
		return nil
	})()

	var logs testsync.LockedBuffer
	startDaemon := func() *proc {
		p := startProc(t, &logs, bin, "run", "-c", cfgPath)
		waitReady(t, httpAddr, p.cmd)
		return p
	}
	startEdge := func() *proc {
		p := startProc(t, &logs, bin, "edge", "-url", "ws://"+pushAddr+"/ingest/devices/ws", "-token-env", "EDGE_TOKEN",
			"-device-id", "dev-chaos", "-outbox", outbox, "-http", edgeAddr, "-window", "16",
			"-reconnect-base", "10ms", "-reconnect-max", "200ms", "-ack-timeout", "5s")
		testsync.WaitFor(t, "the forwarder's HTTP input", 30*time.Second, func() bool {
			if p.exited() {
				t.Fatalf("the forwarder exited before it was ready\n%s", tail(logs.String()))
			}
			resp, err := http.Get("http://" + edgeAddr + "/events")
			return err == nil && resp.Body.Close() == nil
		})
		return p
	}

	var next atomic.Int64
	var accepted []int64
	produce := func(stop <-chan struct{}, wg *sync.WaitGroup) {
		defer wg.Done()
		client := &http.Client{Timeout: 10 * time.Second}
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := next.Add(1)
			resp, err := client.Post("http://"+edgeAddr+"/events", "application/json",
				strings.NewReader(fmt.Sprintf(`{"type":"chaos","payload":{"n":%d}}`, n)))
			if err != nil {
				time.Sleep(5 * time.Millisecond) // the forwarder is down: a producer retries later, not a wait for a condition
				continue
			}
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				mu.Lock()
				accepted = append(accepted, n)
				mu.Unlock()
			}
		}
	}
	acceptedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted)
	}

	daemon, fwd := startDaemon(), startEdge()
	stop := make(chan struct{})
	var producers sync.WaitGroup
	for range 4 {
		producers.Add(1)
		go produce(stop, &producers)
	}
	for i := range cycles {
		target := acceptedCount() + 10
		testsync.WaitFor(t, fmt.Sprintf("cycle %d: 10 more events accepted", i), 60*time.Second, func() bool {
			return acceptedCount() >= target
		})
		time.Sleep(time.Duration(rand.Int64N(int64(200 * time.Millisecond)))) // a random kill moment, not a wait for a condition
		switch rand.IntN(3) {
		case 0:
			daemon.kill(t)
			daemon = startDaemon()
		case 1:
			fwd.kill(t)
			fwd = startEdge()
		default:
			daemon.kill(t)
			fwd.kill(t)
			daemon, fwd = startDaemon(), startEdge()
		}
	}
	close(stop)
	producers.Wait()
	total := acceptedCount()
	t.Logf("after %d kill cycles: %d events accepted by the forwarder", cycles, total)

	missing := func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		var out []int64
		for _, n := range accepted {
			if !seen[n] {
				out = append(out, n)
			}
		}
		return out
	}
	for deadline := time.Now().Add(2 * time.Minute); len(missing()) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			m := missing()
			st, err := edge.ReadStatus(t.Context(), outbox)
			t.Fatalf("%d of %d accepted events never reached the processor (first %v); outbox %+v (err %v); daemon pending %v\n%s",
				len(m), total, m[:min(len(m), 10)], st, err, pendingEvents(t, httpAddr), tail(logs.String()))
		}
	}
	testsync.WaitFor(t, "an empty outbox", time.Minute, func() bool {
		s, err := edge.ReadStatus(t.Context(), outbox)
		return err == nil && s.Events == 0
	})
	for _, p := range []*proc{fwd, daemon} {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := p.wait(); err != nil {
			t.Fatalf("graceful stop after SIGTERM: %v\n%s", err, tail(logs.String()))
		}
	}
	// The forwarder numbered every accepted event (seq 1, 2, ...), and the
	// daemon's record of them shows none lost and no counter reset.
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "data", "queue.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var high, gaps, resets int64
	var missingSeqs string
	if err := db.QueryRow(`SELECT high, missing, gaps, resets FROM device_seqs WHERE source = 'devices' AND device = 'dev-chaos'`).
		Scan(&high, &missingSeqs, &gaps, &resets); err != nil {
		t.Fatalf("the daemon kept no seq of the device: %v", err)
	}
	edgeDB, err := sql.Open("sqlite3", "file:"+outbox+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer edgeDB.Close()
	var numbered int64
	if err := edgeDB.QueryRow(`SELECT last FROM seq WHERE device_id = 'dev-chaos'`).Scan(&numbered); err != nil {
		t.Fatal(err)
	}
	// The forwarder may have numbered a few more than the producers
	// counted: an event stored while the forwarder was killed before it
	// answered.
	if high != numbered || numbered < int64(total) || missingSeqs != "[]" || gaps != 0 || resets != 0 {
		t.Errorf("device seqs: high %d, the forwarder numbered %d (%d accepted), missing %s, gaps %d, resets %d: want every seq stored, none lost or reset",
			high, numbered, total, missingSeqs, gaps, resets)
	}
}
