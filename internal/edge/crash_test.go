package edge

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/edge/edgeconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestMain runs a forwarder instead of the tests when the crash test
// starts this binary as its child.
func TestMain(m *testing.M) {
	if os.Getenv("EDGE_TEST_CHILD") == "1" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// runChild runs the forwarder the crash test configures through the
// environment, until SIGTERM.
func runChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := Run(ctx, Options{
		Config: edgeconfig.Config{
			URL: os.Getenv("EDGE_URL"), Token: testToken, DeviceID: "dev-crash",
			Outbox: os.Getenv("EDGE_OUTBOX"), HTTPAddr: os.Getenv("EDGE_HTTP"), Window: 16,
			ReconnectBase: 10 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
		},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "forwarder:", err)
		return 1
	}
	return 0
}

// child is a forwarder process started from this test binary.
type child struct {
	cmd  *exec.Cmd
	addr string
	out  *testsync.LockedBuffer
	done chan error
}

// startChild starts a forwarder process on outbox and waits until its
// HTTP input answers.
func startChild(t *testing.T, d *fakeDaemon, outbox string) *child {
	t.Helper()
	for range 5 {
		c := &child{addr: testsync.FreePort(t), out: &testsync.LockedBuffer{}, done: make(chan error, 1)}
		c.cmd = exec.Command(os.Args[0], "-test.run=^$")
		c.cmd.Env = append(os.Environ(), "EDGE_TEST_CHILD=1", "EDGE_URL="+d.url(), "EDGE_OUTBOX="+outbox, "EDGE_HTTP="+c.addr)
		c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { c.done <- c.cmd.Wait() }()
		ready := false
		testsync.WaitFor(t, "the forwarder's HTTP input", 30*time.Second, func() bool {
			select {
			case err := <-c.done:
				c.done <- err
				return true // exited: the port was taken; try another
			default:
			}
			resp, err := http.Get("http://" + c.addr + "/events")
			if err != nil {
				return false
			}
			ready = true
			return resp.Body.Close() == nil
		})
		if ready {
			return c
		}
		t.Logf("forwarder exited before it was ready, retrying on another port:\n%s", c.out.String())
	}
	t.Fatal("the forwarder never started")
	return nil
}

// TestKill9LosesNothingAccepted SIGKILLs the forwarder process five times
// while four producers post events to it, restarting it on the same
// outbox each time. In the end every event it accepted (answered 200)
// reached the daemon, and the outbox is empty.
func TestKill9LosesNothingAccepted(t *testing.T) {
	d := newFakeDaemon(t)
	outbox := filepath.Join(t.TempDir(), "outbox.db")
	var next atomic.Int64
	var mu sync.Mutex
	var accepted []int64
	for cycle := range 5 {
		c := startChild(t, d, outbox)
		target := len(accepted) + 20 + rand.IntN(40)
		var producers sync.WaitGroup
		for range 4 {
			producers.Add(1)
			go func() {
				defer producers.Done()
				for {
					n := next.Add(1)
					resp, err := http.Post("http://"+c.addr+"/events", "application/json",
						strings.NewReader(fmt.Sprintf(`{"type":"crash","payload":{"n":%d}}`, n)))
					if err != nil {
						return // killed
					}
					if err := resp.Body.Close(); err != nil {
						return
					}
					if resp.StatusCode == 200 {
						mu.Lock()
						accepted = append(accepted, n)
						mu.Unlock()
					}
				}
			}()
		}
		testsync.WaitFor(t, fmt.Sprintf("cycle %d: %d accepted events", cycle, target), 60*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(accepted) >= target
		})
		if err := c.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-c.done
		producers.Wait()
	}
	c := startChild(t, d, outbox)
	testsync.WaitFor(t, "every accepted event at the daemon", 60*time.Second, func() bool {
		stored := d.storedPayloads()
		for _, n := range accepted {
			if !stored[fmt.Sprintf(`{"n":%d}`, n)] {
				return false
			}
		}
		return true
	})
	testsync.WaitFor(t, "an empty outbox", 30*time.Second, func() bool {
		s, err := ReadStatus(t.Context(), outbox)
		return err == nil && s.Events == 0
	})
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-c.done; err != nil {
		t.Fatalf("forwarder exit after SIGTERM: %v\n%s", err, c.out.String())
	}
	t.Logf("%d events accepted over 5 kills, %d distinct event ids stored", len(accepted), d.storedCount())
}
