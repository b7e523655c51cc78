package sources

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// TestWebSocketHandshakeHonoursRetryAfter answers the first handshakes 429
// with Retry-After in seconds and 503 with Retry-After as an HTTP date: no
// handshake may go out before the promised time, and Fetch hands each wait
// to its caller as a *WaitError (which the source actor logs as "upstream
// asked to wait" and counts as a "wait" poll, as for http_poll).
func TestWebSocketHandshakeHonoursRetryAfter(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 3})
	feed.Script(testupstream.RetryAfter(http.StatusTooManyRequests, 1),
		testupstream.RetryAfterDate(http.StatusServiceUnavailable, 2*time.Second))
	var mu sync.Mutex
	var notes []string
	src := openWS(t, wsSpec(feed, nil), Env{Trace: func(ev TraceEvent) {
		mu.Lock()
		defer mu.Unlock()
		notes = append(notes, ev.Note)
	}})

	// Fetch as the source actor does: after a *WaitError, not before its
	// Until.
	var waits []*WaitError
	for got, deadline := 0, time.Now().Add(20*time.Second); got < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("got %d of 3 records before the deadline; waits %v", got, waits)
		}
		b, err := wsFetch(t, src, "")
		var wait *WaitError
		switch {
		case errors.As(err, &wait):
			waits = append(waits, wait)
			timer := time.NewTimer(time.Until(wait.Until))
			select {
			case <-timer.C:
			case <-t.Context().Done():
				timer.Stop()
				t.Fatal(t.Context().Err())
			}
		case err != nil:
			t.Fatal(err)
		default:
			got += len(b.Records)
		}
	}

	hs := feed.Handshakes()
	if len(hs) != 3 || hs[0].Status != http.StatusTooManyRequests || hs[1].Status != http.StatusServiceUnavailable || hs[2].Status != 0 {
		t.Fatalf("handshakes %+v, want 429, 503, then one accepted", hs)
	}
	promised := []time.Time{hs[0].Time.Add(time.Second), hs[1].Time.Add(2 * time.Second).Truncate(time.Second)}
	for i, p := range promised {
		t.Logf("handshake %d went out %v after the Retry-After of the one before", i+1, hs[i+1].Time.Sub(p))
		if hs[i+1].Time.Before(p) {
			t.Errorf("handshake %d at %s, before the Retry-After (%s) of the one before",
				i+1, hs[i+1].Time.Format(time.RFC3339Nano), p.Format(time.RFC3339Nano))
		}
	}
	if len(waits) != 2 {
		t.Fatalf("Fetch returned the waits %v, want one per Retry-After", waits)
	}
	for i, status := range []string{"429", "503"} {
		if waits[i].Until.Before(promised[i]) || !strings.Contains(waits[i].Error(), status) || waits[i].Reason != WaitRetryAfter {
			t.Errorf("wait %d: %v until %s, want status %s and not before %s", i, waits[i], waits[i].Until, status, promised[i])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if traced := strings.Join(notes, "\n"); strings.Count(traced, "Retry-After") != 2 {
		t.Errorf("traces do not show both Retry-After waits:\n%s", traced)
	}
}
