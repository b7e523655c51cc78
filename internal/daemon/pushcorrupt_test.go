package daemon

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
)

// TestCorruptPushedBytesAreDeadLettered: three webhook deliveries are
// stored (one page each in the source's page segment) while no processor
// runs; the daemon stops, a byte of the second delivery's page flips on
// disk, and the daemon starts again with a processor. The second event is
// dead-lettered with the page's CRC mismatch and never sent; the others
// arrive. (Push segments had no checksum: the changed bytes were sent.)
func TestCorruptPushedBytesAreDeadLettered(t *testing.T) {
	dir := t.TempDir()
	const sources = `
[push]
addr = "127.0.0.1:0"

[source.hooks]
kind = "webhook"
id_field = "id"
`
	h := startDaemonIn(t, dir, "", "", "", sources, Options{})
	for n := 1; n <= 3; n++ {
		resp, err := http.Post("http://"+h.d.PushAddr()+"/ingest/hooks", "application/json", strings.NewReader(fmt.Sprintf(`{"id":"e%d","n":%d}`, n, n)))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("delivery %d answered %d", n, resp.StatusCode)
		}
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}

	// Flip a byte in the body of the second page.
	var segs []string
	err := filepath.WalkDir(filepath.Join(dir, "raw", "hooks"), func(p string, d os.DirEntry, err error) error {
		if err == nil && rawstore.IsPageSegment(p) {
			segs = append(segs, p)
		}
		return err
	})
	if err != nil || len(segs) != 1 {
		t.Fatalf("the pushed bytes are in %v (%v), want one page segment", segs, err)
	}
	seg, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	at := strings.Index(string(seg), `"n":2`)
	if at < 0 {
		t.Fatalf("the second delivery is not in the segment:\n%s", seg)
	}
	seg[at+4] = '7' // still JSON, wrong bytes
	if err := os.WriteFile(segs[0], seg, 0o644); err != nil {
		t.Fatal(err)
	}

	h = startDaemonIn(t, dir, "", "", "", sources, Options{})
	got := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		if ev.Key == "e2" {
			t.Errorf("the corrupted event was sent: %s", ev.Payload)
		}
		got.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "the good events delivered and the bad one dead-lettered", 30*time.Second, func() bool {
		dl, err := h.d.Queue().DeadLetters(t.Context(), 10)
		if err != nil {
			t.Fatal(err)
		}
		return got.count("e1") == 1 && got.count("e3") == 1 && len(dl) == 1
	})
	dl, err := h.d.Queue().DeadLetters(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if dl[0].Key != "e2" || !strings.Contains(dl[0].Reason, "raw object corrupt: page crc mismatch") {
		t.Errorf("dead letter %s with reason %q, want e2 with the page's CRC mismatch", dl[0].Key, dl[0].Reason)
	}
}
