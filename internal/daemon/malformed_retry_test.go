package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// allDeadLetters lists h's dead letters, resolved and replayed ones too.
func allDeadLetters(t *testing.T, h *harness) []queue.DeadLetter {
	t.Helper()
	dl, err := h.d.Queue().ListDeadLetters(t.Context(), queue.DLQFilter{IncludeReplayed: true})
	if err != nil {
		t.Fatal(err)
	}
	return dl
}

// TestTransientMalformedPageIsRetried serves a truncated 200 twice, then
// the good page, with the default malformed_retries (3): the page is
// fetched again, nothing is dead-lettered and every record arrives.
func TestTransientMalformedPageIsRetried(t *testing.T) {
	feed := testupstream.New(t, 50, 100)
	feed.ServeMalformed(testupstream.Truncated, testupstream.Truncated)
	h := startDaemon(t, "", "", httpSource("flaky", feed.URL))
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "every record delivered", 30*time.Second, func() bool { return seen.len() == 50 })
	testsync.WaitFor(t, "queue empty", 30*time.Second, func() bool { return h.d.Queue().PendingEvents() == 0 })
	if n := metric(t, h.d.Registry(), "ingestor_source_malformed_total", "source", "flaky"); n != 2 {
		t.Errorf("malformed counter = %v, want 2", n)
	}
	if dl := allDeadLetters(t, h); len(dl) != 0 {
		t.Errorf("%d dead letter(s) for a page that was good on the third fetch, want none: %+v", len(dl), dl)
	}
	if c := strings.Count(h.logs.String(), "malformed payload; fetching the page again"); c != 2 {
		t.Errorf("logged %d retries of a malformed page, want 2", c)
	}
}

// TestMalformedPageDeadLetteredOnceThenResolved serves a truncated 200 one
// time more than malformed_retries allows, then the good page: the page is
// dead-lettered once, every record arrives, and the dead letter is marked
// resolved and leaves the default list.
func TestMalformedPageDeadLetteredOnceThenResolved(t *testing.T) {
	feed := testupstream.New(t, 50, 100)
	feed.ServeMalformed(testupstream.Truncated, testupstream.Truncated, testupstream.Truncated, testupstream.Truncated)
	h := startDaemon(t, "", "", httpSource("flaky", feed.URL))
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "every record delivered", 30*time.Second, func() bool { return seen.len() == 50 })
	testsync.WaitFor(t, "the dead letter resolved", 10*time.Second, func() bool {
		dl := allDeadLetters(t, h)
		return len(dl) >= 1 && !dl[0].ResolvedAt.IsZero()
	})
	dl := allDeadLetters(t, h)
	if len(dl) != 1 {
		t.Fatalf("%d dead letters, want the page once: %+v", len(dl), dl)
	}
	body, err := h.d.raw.Get(t.Context(), dl[0].RawKey)
	if err != nil || string(body) != testupstream.Truncated {
		t.Errorf("dead-lettered payload = %q, %v; want the truncated page", body, err)
	}
	full, err := h.d.Queue().DeadLetterByID(t.Context(), dl[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if last := full.History[len(full.History)-1]; last.Action != "resolved" {
		t.Errorf("last history entry = %+v, want resolved", last)
	}
	if active, err := h.d.Queue().DeadLetters(t.Context(), 10); err != nil || len(active) != 0 {
		t.Errorf("dead-letter list = %+v, %v; want the resolved entry left out", active, err)
	}
	if st, err := h.d.Queue().Stats(t.Context()); err != nil || st.DeadLetters != 0 {
		t.Errorf("stats count %d dead letters (%v), want 0", st.DeadLetters, err)
	}
}

// TestMalformedStreamPayloadIsDeadLetteredAtOnce uses the demo source, whose
// malformed payloads, like a WebSocket message, cannot be fetched again:
// with the default malformed_retries each is still dead-lettered at once,
// never dropped unseen.
func TestMalformedStreamPayloadIsDeadLetteredAtOnce(t *testing.T) {
	h := startDaemon(t, "", "", `
[source.gen]
kind = "demo"
interval = "20ms"
events_per_tick = 2
malformed_every = 2
`)
	testsync.WaitFor(t, "two malformed payloads", 30*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_source_malformed_total", "source", "gen") >= 2
	})
	testsync.WaitFor(t, "each dead-lettered", 10*time.Second, func() bool { return len(allDeadLetters(t, h)) >= 2 })
	if c := strings.Count(h.logs.String(), "malformed payload; fetching the page again"); c != 0 {
		t.Errorf("a demo payload was fetched again %d time(s); it cannot be", c)
	}
}

// TestPersistentlyMalformedUpstreamIsOneDeadLetter: an upstream that
// serves the same bad page at every poll (malformed_retries = 0) makes one
// dead letter whose count follows the polls, not one entry a poll (13
// identical entries in 70 s before); the malformed counter still counts
// every one.
func TestPersistentlyMalformedUpstreamIsOneDeadLetter(t *testing.T) {
	h := startDaemon(t, "", "", malformedSource(t, "bad", "20ms"))
	testsync.WaitFor(t, "five malformed pages", 30*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_source_malformed_total", "source", "bad") >= 5
	})
	testsync.WaitFor(t, "the dead letter counting them", 10*time.Second, func() bool {
		dl := allDeadLetters(t, h)
		return len(dl) == 1 && dl[0].Count >= 5
	})
	if dl := allDeadLetters(t, h); len(dl) != 1 || dl[0].Source != "bad" || !dl[0].LastSeen.After(dl[0].CreatedAt) {
		t.Fatalf("dead letters %+v, want one of source bad seen again since created", dl)
	}
}

// malformedSource is an http_poll source name polling, every interval
// and with malformed_retries 0, an upstream whose every answer is
// malformed JSON.
func malformedSource(t *testing.T, name, interval string) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"not": "an array"`) //nolint:errcheck // the client's problem
	}))
	t.Cleanup(up.Close)
	return fmt.Sprintf(`
[source.%s]
kind = "http_poll"
poll_url = %q
interval = %q
id_field = "id"
malformed_retries = 0
`, name, up.URL, interval)
}

// TestResolvedDeadLetterExpires: a malformed page is dead-lettered, then
// resolved by the good page; past dead_letter_retention (1 s here) the
// daemon deletes the entry, and its raw payload is no longer one the
// queue needs, so raw retention may delete it. An active dead letter of
// another source, older still, stays. Before, resolved and replayed
// entries stayed for good, and the raw store kept their payloads.
func TestResolvedDeadLetterExpires(t *testing.T) {
	feed := testupstream.New(t, 50, 100)
	feed.ServeMalformed(testupstream.Truncated, testupstream.Truncated, testupstream.Truncated, testupstream.Truncated)
	h := startDaemon(t, "", "prune_interval = \"100ms\"\ndead_letter_retention = \"1s\"\n",
		malformedSource(t, "bad", "1h")+"start_jitter = \"0s\"\n"+httpSource("flaky", feed.URL))
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "every record delivered", 30*time.Second, func() bool { return seen.len() == 50 })
	var resolved queue.DeadLetter
	testsync.WaitFor(t, "the flaky page's dead letter resolved", 10*time.Second, func() bool {
		for _, dl := range allDeadLetters(t, h) {
			if dl.Source == "flaky" && !dl.ResolvedAt.IsZero() {
				resolved = dl
				return true
			}
		}
		return false
	})
	testsync.WaitFor(t, "the bad source's dead letter", 10*time.Second, func() bool {
		active, err := h.d.Queue().DeadLetters(t.Context(), 10)
		return err == nil && len(active) > 0
	})
	testsync.WaitFor(t, "the resolved dead letter deleted", 30*time.Second, func() bool {
		_, err := h.d.Queue().DeadLetterByID(t.Context(), resolved.ID)
		return err != nil
	})
	if took := time.Since(resolved.ResolvedAt); took < time.Second {
		t.Errorf("the resolved dead letter was deleted %v after it was resolved, before its 1s retention", took)
	}
	keys, err := h.d.Queue().RawKeysInUse(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if keys[resolved.RawKey] {
		t.Errorf("the expired dead letter's payload %s is still in use", resolved.RawKey)
	}
	active, err := h.d.Queue().DeadLetters(t.Context(), 10)
	if err != nil || len(active) != 1 || active[0].Source != "bad" || !keys[active[0].RawKey] {
		t.Fatalf("active dead letters = %+v (%v), want the bad source's, its payload in use", active, err)
	}
	// Logged once ExpireDeadLetters has returned, which may be just after
	// the deletion is seen.
	testsync.WaitFor(t, "the deletion logged", 10*time.Second, func() bool {
		return strings.Contains(h.logs.String(), "dead letters: deleted the replayed and resolved ones past their retention")
	})
}
