package main

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// TestRetryAfterSurvivesKill SIGKILLs the built daemon right after the
// upstream answered 503 with Retry-After: 3 and starts it again at once: the
// restarted daemon sends no request before the promised instant, because
// the not-before time was made durable with the source's state before the
// wait began.
func TestRetryAfterSurvivesKill(t *testing.T) {
	bin := buildBinary(t, t.TempDir())
	srv := testupstream.NewServer(t, testupstream.Options{Total: 30, PageSize: 10})
	srv.Script(testupstream.RetryAfter(http.StatusServiceUnavailable, 3))
	dir := t.TempDir()
	httpAddr := testsync.FreePort(t)
	pub, ack := testconfig.FreeEndpoints(t)
	cfgPath := testconfig.Daemon{
		Dir: dir, HTTPAddr: httpAddr, JSONLogs: true, Publish: pub, Ack: ack,
		Rest: fmt.Sprintf(`
[source.seq]
kind = "http_poll"
poll_url = %q
interval = "20ms"
timeout = "5s"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
`, srv.URL+"/feed"),
	}.Write(t, filepath.Join(dir, "ingestor.toml"))
	var logs testsync.LockedBuffer
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "-c", cfgPath)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}

	cmd := start()
	testsync.WaitFor(t, "the daemon to log the Retry-After wait", 30*time.Second, func() bool {
		return strings.Contains(logs.String(), "upstream asked to wait")
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // killed: its exit status is the signal
	refused := srv.Requests()
	if len(refused) != 1 || refused[0].Status != http.StatusServiceUnavailable {
		t.Fatalf("requests before the kill = %+v, want the one 503", refused)
	}
	promised := refused[0].Time.Add(3 * time.Second)
	restarted := time.Now()
	if !restarted.Before(promised) {
		t.Fatalf("the restart began %v after the promised instant: the test proves nothing", restarted.Sub(promised))
	}

	cmd = start()
	defer func() {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Error(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("graceful stop after SIGTERM: %v\n%s", err, tail(logs.String()))
		}
	}()
	waitReady(t, httpAddr, cmd)
	testsync.WaitFor(t, "a request after the restart", 30*time.Second, func() bool { return len(srv.Requests()) > 1 })
	first := srv.Requests()[1]
	t.Logf("first request after the restart came %v after the promised instant", first.Time.Sub(promised))
	if first.Time.Before(promised) {
		t.Fatalf("first request after the restart came %v before the instant promised by Retry-After: 3\n%s",
			promised.Sub(first.Time), tail(logs.String()))
	}
}
