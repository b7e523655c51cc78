package daemon

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// TestWebSocketResumesFromTheDurableCursor runs the whole daemon against a
// WebSocket feed that wants the cursor in the handshake URL (400 without
// it) and drops the connection, with no close frame, after every 1,000
// messages. All 10,000 records arrive, and every reconnect asks for a
// cursor at or past the one that was durable when the connection dropped:
// it resumes, it does not replay from the start or send "{cursor}".
func TestWebSocketResumesFromTheDurableCursor(t *testing.T) {
	const total, dropAfter = 10_000, 1_000
	var (
		q        atomic.Pointer[queue.Queue]
		mu       sync.Mutex
		durables []string // the durable cursor at each drop, in order, or why it is unknown
	)
	feed := testupstream.NewWS(t, testupstream.WSOptions{
		Total: total, SinceInURL: true, DropAfter: dropAfter, Drops: total,
		OnDrop: func() {
			c := ""
			if qq := q.Load(); qq != nil {
				var err error
				if c, _, err = qq.Cursor(context.Background(), "stream"); err != nil {
					// Checked below if a handshake followed this drop.
					c = "read the durable cursor: " + err.Error()
				}
			}
			mu.Lock()
			durables = append(durables, c)
			mu.Unlock()
		},
	})
	h := startDaemon(t, "", "", fmt.Sprintf(`
[source.stream]
kind = "websocket"
url = %q
interval = "20ms"
id_field = "id"
cursor_field = "seq"
initial_cursor = "0"
reconnect_max = "300ms"
`, feed.URL+"/ws/events?since={cursor}"))
	q.Store(h.d.Queue())
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	began := time.Now()
	testsync.WaitFor(t, "all records delivered, or a handshake refused", 60*time.Second, func() bool {
		return seen.len() == total || len(feed.Refused()) > 0
	})
	t.Logf("%d records delivered in %v", seen.len(), time.Since(began).Round(time.Millisecond))
	if refused := feed.Refused(); len(refused) > 0 {
		t.Fatalf("%d handshake(s) refused for want of a cursor in the URL; since = %q", len(refused), refused)
	}
	for n := 1; n <= total; n++ {
		if seen.count(testupstream.WSID(n)) == 0 {
			t.Fatalf("record %s never delivered", testupstream.WSID(n))
		}
	}
	conns := feed.Connections()
	mu.Lock()
	defer mu.Unlock()
	if len(conns) < total/dropAfter || len(durables) < total/dropAfter-1 {
		t.Fatalf("%d connections and %d drops, want at least %d and %d", len(conns), len(durables), total/dropAfter, total/dropAfter-1)
	}
	checkResumedHandshakes(t, conns, durables)
}

// checkResumedHandshakes checks the handshakes of conns, in order, against
// durables, the durable cursor at each drop ("" before any is durable):
// the first asks for initial_cursor, and each later one for a cursor at or
// past the one durable at the drop before it, and not past what the
// previous connection sent.
func checkResumedHandshakes(t *testing.T, conns []testupstream.WSConn, durables []string) {
	t.Helper()
	if conns[0].Since != "0" {
		t.Errorf("first handshake since=%q, want initial_cursor \"0\"", conns[0].Since)
	}
	for i := 1; i < len(conns); i++ {
		since, err := strconv.Atoi(conns[i].Since)
		if err != nil {
			t.Fatalf("handshake %d: since=%q is not a sequence number", i, conns[i].Since)
		}
		durable := 0 // before any is durable
		if durables[i-1] != "" {
			if durable, err = strconv.Atoi(durables[i-1]); err != nil {
				t.Fatalf("handshake %d: the durable cursor at the drop before it is %q", i, durables[i-1])
			}
		}
		prev, _ := strconv.Atoi(conns[i-1].Since)
		t.Logf("handshake %d: since=%d (durable at the drop %d; previous connection sent %d from %d)", i, since, durable, conns[i-1].Sent, prev)
		if since < durable {
			t.Errorf("handshake %d: since=%d is behind the cursor %d that was durable when the connection dropped", i, since, durable)
		}
		if since > prev+conns[i-1].Sent {
			t.Errorf("handshake %d: since=%d is past the %d records the previous connection sent from %d", i, since, conns[i-1].Sent, prev)
		}
	}
}
