package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestWSIngressAckIsDurable runs the built daemon with a ws_ingress source
// whose token comes from the environment. A wrong token gets 401; a device
// sends 100 envelopes, and the daemon is SIGKILLed the moment the last
// "stored" arrives. Restarted, it answers the same 100 envelopes "stored"
// again (as duplicates) and the ledger holds each exactly once: every ACK
// stood for a durable commit. On SIGTERM the open connection is closed
// with 1001.
func TestWSIngressAckIsDurable(t *testing.T) {
	const total = 100
	const token = "devices-token-0123456789abcdef"
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	httpAddr, pushAddr := testsync.FreePort(t), testsync.FreePort(t)
	cfgPath := filepath.Join(dir, "ingestor.toml")
	cfg := daemonTOML(dir, httpAddr, "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t), "", "") + fmt.Sprintf(`
[push]
addr = %q

[source.devices]
kind = "ws_ingress"
token = "${DEVICES_TOKEN}"
`, pushAddr)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testsync.LockedBuffer
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "-c", cfgPath)
		cmd.Env = append(os.Environ(), "DEVICES_TOKEN="+token)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitReady(t, httpAddr, cmd)
		return cmd
	}
	url := "ws://" + pushAddr + "/ingest/devices/ws"
	dial := func(bearer string) (*websocket.Conn, int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + bearer}}})
		code := 0
		if resp != nil {
			code = resp.StatusCode
			if resp.Body != nil {
				if cerr := resp.Body.Close(); cerr != nil {
					t.Logf("close the handshake body: %v", cerr)
				}
			}
		}
		return conn, code, err
	}
	// sendAll sends every envelope, then waits for an answer to each,
	// failing unless every one is stored.
	sendAll := func(conn *websocket.Conn) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for n := range total {
			msg := fmt.Sprintf(`{"event_id":"ev-%03d","type":"t","ts":"2026-11-24T12:00:00Z","session_id":"s","device_id":"dev-%d","payload":{"n":%d}}`, n, n%7, n)
			if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatalf("send ev-%03d: %v\n%s", n, err, tail(logs.String()))
			}
		}
		stored := map[string]bool{}
		for len(stored) < total {
			_, b, err := conn.Read(ctx)
			if err != nil {
				t.Fatalf("after %d answers: %v\n%s", len(stored), err, tail(logs.String()))
			}
			var a struct {
				EventID string `json:"event_id"`
				Status  string `json:"status"`
			}
			if err := json.Unmarshal(b, &a); err != nil || a.Status != "stored" {
				t.Fatalf("answer %s (%v), want stored", b, err)
			}
			stored[a.EventID] = true
		}
	}

	cmd := start()
	if _, code, err := dial("wrong-token-0123456789abcdef"); err == nil || code != http.StatusUnauthorized {
		t.Fatalf("wrong token: status %d, err %v; want 401", code, err)
	}
	conn, _, err := dial(token)
	if err != nil {
		t.Fatal(err)
	}
	sendAll(conn)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // killed: its exit status is the signal
	if err := conn.CloseNow(); err != nil {
		t.Logf("close the first connection: %v", err)
	}

	cmd = start()
	conn, _, err = dial(token)
	if err != nil {
		t.Fatal(err)
	}
	sendAll(conn)
	closed := make(chan error, 1)
	go func() {
		_, _, err := conn.Read(context.Background())
		closed <- err
	}()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("graceful stop after SIGTERM: %v\n%s", err, tail(logs.String()))
	}
	if got := websocket.CloseStatus(<-closed); got != websocket.StatusGoingAway {
		t.Errorf("on SIGTERM the connection closed with %v, want 1001 (going away)", got)
	}

	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "data", "queue.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	}()
	var rows, keys int
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT key) FROM events WHERE source = 'devices'`).Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	if rows != total || keys != total {
		t.Fatalf("ledger holds %d rows of %d keys, want %d of %d", rows, keys, total, total)
	}
}
