package actors

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the pipeline's per-source and per-actor metrics.
type Metrics struct {
	polls           *prometheus.CounterVec
	pollDuration    *prometheus.HistogramVec
	events          *prometheus.CounterVec
	duplicates      *prometheus.CounterVec
	bytes           *prometheus.CounterVec
	malformed       *prometheus.CounterVec
	lastSuccess     *prometheus.GaugeVec
	interval        *prometheus.GaugeVec
	ages            *sourceAges
	paused          *prometheus.GaugeVec
	restarts        *prometheus.CounterVec
	rawPutDuration  prometheus.Histogram
	rawPutErrors    prometheus.Counter
	rawStoreUp      prometheus.Gauge
	rawSpilled      prometheus.Counter
	rawSpillPending prometheus.Gauge
	rawHeld         prometheus.Gauge
	commitDuration  prometheus.Histogram
}

// NewMetrics creates the metrics and registers them on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	src := []string{"source"}
	m := &Metrics{
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_source_polls_total",
			Help: "Fetches by outcome: ok, error (retried with backoff), malformed (fetched again up to malformed_retries times, then dead-lettered) or wait (the upstream said when to come back, by Retry-After or a rate-limit header, or the source's rate limiter has no slot soon; the next fetch waits until then)."}, []string{"source", "result"}),
		pollDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ingestor_source_poll_duration_seconds",
			Help: "Duration of one fetch.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, src),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_source_events_total",
			Help: "New events committed to the queue."}, src),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_source_duplicates_total",
			Help: "Fetched events already queued or remembered, dropped by their idempotency key."}, src),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_source_bytes_total",
			Help: "Raw payload bytes fetched."}, src),
		malformed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_source_malformed_total",
			Help: "Malformed payloads, whether fetched again or dead-lettered."}, src),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ingestor_source_last_success_timestamp_seconds",
			Help: "Unix time of the last successful fetch: one that found nothing new, or whose batch was committed (for a push source, the last committed request)."}, src),
		interval: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ingestor_source_interval_seconds",
			Help: "The configured time between fetches of a polled source (push sources have none)."}, src),
		ages: &sourceAges{states: make(map[string]*sourceState)},
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ingestor_source_paused",
			Help: "1 while the source waits because the queue is at max_pending_events or disk space is low (ingestor_disk_full)."}, src),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_actor_restarts_total",
			Help: "Actor restarts by the supervisor."}, []string{"actor"}),
		rawPutDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ingestor_raw_put_duration_seconds",
			Help: "Duration of one durable raw-store write.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		rawPutErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_raw_put_errors_total",
			Help: "Failed raw-store writes (each is retried with backoff)."}),
		rawStoreUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_raw_store_up",
			Help: "1 if the last raw-store write succeeded, 0 if it failed."}),
		rawSpilled: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_raw_spilled_total",
			Help: "Batches written to the local spill dir after raw_store.max_attempts failed writes."}),
		rawSpillPending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_raw_spill_pending",
			Help: "Spilled batches not yet in the raw store."}),
		rawHeld: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_raw_writes_pending",
			Help: "Payloads (batches and malformed payloads) held in memory until the raw store takes them."}),
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ingestor_queue_commit_duration_seconds",
			Help: "Duration of committing one batch to the write-ahead queue.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
	}
	if reg != nil {
		reg.MustRegister(m.polls, m.pollDuration, m.events, m.duplicates, m.bytes, m.malformed, m.lastSuccess,
			m.interval, m.ages, m.paused, m.restarts, m.rawPutDuration, m.rawPutErrors,
			m.rawStoreUp, m.rawSpilled, m.rawSpillPending, m.rawHeld, m.commitDuration)
	}
	return m
}

// sourceState is what a source reports between scrapes; ages computes the
// lag gauges from it at scrape time, so they keep growing while a source
// is stuck, which is when an SRE looks at them.
type sourceState struct {
	newestRecord atomic.Int64 // unix nanos of the newest record time committed
	lastSuccess  atomic.Int64 // unix nanos of the last successful fetch (nothing new, or committed)
	missingIDs   atomic.Pointer[func() int64]
	status       sourceStatus // for the status page (status.go)
}

// sourceAges is a collector of per-source ages.
type sourceAges struct {
	mu     sync.Mutex
	states map[string]*sourceState
}

var (
	lagDesc = prometheus.NewDesc("ingestor_source_lag_seconds",
		"Age of the newest record time committed for the source (now minus that time).", []string{"source"}, nil)
	sinceSuccessDesc = prometheus.NewDesc("ingestor_source_seconds_since_last_success",
		"Time since the source's last successful fetch: one that found nothing new, or whose batch was committed (for a push source, the last committed request).", []string{"source"}, nil)
	missingIDDesc = prometheus.NewDesc("ingestor_source_records_missing_id_total",
		"Records without the configured id field, keyed by their content hash instead.", []string{"source"}, nil)
)

func (a *sourceAges) state(source string) *sourceState {
	a.mu.Lock()
	defer a.mu.Unlock()
	st, ok := a.states[source]
	if !ok {
		st = &sourceState{}
		a.states[source] = st
	}
	return st
}

// Describe implements prometheus.Collector.
func (a *sourceAges) Describe(ch chan<- *prometheus.Desc) {
	ch <- lagDesc
	ch <- sinceSuccessDesc
	ch <- missingIDDesc
}

// Collect implements prometheus.Collector.
func (a *sourceAges) Collect(ch chan<- prometheus.Metric) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now().UnixNano()
	for name, st := range a.states {
		if t := st.newestRecord.Load(); t != 0 {
			ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(now-t)/1e9, name)
		}
		if t := st.lastSuccess.Load(); t != 0 {
			ch <- prometheus.MustNewConstMetric(sinceSuccessDesc, prometheus.GaugeValue, float64(now-t)/1e9, name)
		}
		if f := st.missingIDs.Load(); f != nil {
			ch <- prometheus.MustNewConstMetric(missingIDDesc, prometheus.CounterValue, float64((*f)()), name)
		}
	}
}

// Pushed records a push source's committed events (package internal/push
// calls it after each group commit), on the same per-source metrics as a
// polled source's: events, duplicates, bytes, lag and last success.
func (m *Metrics) Pushed(source string, newEvents, duplicates, bytes int, newest time.Time) {
	m.events.WithLabelValues(source).Add(float64(newEvents))
	m.duplicates.WithLabelValues(source).Add(float64(duplicates))
	m.bytes.WithLabelValues(source).Add(float64(bytes))
	st := m.ages.state(source)
	for t := st.newestRecord.Load(); !newest.IsZero() && newest.UnixNano() > t; t = st.newestRecord.Load() {
		if st.newestRecord.CompareAndSwap(t, newest.UnixNano()) {
			break
		}
	}
	now := time.Now()
	st.lastSuccess.Store(now.UnixNano())
	st.status.committed(now, newEvents+duplicates, newEvents, bytes)
	m.lastSuccess.WithLabelValues(source).Set(float64(now.UnixNano()) / 1e9)
}
