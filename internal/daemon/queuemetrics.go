package daemon

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// registerQueueMetrics registers the queue's gauges, read at scrape time.
func (d *Daemon) registerQueueMetrics() {
	d.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_queue_pending_events",
			Help: "Events in the write-ahead queue not yet acked."}, func() float64 { return float64(d.queue.PendingEvents()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_queue_pending_frames",
			Help: "Frames in the write-ahead queue not yet acked."}, func() float64 { return float64(d.queue.PendingFrames()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_queue_max_pending_events",
			Help: "The configured queue limit at which sources pause."}, func() float64 { return float64(d.cfg.Publish.MaxPendingEvents) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_queue_oldest_pending_age_seconds",
			Help: "Age of the oldest frame not yet acked (0 when none is pending)."}, d.oldestPendingAge),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_queue_ledger_generation_age_seconds",
			Help: "Age of the queue ledger's current generation. Remembered events are forgotten a generation at a time once it is older than dedupe_window, checked every prune_interval; well above that, a frame pending since before the generation began holds the switch back (see ingestor_queue_oldest_pending_age_seconds) and the ledger keeps growing."},
			func() float64 { return time.Since(d.queue.LedgerGeneration()).Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_queue_dedupe_window_seconds",
			Help: "The configured publish.dedupe_window: how long the ledger remembers an event's key, at least (the IngestorLedgerNotRotating alert compares the generation's age with it)."},
			func() float64 { return d.cfg.Publish.DedupeWindow.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_queue_prune_interval_seconds",
			Help: "The configured publish.prune_interval: how often the queue prunes and checks whether the ledger's generation is due to switch."},
			func() float64 { return d.cfg.Publish.PruneInterval.Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ingestor_queue_ledger_forgotten_total",
			Help: "Remembered events the queue's ledger forgot, a generation at a time, since the daemon started."},
			func() float64 { return float64(d.queue.Forgotten()) }),
		&deadLetterGauge{d: d},
	)
}

// oldestPendingAge is the value of ingestor_queue_oldest_pending_age_seconds:
// one primary-key lookup per scrape (queue.OldestPending).
func (d *Daemon) oldestPendingAge() float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	oldest, err := d.queue.OldestPending(ctx)
	if err != nil {
		d.log.Debug("metrics: oldest pending frame", "err", err)
		return 0
	}
	if oldest.IsZero() {
		return 0
	}
	return time.Since(oldest).Seconds()
}

// deadLettersDesc describes ingestor_dead_letters.
var deadLettersDesc = prometheus.NewDesc("ingestor_dead_letters",
	"Active dead letters (neither replayed nor resolved) in the queue, by source: what `ingestor dlq list` lists. Every configured source is exported, at 0 when it has none.",
	[]string{"source"}, nil)

// deadLetterGauge collects ingestor_dead_letters with one grouped count
// of the dead-letter table per scrape (queue.CountsBySource); the table
// is bounded by the dead-letter retention.
type deadLetterGauge struct{ d *Daemon }

// Describe implements prometheus.Collector.
func (g *deadLetterGauge) Describe(ch chan<- *prometheus.Desc) { ch <- deadLettersDesc }

// Collect implements prometheus.Collector: every configured source, and
// any other source that still has dead letters (one removed from the
// config).
func (g *deadLetterGauge) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := g.d.queue.CountsBySource(ctx)
	if err != nil {
		g.d.log.Debug("metrics: dead letters by source", "err", err)
		return
	}
	seen := map[string]bool{}
	for _, src := range g.d.currentConfig().Sources {
		seen[src.Name] = true
		ch <- prometheus.MustNewConstMetric(deadLettersDesc, prometheus.GaugeValue, float64(counts[src.Name].DeadLetters), src.Name)
	}
	for name, c := range counts {
		if !seen[name] && c.DeadLetters > 0 {
			ch <- prometheus.MustNewConstMetric(deadLettersDesc, prometheus.GaugeValue, float64(c.DeadLetters), name)
		}
	}
}
