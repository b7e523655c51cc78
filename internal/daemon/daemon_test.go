package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ingestorhq/ingestor/internal/s3test"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

func httpSource(name, url string) string {
	return fmt.Sprintf(`
[source.%s]
kind = "http_poll"
poll_url = %q
interval = "20ms"
jitter = "10%%"
timeout = "5s"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
time_field = "ts"
`, name, url+"/feed")
}

// TestEndToEndHTTPPollS3 runs every real part: an http_poll source against
// an httptest upstream, the S3 raw store on a real S3-compatible server,
// ZeroMQ over TCP and the processor package.
func TestEndToEndHTTPPollS3(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	const total = 2500
	feed := testupstream.New(t, total, 100)
	raw := fmt.Sprintf("url = %q\nendpoint = %q\nregion = %q\npath_style = true", "s3://"+srv.Bucket+"/raw", srv.Endpoint, srv.Region)
	h := startDaemon(t, raw, `events_per_frame = 40`, httpSource("orders", feed.URL))
	seen := newSeenSet()
	var badPayload atomic.Int64
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		if ev.Source != "orders" || !strings.Contains(string(ev.Payload), `"id":"`+ev.Key+`"`) || ev.Raw.Key == "" {
			badPayload.Add(1)
		}
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "every event delivered", 60*time.Second, func() bool { return seen.len() == total })
	testsync.WaitFor(t, "queue empty after acks", 30*time.Second, func() bool { return h.d.Queue().PendingEvents() == 0 })
	for n := 1; n <= total; n++ {
		if seen.count(testupstream.ID(n)) == 0 {
			t.Fatalf("event %s never reached the processor", testupstream.ID(n))
		}
	}
	if n := badPayload.Load(); n != 0 {
		t.Errorf("%d events arrived with a wrong source, payload or raw reference", n)
	}
	if n := h.d.Queue().PendingFrames(); n != 0 {
		t.Errorf("%d frames still pending", n)
	}

	// Every page the upstream served with records is in the bucket, byte for byte.
	stored := map[string]bool{}
	client := srv.Client()
	p := s3.NewListObjectsV2Paginator(client, &s3.ListObjectsV2Input{Bucket: aws.String(srv.Bucket), Prefix: aws.String("raw/orders/")})
	for p.HasMorePages() {
		page, err := p.NextPage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page.Contents {
			out, err := client.GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String(srv.Bucket), Key: o.Key})
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(out.Body)
			if err := errors.Join(err, out.Body.Close()); err != nil {
				t.Fatal(err)
			}
			stored[string(b)] = true
		}
	}
	served := feed.Served()
	if len(served) < total/100 {
		t.Fatalf("upstream served %d pages, want at least %d", len(served), total/100)
	}
	for _, body := range served {
		if !stored[body] {
			t.Fatalf("a served page is missing from the bucket: %.80s...", body)
		}
	}
}

// TestProcessorDownBoundedThenDelivered keeps the processor away while a
// source produces: events pile up in the on-disk queue up to the configured
// limit, the sources pause, memory stays bounded (the send window), and
// when a processor arrives every event is delivered and the queue drains.
func TestProcessorDownBoundedThenDelivered(t *testing.T) {
	const limit = 3000
	h := startDaemon(t, "", fmt.Sprintf("max_pending_events = %d\nmax_inflight_frames = 8\nack_timeout = \"1s\"", limit), `
[source.gen]
kind = "demo"
interval = "5ms"
events_per_tick = 250
`)
	q := h.d.Queue()
	testsync.WaitFor(t, "queue to reach its limit", 30*time.Second, func() bool { return q.PendingEvents() >= limit })
	testsync.WaitFor(t, "source to pause", 10*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_source_paused", "source", "gen") == 1
	})
	// Paused: the queue stops growing. One poll may have been in flight
	// (inflight_batches x events_per_tick) when the limit was reached.
	atLimit := q.PendingEvents()
	if atLimit > limit+2*250 {
		t.Fatalf("queue grew to %d, beyond limit %d plus the in-flight window", atLimit, limit)
	}
	if n := h.d.sender.Inflight(); n > 8 {
		t.Fatalf("%d frames in flight with no processor, window is 8", n)
	}
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	// Every event queued while the processor was away arrives: ids gen-1..gen-atLimit.
	testsync.WaitFor(t, "backlog delivered", 60*time.Second, func() bool { return seen.len() >= int(atLimit) })
	for n := 1; n <= int(atLimit); n++ {
		if seen.count(fmt.Sprintf("gen-%d", n)) == 0 {
			t.Fatalf("event gen-%d queued while the processor was down never arrived", n)
		}
	}
	testsync.WaitFor(t, "source to resume", 10*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_source_paused", "source", "gen") == 0
	})
}

// TestUnackedFrameIsResent fails the first delivery of every event: nothing
// is acked, so each frame comes back after the ack timeout with its
// delivery count raised, and then is acked.
func TestUnackedFrameIsResent(t *testing.T) {
	feed := testupstream.New(t, 300, 100)
	h := startDaemon(t, "", `ack_timeout = "300ms"`, httpSource("api", feed.URL))
	var mu sync.Mutex
	attempts := map[string]int{}
	redelivered := map[string]bool{}
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[ev.Key]++
		if attempts[ev.Key] == 1 {
			return errors.New("first delivery fails on purpose")
		}
		redelivered[ev.Key] = true
		return nil
	})
	testsync.WaitFor(t, "every event redelivered and acked", 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(redelivered) == 300
	})
	testsync.WaitFor(t, "queue empty", 30*time.Second, func() bool { return h.d.Queue().PendingEvents() == 0 })
	if n := metric(t, h.d.Registry(), "ingestor_publish_frames_resent_total"); n == 0 {
		t.Error("no frame counted as resent")
	}
	if n := metric(t, h.d.Registry(), "ingestor_publish_ack_timeouts_total"); n == 0 {
		t.Error("no ack timeout counted")
	}
}

// TestMalformedUpstreamIsDeadLettered serves a non-JSON body, an object and
// an empty body before good records, with malformed_retries = 0: each is
// counted, logged with the source name and dead-lettered at once with its
// raw payload kept, and the daemon goes on to deliver the good records.
func TestMalformedUpstreamIsDeadLettered(t *testing.T) {
	feed := testupstream.New(t, 50, 100)
	feed.ServeMalformed(testupstream.NotJSON, testupstream.WrongShape, testupstream.Empty)
	h := startDaemon(t, "", "", httpSource("flaky", feed.URL)+"malformed_retries = 0\n")
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "good records delivered", 30*time.Second, func() bool { return seen.len() == 50 })
	// The good page answers the same request (the cursor never moved), so
	// it resolves them: they leave the default list but stay readable.
	testsync.WaitFor(t, "three dead letters, resolved", 10*time.Second, func() bool {
		dl := allDeadLetters(t, h)
		return len(dl) == 3 && !dl[0].ResolvedAt.IsZero() && !dl[1].ResolvedAt.IsZero() && !dl[2].ResolvedAt.IsZero()
	})
	if n := metric(t, h.d.Registry(), "ingestor_source_malformed_total", "source", "flaky"); n != 3 {
		t.Errorf("malformed counter = %v, want 3", n)
	}
	dl := allDeadLetters(t, h)
	wantBodies := map[string]bool{testupstream.NotJSON: true, testupstream.WrongShape: true, testupstream.Empty: true}
	for _, d := range dl {
		if d.Source != "flaky" || d.Reason == "" {
			t.Errorf("dead letter %+v lacks its source or reason", d)
		}
		body, err := h.d.raw.Get(t.Context(), d.RawKey)
		if err != nil {
			t.Fatalf("dead-lettered payload %s not in the raw store: %v", d.RawKey, err)
		}
		if !wantBodies[string(body)] {
			t.Errorf("dead-lettered payload %q is not one the upstream sent", body)
		}
		delete(wantBodies, string(body))
	}
	logs := h.logs.String()
	if c := strings.Count(logs, "malformed payload dead-lettered"); c != 3 {
		t.Errorf("logged %d malformed payloads, want 3", c)
	}
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "malformed payload dead-lettered") && !strings.Contains(line, "source=flaky") {
			t.Errorf("malformed payload logged without its source: %s", line)
		}
	}
}
