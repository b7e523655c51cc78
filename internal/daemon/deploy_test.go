package daemon

import (
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestSourceIntervalMetric checks that every polled source exports its
// configured interval, which the IngestorSourceStale alert multiplies by 3.
func TestSourceIntervalMetric(t *testing.T) {
	h := startDaemon(t, "", "", `
[source.slow]
kind = "demo"
interval = "1h"

[source.fast]
kind = "demo"
interval = "2s"
`)
	testsync.WaitFor(t, "interval gauges", 10*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_source_interval_seconds", "source", "slow") == 3600 &&
			metric(t, h.d.Registry(), "ingestor_source_interval_seconds", "source", "fast") == 2
	})
}
