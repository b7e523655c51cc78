package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestStopsRunInReverse: stops registered in start order run last first,
// each once; a spawned goroutine's stop cancels it and waits for it to
// return; a failed stop is named in the error and the others still run.
func TestStopsRunInReverse(t *testing.T) {
	var s stops
	var order []string
	s.addFunc("a", func() { order = append(order, "a") })
	s.add("b", func() error { order = append(order, "b"); return errors.New("b failed") })
	returned := false
	s.spawn("c", func(ctx context.Context) {
		<-ctx.Done()
		returned = true
	})
	s.addFunc("d", func() { order = append(order, "d") })
	err := s.run()
	if want := []string{"d", "b", "a"}; fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("stopped %v, want %v", order, want)
	}
	if !returned {
		t.Error("run returned before the spawned goroutine did")
	}
	if err == nil || err.Error() != "stop b: b failed" {
		t.Errorf("error %v, want the failed stop named", err)
	}
	order = nil
	if err := s.run(); err != nil || len(order) != 0 {
		t.Errorf("second run stopped %v with error %v, want nothing", order, err)
	}
}

// daemonGoroutines are the functions of the goroutines a daemon starts
// (beside the actors'), each of which its stop must end.
var daemonGoroutines = []string{
	"delivery.(*Sender).Run", "delivery.(*AckReceiver).Run", "diskspace.(*Guard).Run",
	"daemon.(*Daemon).prune", "daemon.(*Daemon).watchConfig", "rawretention.(*Pruner).Run",
	"net/http.(*Server).Serve", "daemon.startSettleRate",
}

// runningDaemonGoroutines counts the goroutines now in a function of
// daemonGoroutines.
func runningDaemonGoroutines() map[string]int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, f := range daemonGoroutines {
			if strings.Contains(g, f) {
				n[f]++
			}
		}
	}
	return n
}

// TestFailedStartStopsWhatItStarted starts a daemon whose last component
// cannot start (push.addr is taken) after everything else did, with a
// config watch, raw retention and an admin listener: Start returns the
// error, every goroutine it started has ended, and a daemon starts at
// once on the same data dir and ZeroMQ endpoints (the lock is released,
// the sockets closed and the ZeroMQ context ended).
func TestFailedStartStopsWhatItStarted(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := taken.Close(); err != nil {
			t.Error(err)
		}
	}()
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, pub: "tcp://" + testsync.FreePort(t), ack: "tcp://" + testsync.FreePort(t)}
	text := func(pushAddr string) string {
		return h.configText("watch_config = true\nadmin_addr = \"127.0.0.1:0\"", fmt.Sprintf("url = %q\nretention = \"1h\"", "file://"+dir+"/raw"), "") +
			fmt.Sprintf("[push]\naddr = %q\n\n[source.hooks]\nkind = \"webhook\"\nid_field = \"id\"\n", pushAddr)
	}
	cfg, err := config.Parse(writeFile(t, dir, "taken.toml", text(taken.Addr().String())), []byte(text(taken.Addr().String())))
	if err != nil {
		t.Fatal(err)
	}
	before := runningDaemonGoroutines()
	d, err := Start(t.Context(), cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		t.Fatalf("started with push.addr %s taken (shutdown: %v)", d.PushAddr(), d.Shutdown(ctx))
	}
	if !strings.Contains(err.Error(), "push") {
		t.Fatalf("error %v, want the push listener's", err)
	}
	if after := runningDaemonGoroutines(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("goroutines after the failed start %v, want %v as before it", after, before)
	}
	cfg, err = config.Parse(writeFile(t, dir, "free.toml", text("127.0.0.1:0")), []byte(text("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	h.logs = &testsync.LockedBuffer{}
	startConfig(t, h, cfg, Options{})
	if h.d.PushAddr() == "" {
		t.Fatal("the second start serves no push listener")
	}
}

// writeFile writes text to dir/name and returns its path.
func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
