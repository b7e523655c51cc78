package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/wire"
)

func TestSmokeDemo(t *testing.T) {
	dir := t.TempDir()
	toml := fmt.Sprintf(`
[daemon]
data_dir = %q
http_addr = "127.0.0.1:0"
[publish]
endpoint = "ipc://%s/pub"
ack_endpoint = "ipc://%s/ack"
ack_timeout = "2s"
[source.demo]
kind = "demo"
interval = "10ms"
events_per_tick = 500
`, dir, dir, dir)
	cfg, err := config.Parse("smoke.toml", []byte(toml))
	if err != nil {
		t.Fatal(err)
	}
	d, err := Start(t.Context(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	zctx, _ := zmq.NewContext()
	pull, _ := zctx.NewSocket(zmq.PULL)
	push, _ := zctx.NewSocket(zmq.PUSH)
	if err := pull.Connect("ipc://" + dir + "/pub"); err != nil {
		t.Fatal(err)
	}
	if err := push.Connect("ipc://" + dir + "/ack"); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	pull.SetRcvtimeo(time.Second)
	for len(seen) < 20000 && time.Now().Before(deadline) {
		msg, err := pull.RecvBytes(0)
		if err != nil {
			continue
		}
		f, err := wire.DecodeFrame(msg)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range f.Events {
			seen[e.Key] = true
		}
		b, _ := wire.EncodeAck(wire.Ack{Frames: []int64{f.ID}})
		push.SendBytes(b, 0)
	}
	t.Logf("seen %d events, pending %d", len(seen), d.Queue().PendingEvents())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	pull.Close()
	push.Close()
	zctx.Term()
	_ = filepath.Join
}
