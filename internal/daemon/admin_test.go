package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// TestNackPoisonAndDLQReplay runs a processor that rejects one event for
// good and fails another every time: the first is dead-lettered at once
// while everything else is delivered once, the second after max_deliveries
// with its last error; both show on the admin endpoints, and replaying the
// second once the processor is fixed delivers it.
func TestNackPoisonAndDLQReplay(t *testing.T) {
	feed := testupstream.New(t, 20, 100)
	h := startDaemon(t, "", "ack_timeout = \"1s\"\nmax_deliveries = 3\nevents_per_frame = 5", httpSource("api", feed.URL))
	rejected, poison := testupstream.ID(3), testupstream.ID(7)
	var healed atomic.Bool
	seen := newSeenSet()
	var mu sync.Mutex
	tries := map[string]int{}
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		mu.Lock()
		tries[ev.Key]++
		mu.Unlock()
		switch {
		case ev.Key == rejected:
			return processor.Permanent(errors.New("fails schema validation"))
		case ev.Key == poison && !healed.Load():
			return errors.New("database refused the row")
		}
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "the other 18 events delivered", 30*time.Second, func() bool { return seen.len() == 18 })
	testsync.WaitFor(t, "two dead letters", 30*time.Second, func() bool {
		dl, err := h.d.Queue().DeadLetters(t.Context(), 10)
		return err == nil && len(dl) == 2
	})
	mu.Lock()
	for k, n := range tries {
		if k != poison && n != 1 {
			t.Errorf("%s handled %d times, want once", k, n)
		}
	}
	if tries[poison] != 3 {
		t.Errorf("poison event handled %d times, want max_deliveries = 3", tries[poison])
	}
	mu.Unlock()

	base := "http://" + h.d.HTTPAddr()
	checkDeadLetterEndpoints(t, base, rejected, poison)

	healed.Store(true)
	var replayed struct{ Replayed int }
	postJSON(t, base+"/dlq/replay", `{"reason":"database refused"}`, http.StatusOK, &replayed)
	if replayed.Replayed != 1 {
		t.Fatalf("replayed %d, want 1", replayed.Replayed)
	}
	testsync.WaitFor(t, "the replayed event delivered", 10*time.Second, func() bool { return seen.count(poison) == 1 })
	testsync.WaitFor(t, "queue empty", 10*time.Second, func() bool { return h.d.Queue().PendingEvents() == 0 })
	var list []queue.DeadLetter
	getJSON(t, base+"/dlq", http.StatusOK, &list)
	if len(list) != 1 || list[0].Key != rejected {
		t.Fatalf("active dead letters after replay = %+v", list)
	}
	var dropped struct{ Dropped int }
	postJSON(t, base+"/dlq/drop", `{"all":true}`, http.StatusOK, &dropped)
	if dropped.Dropped != 1 {
		t.Fatalf("dropped %d, want 1", dropped.Dropped)
	}
	if n := metric(t, h.d.Registry(), "ingestor_events_dead_lettered_total"); n != 2 {
		t.Errorf("ingestor_events_dead_lettered_total = %v, want 2", n)
	}
}

// checkDeadLetterEndpoints checks what the admin endpoints at base show of
// the two dead letters, the rejected event's and the poison one's: the
// list, filtered by source and by reason, one entry with its history and
// payload, and the answers to an unknown id and to bad requests.
func checkDeadLetterEndpoints(t *testing.T, base, rejected, poison string) {
	t.Helper()
	var list []queue.DeadLetter
	getJSON(t, base+"/dlq?source=api", http.StatusOK, &list)
	if len(list) != 2 || list[0].Key != rejected || list[1].Key != poison {
		t.Fatalf("GET /dlq = %+v", list)
	}
	if list[0].Reason != "fails schema validation" {
		t.Errorf("rejected event reason %q", list[0].Reason)
	}
	if r := list[1].Reason; !strings.Contains(r, "not acked after 3 deliveries") || !strings.Contains(r, "database refused the row") {
		t.Errorf("poison event reason %q lacks the delivery count or its last error", r)
	}
	getJSON(t, base+"/dlq?reason=schema", http.StatusOK, &list)
	if len(list) != 1 {
		t.Errorf("GET /dlq?reason=schema = %d entries, want 1", len(list))
	}
	var show queue.DeadLetter
	getJSON(t, base+"/dlq/"+strconv.FormatInt(list[0].ID, 10), http.StatusOK, &show)
	if len(show.History) != 1 || show.History[0].Action != "dead-lettered" || !strings.Contains(show.Payload, `"`+rejected+`"`) {
		t.Errorf("GET /dlq/%d = %+v; want history and the event's payload", list[0].ID, show)
	}
	getJSON(t, base+"/dlq/999999", http.StatusNotFound, nil)
	getJSON(t, base+"/dlq?since=yesterday", http.StatusBadRequest, nil)
	postJSON(t, base+"/dlq/replay", `{}`, http.StatusBadRequest, nil)
}

func getJSON(t *testing.T, url string, status int, out any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	doJSON(t, req, status, out)
}

func postJSON(t *testing.T, url, body string, status int, out any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	doJSON(t, req, status, out)
}

func doJSON(t *testing.T, req *http.Request, status int, out any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := resp.Body.Close(); err != nil {
			t.Error(err)
		}
	}()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != status {
		t.Fatalf("%s %s: status %d, want %d: %s", req.Method, req.URL, resp.StatusCode, status, buf.String())
	}
	if out != nil {
		if err := json.Unmarshal(buf.Bytes(), out); err != nil {
			t.Fatalf("%s %s: %v: %s", req.Method, req.URL, err, buf.String())
		}
	}
}
