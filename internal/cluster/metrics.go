package cluster

import "github.com/prometheus/client_golang/prometheus"

// Metrics are cluster mode's metrics. A daemon registers them whether or
// not it runs in cluster mode, so that dashboards and alerts need no
// special case; outside cluster mode they stay at 0.
type Metrics struct {
	leaseValid, members, owned, waiting, unplaced, draining prometheus.Gauge
	dbSize, dbInUse                                         prometheus.Gauge
	leaseLost                                               prometheus.Counter
	moves, checkpoints, compactions                         *prometheus.CounterVec
}

// NewMetrics registers cluster mode's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	m := &Metrics{
		leaseValid: gauge("ingestor_cluster_lease_valid", "Cluster mode: 1 while this member's etcd lease is valid as it judges it from its keepalives, else 0 (always 0 outside cluster mode)."),
		members:    gauge("ingestor_cluster_members", "Cluster mode: live members seen at the last placement."),
		owned:      gauge("ingestor_cluster_sources_owned", "Cluster mode: polled sources this member holds and runs."),
		waiting:    gauge("ingestor_cluster_sources_waiting", "Cluster mode: sources placed on this member that another member still holds (it hands them over)."),
		unplaced:   gauge("ingestor_cluster_sources_unplaced", "Cluster mode: enabled polled sources placed on a member that is away (within rebalance_delay), or on none; every member reports the same count."),
		draining:   gauge("ingestor_cluster_draining", "Cluster mode: 1 while this member stops: it waits for its acks before it hands its sources over and leaves."),
		dbSize:     gauge("ingestor_cluster_etcd_db_size_bytes", "Cluster mode: the size of etcd's database file, from the status of the endpoint this member uses."),
		dbInUse:    gauge("ingestor_cluster_etcd_db_size_in_use_bytes", "Cluster mode: the bytes of etcd's database file in use (the rest is freed by defragmentation)."),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_cluster_lease_lost_total",
			Help: "Cluster mode: times this member lost its lease (no keepalive answered within its TTL) and stopped its sources."}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_cluster_source_moves_total",
			Help: "Cluster mode: sources taken by this member, handed over gracefully, or dropped at once (lease lost, checkpoint refused)."},
			[]string{"kind"}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_cluster_checkpoints_total",
			Help: "Cluster mode: settled cursors checkpointed to etcd, refused (another member holds the source) or failed (etcd error)."},
			[]string{"result"}),
		compactions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_cluster_compactions_total",
			Help: "Cluster mode: compactions of etcd's history run by this member (the holder of the compaction key), done or failed."},
			[]string{"result"}),
	}
	reg.MustRegister(m.leaseValid, m.members, m.owned, m.waiting, m.unplaced, m.draining, m.dbSize, m.dbInUse,
		m.leaseLost, m.moves, m.checkpoints, m.compactions)
	for _, k := range []string{"taken", "handed_over", "dropped"} {
		m.moves.WithLabelValues(k)
	}
	for _, r := range []string{"written", "refused", "failed"} {
		m.checkpoints.WithLabelValues(r)
	}
	for _, r := range []string{"done", "failed"} {
		m.compactions.WithLabelValues(r)
	}
	return m
}
