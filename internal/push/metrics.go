package push

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the push listener's metrics. The per-source event, duplicate
// and byte counters are the pipeline's (ingestor_source_*), fed through
// InboxOptions.OnCommit.
type Metrics struct {
	// Requests counts answered push requests by source and HTTP status
	// code (a WebSocket envelope counts as a request, by the status code
	// its answer stands for).
	Requests       *prometheus.CounterVec
	busy           *prometheus.CounterVec
	groupSize      prometheus.Histogram
	commitDuration prometheus.Histogram
	rawErrors      prometheus.Counter
	// signatureMatches counts the webhook signatures that passed, by
	// source and the position of the secret that matched.
	signatureMatches *prometheus.CounterVec
	// rejected counts the webhook deliveries refused, by source and
	// reason; quarantineDropped those the quarantine had no room for.
	rejected          *prometheus.CounterVec
	quarantineDropped *prometheus.CounterVec
	ws                *wsMetrics
}

// NewMetrics creates the metrics and registers them on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_push_requests_total",
			Help: "Push requests answered, by source and HTTP status code."}, []string{"source", "code"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_push_busy_total",
			Help: "Push commits refused for now, by source and reason: queue_full or saturated (answered 429), disk_full (answered 503)."}, []string{"source", "reason"}),
		groupSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ingestor_push_commit_group_size",
			Help:    "Push requests made durable together by one group commit (one raw write per source, one queue transaction).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11)}),
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ingestor_push_commit_duration_seconds",
			Help:    "Time to make one push group durable: raw write and queue commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		rawErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_push_raw_errors_total",
			Help: "Push groups whose raw write failed; their senders were told to retry."}),
		signatureMatches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_webhook_signature_matches_total",
			Help: "Webhook signatures that passed, by source and the position of the secret that matched in secrets (\"0\", \"1\", ...; never its value)."},
			[]string{"source", "secret"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_webhook_rejected_total",
			Help: "Webhook deliveries refused, by source and reason (bad_signature, missing_signature, stale_timestamp, bad_token, missing_token, content_type, too_large, invalid_body, cidr, client_cert, ...)."},
			[]string{"source", "reason"}),
		quarantineDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_webhook_quarantine_dropped_total",
			Help: "Refused webhook deliveries not kept in the quarantine because its write buffer was full, by source."},
			[]string{"source"}),
		ws: newWSMetrics(),
	}
	if reg != nil {
		reg.MustRegister(m.Requests, m.busy, m.groupSize, m.commitDuration, m.rawErrors, m.signatureMatches, m.rejected, m.quarantineDropped)
		reg.MustRegister(m.ws.collectors()...)
	}
	return m
}

// forget deletes the series of a push source that is no longer served.
func (m *Metrics) forget(source string) {
	match := prometheus.Labels{"source": source}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.Requests, m.busy, m.signatureMatches, m.rejected, m.quarantineDropped,
		m.ws.connected, m.ws.envelopes, m.ws.seqGaps, m.ws.seqResets, m.ws.lastSeq} {
		v.DeletePartialMatch(match)
	}
}
