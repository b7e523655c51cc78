package daemon

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestQuietSourceIsNeverLate: an http_poll source whose upstream answers
// every poll with 304 or 200 [] (nothing new, ever) is healthy. Its
// last_success must follow its polls, so the time since it (what `late`
// and the IngestorSourceStale alert measure) never grows past a couple of
// intervals, however long nothing arrives; and `late` is false. Before,
// only a committed batch counted as a success: last_success stayed unset,
// and after 5 minutes the source was reported late and the alert fired.
func TestQuietSourceIsNeverLate(t *testing.T) {
	var polls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if polls.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("ETag", `"empty"`)
		fmt.Fprint(w, "[]") //nolint:errcheck // the client's problem
	}))
	t.Cleanup(up.Close)
	const interval = 100 * time.Millisecond
	h := startDaemon(t, "", "", fmt.Sprintf(`
[source.quiet]
kind = "http_poll"
poll_url = %q
interval = %q
jitter = "10%%"
id_field = "id"
`, up.URL, interval))
	// Watch for 40 intervals, far past the 3 after which a source without
	// a success is late (were the threshold not at least 5 minutes).
	start := polls.Load()
	samples := 0
	testsync.WaitFor(t, "40 intervals of quiet polls", 30*time.Second, func() bool {
		st := getStatus(t, h.d.HTTPAddr())
		var src *SourceStatus
		for i := range st.Sources {
			if st.Sources[i].Name == "quiet" {
				src = &st.Sources[i]
			}
		}
		if src == nil {
			t.Fatalf("no source quiet in /status: %+v", st.Sources)
		}
		if polls.Load()-start < 3 {
			return false // not polled yet: nothing to judge
		}
		samples++
		if src.LastSuccess == nil {
			t.Fatalf("after %d polls that found nothing new, /status shows no last_success: a quiet source would be reported late", polls.Load()-start)
		}
		if since := st.Time.Sub(*src.LastSuccess); since > 3*interval {
			t.Fatalf("%v since the last success although the source polls every %v and every poll succeeds", since, interval)
		}
		if src.Late {
			t.Fatalf("a quiet source whose polls succeed is reported late: %+v", src)
		}
		return polls.Load()-start >= 40
	})
	if samples < 5 {
		t.Fatalf("only %d samples of /status while the source polled", samples)
	}
}
