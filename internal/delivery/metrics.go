package delivery

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the delivery path's Prometheus metrics.
type Metrics struct {
	framesSent   prometheus.Counter
	framesResent prometheus.Counter
	eventsSent   prometheus.Counter
	sendBlocked  prometheus.Counter
	ackTimeouts  prometheus.Counter
	deadLettered prometheus.Counter
	inflight     prometheus.Gauge
	fetchToAck   prometheus.Histogram
	publish      prometheus.Histogram
	acks         prometheus.Counter
	badAcks      prometheus.Counter
	framesAcked  prometheus.Counter

	acksUnknown        prometheus.Counter
	acksOverridden     prometheus.Counter
	ackDisconnects     prometheus.Counter
	nacksRetryable     prometheus.Counter
	eventsDeadLettered prometheus.Counter

	cacheBytes prometheus.Gauge
	cacheFull  prometheus.Counter
	readBack   prometheus.Counter
}

// NewMetrics creates the metrics and registers them on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		framesSent: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_publish_frames_sent_total",
			Help: "Frames sent to processors, first deliveries and resends."}),
		framesResent: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_publish_frames_resent_total",
			Help: "Frames sent again because no ack came in time or the daemon restarted."}),
		eventsSent: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_publish_events_sent_total",
			Help: "Events sent to processors, counting resends."}),
		sendBlocked: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_publish_send_blocked_total",
			Help: "Sends refused by the socket (no processor connected or high-water mark reached)."}),
		ackTimeouts: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_publish_ack_timeouts_total",
			Help: "Frames whose ack did not arrive within the ack timeout."}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_publish_frames_dead_lettered_total",
			Help: "Frames moved to the dead-letter list after max_deliveries."}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_publish_inflight_frames",
			Help: "Frames sent and not yet acked."}),
		fetchToAck: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ingestor_fetch_to_ack_seconds",
			Help:    "Time from fetching a payload to the ack of the frame carrying its events.",
			Buckets: FetchToAckBuckets}),
		publish: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ingestor_publish_latency_seconds",
			Help:    "Time from the commit of a frame's events to the frame's first send to a processor (a backlog shows here).",
			Buckets: FetchToAckBuckets}),
		acks: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_acks_received_total",
			Help: "Ack messages received from processors."}),
		badAcks: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_acks_malformed_total",
			Help: "Ack messages dropped whole as malformed (see PROTOCOL.md); oversize ones are dropped by ZeroMQ unseen."}),
		framesAcked: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_frames_acked_total",
			Help: "Frames cleared from the queue by acks."}),
		acksUnknown: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_acks_unknown_total",
			Help: "Acked or nacked frames and events that were not pending (already acked, dead-lettered or unknown); harmless."}),
		acksOverridden: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_acks_overridden_total",
			Help: "Acks of events that a nack settled with them named: the nack won (the event was dead-lettered or stays pending)."}),
		ackDisconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_ack_disconnects_total",
			Help: "Processor connections to the ack socket closed: a processor stopped, or sent an ack over publish.ack_max_message_bytes."}),
		nacksRetryable: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_nacks_retryable_total",
			Help: "Retryable nacks recorded; the event is redelivered with its frame."}),
		eventsDeadLettered: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_events_dead_lettered_total",
			Help: "Events moved to the dead-letter list: nacked permanently, not acked after max_deliveries, or raw object missing or corrupt."}),
		cacheBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_publish_frame_cache_bytes",
			Help: "Bytes of committed frames held in memory until they are sent, so that frames waiting for the in-flight window are not read back (publish.frame_cache_bytes)."}),
		cacheFull: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_publish_frame_cache_full_total",
			Help: "Committed frames not held in memory because the frame cache was full; they are read back from the queue and the raw store when sent."}),
		readBack: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_publish_frames_read_back_total",
			Help: "Frames read back from the queue and the raw store to be sent: a backlog after a restart, replayed dead letters, frames the frame cache did not hold."}),
	}
	if reg != nil {
		reg.MustRegister(m.framesSent, m.framesResent, m.eventsSent, m.sendBlocked, m.ackTimeouts,
			m.deadLettered, m.inflight, m.fetchToAck, m.publish, m.acks, m.badAcks, m.framesAcked,
			m.acksUnknown, m.acksOverridden, m.ackDisconnects, m.nacksRetryable, m.eventsDeadLettered,
			m.cacheBytes, m.cacheFull, m.readBack)
	}
	return m
}

// FetchToAckBuckets are the bounds of ingestor_fetch_to_ack_seconds: fine
// where latency targets sit (every 10 ms up to 60 ms, so a 50 ms p99 is
// told from a 60 ms one) and up to 5 minutes, so that a p99 above the
// IngestorAckLatencyHigh alert's 60 s still reads above it (a quantile in
// the +Inf bucket reads as the highest finite bound).
var FetchToAckBuckets = []float64{.001, .002, .003, .005, .0075, .01, .015, .02, .03, .04, .05, .06, .075, .1,
	.15, .2, .3, .5, .75, 1, 2, 5, 10, 30, 60, 120, 300}
