package edge

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the forwarder's metrics, registered on the registerer of
// Options.
type metrics struct {
	accepted  prometheus.Counter
	refused   *prometheus.CounterVec
	sent      prometheus.Counter
	acked     prometheus.Counter
	rejected  prometheus.Counter
	retried   prometheus.Counter
	connects  prometheus.Counter
	connected prometheus.Gauge
}

// newMetrics creates the metrics, with gauges that read ob's backlog when
// scraped, and registers them on reg (nil: unregistered).
func newMetrics(reg prometheus.Registerer, ob *outbox) (*metrics, error) {
	m := &metrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_edge_accepted_total",
			Help: "Events committed to the outbox and answered OK to their producer."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_edge_refused_total",
			Help: "Events refused to their producer, by reason: invalid (not a valid event), full (the outbox is at max_outbox_bytes) or error (the outbox could not commit)."}, []string{"reason"}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_edge_sent_total",
			Help: "Envelopes sent to the daemon, resends included."}),
		acked: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_edge_acked_total",
			Help: `Envelopes the daemon answered "stored" (deleted from the outbox).`}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_edge_rejected_total",
			Help: `Envelopes the daemon answered "rejected" (moved to the local dead letters).`}),
		retried: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_edge_retried_total",
			Help: `Envelopes the daemon answered "retry" (sent again after retry_after_ms).`}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_edge_connects_total",
			Help: "WebSocket connections opened to the daemon."}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_edge_connected",
			Help: "1 while the forwarder is connected to the daemon."}),
	}
	for _, r := range []string{"invalid", "full", "error"} {
		m.refused.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	events := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_edge_outbox_events",
		Help: "Envelopes in the outbox waiting for their ACK."}, func() float64 {
		n, _ := ob.backlog()
		return float64(n)
	})
	bytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_edge_outbox_bytes",
		Help: "Bytes of the envelopes in the outbox (bounded by max_outbox_bytes)."}, func() float64 {
		_, b := ob.backlog()
		return float64(b)
	})
	maxBytes := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_edge_outbox_max_bytes",
		Help: "max_outbox_bytes: new events are refused once the outbox holds this many bytes."})
	maxBytes.Set(float64(ob.maxBytes))
	oldest := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_edge_outbox_oldest_age_seconds",
		Help: "Age of the oldest envelope in the outbox, 0 when it is empty or unreadable."}, func() float64 {
		s := ob.stats()
		if s.Oldest.IsZero() {
			return 0
		}
		return time.Since(s.Oldest).Seconds()
	})
	dead := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_edge_dead_letters",
		Help: "Envelopes in the local dead-letter table."}, func() float64 {
		return float64(ob.stats().DeadLetters)
	})
	for _, c := range []prometheus.Collector{m.accepted, m.refused, m.sent, m.acked, m.rejected, m.retried,
		m.connects, m.connected, events, bytes, maxBytes, oldest, dead} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
