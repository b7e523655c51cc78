package edge

import (
	"errors"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/edge/edgeconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// scrape returns the value of every unlabelled sample at the metrics
// endpoint addr.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err := errors.Join(err, resp.Body.Close()); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range regexp.MustCompile(`(?m)^(ingestor_edge_[a-z_]+(?:\{reason="[a-z]+"\})?) (\S+)$`).FindAllStringSubmatch(string(body), -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", m[0], err)
		}
		out[m[1]] = v
	}
	return out
}

// TestMetricsEndpoint follows an event through the metrics: accepted and
// waiting while the daemon holds its answer, acked once it stores it.
func TestMetricsEndpoint(t *testing.T) {
	d := newFakeDaemon(t)
	release := holdAll(d)
	defer release()
	o := testOptions(t, d)
	o.MetricsAddr = "127.0.0.1:0"
	f := startForwarder(t, o)
	post(t, f.HTTPAddr(), `{"type":"t","payload":1}`)
	post(t, f.HTTPAddr(), `{"payload":1}`)
	testsync.WaitFor(t, "the event sent", 10*time.Second, func() bool {
		return scrape(t, f.MetricsAddr())["ingestor_edge_sent_total"] == 1
	})
	m := scrape(t, f.MetricsAddr())
	for name, want := range map[string]float64{
		"ingestor_edge_outbox_events": 1, "ingestor_edge_connected": 1, "ingestor_edge_accepted_total": 1,
		`ingestor_edge_refused_total{reason="invalid"}`: 1, "ingestor_edge_acked_total": 0, "ingestor_edge_connects_total": 1,
		"ingestor_edge_outbox_max_bytes": edgeconfig.DefaultMaxOutboxBytes,
	} {
		if m[name] != want {
			t.Errorf("%s = %v, want %v", name, m[name], want)
		}
	}
	if m["ingestor_edge_outbox_bytes"] <= 0 {
		t.Errorf("ingestor_edge_outbox_bytes = %v with an event pending", m["ingestor_edge_outbox_bytes"])
	}
	release()
	testsync.WaitFor(t, "the ACK counted", 10*time.Second, func() bool {
		m := scrape(t, f.MetricsAddr())
		return m["ingestor_edge_acked_total"] == 1 && m["ingestor_edge_outbox_events"] == 0 && m["ingestor_edge_outbox_bytes"] == 0
	})
}
