// Package rawretention deletes raw payloads nothing needs any more: a raw
// object or page segment goes once its last write is older than
// [raw_store] retention and no pending event and no dead letter points to
// it (the queue says which keys it still needs). It runs in the daemon;
// a retention of 0 turns it off.
//
// The bound it gives: the raw store holds what was written in the last
// retention, plus what pending events (bounded by max_pending_events) and
// dead letters still point to. An object written less than MinAge ago
// (a minute in the daemon, config.MinRawRetention) is never deleted, so a
// batch between its raw write and its commit keeps its bytes whatever the
// retention.
package rawretention

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingestorhq/ingestor/internal/rawstore"
)

// Store is a raw store that lists its objects and deletes them.
type Store interface {
	Objects(ctx context.Context, fn func(rawstore.Object) error) error
	Delete(ctx context.Context, keys []string) ([]string, error)
	String() string
}

// Queue says which raw keys the queue still needs.
type Queue interface {
	RawKeysInUse(ctx context.Context) (map[string]bool, error)
}

// Options configure a Pruner.
type Options struct {
	Store Store
	Queue Queue
	// Retention is how long an object no one needs is kept after its last
	// write; it must be positive.
	Retention time.Duration
	// MinAge is the age under which an object is never deleted, whatever
	// Retention says; default DefaultMinAge.
	MinAge time.Duration
	// Interval is the time between passes; default Retention/10, between
	// 5 s and 10 min.
	Interval   time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Pruner deletes the raw objects past retention that the queue does not
// need.
type Pruner struct {
	o Options
	m metrics
}

// DefaultMinAge is Options.MinAge's default: a batch is committed (or
// given up and fetched again) within seconds of its raw write.
const DefaultMinAge = time.Minute

// deleteChunk is how many keys one Delete call gets: a pass holds at most
// this many candidates in memory, whatever the store holds.
const deleteChunk = 1000

// New returns a Pruner; Run starts its passes.
// SegmentMaxAge is how old an open page segment of the file store may get
// (rawstore.Options.SegmentMaxAge) under retention: a tenth of it, between
// 10 s and 1 h, so that a slow source's segment, which the pruner never
// deletes while it is open, is closed and pruned about on time. 0 when
// retention is 0 (nothing is pruned).
func SegmentMaxAge(retention time.Duration) time.Duration {
	if retention <= 0 {
		return 0
	}
	return min(max(retention/10, 10*time.Second), time.Hour)
}

func New(o Options) *Pruner {
	if o.Interval <= 0 {
		o.Interval = min(max(o.Retention/10, 5*time.Second), 10*time.Minute)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MinAge <= 0 {
		o.MinAge = DefaultMinAge
	}
	return &Pruner{o: o, m: newMetrics(o.Registerer)}
}

// Result is what one pass found and did.
type Result struct {
	// Objects and Bytes are what the store holds after the pass.
	Objects, Bytes int64
	// Pruned and PrunedBytes are what the pass deleted.
	Pruned, PrunedBytes int64
	// Kept are the objects past retention kept because the queue needs them.
	Kept int64
	// Oldest is the oldest remaining object's last write; zero when empty.
	Oldest time.Time
}

// Run makes a pass every Interval until ctx ends, logging what a pass
// that deleted something or failed did.
func (p *Pruner) Run(ctx context.Context) {
	t := time.NewTicker(p.o.Interval)
	defer t.Stop()
	for {
		r, err := p.Once(ctx, time.Now())
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.m.errors.Inc()
			p.o.Logger.Error("raw retention pass failed; retrying at the next", "store", p.o.Store.String(), "err", err, "pruned", r.Pruned)
		case r.Pruned > 0:
			p.o.Logger.Info("raw payloads past retention deleted", "store", p.o.Store.String(), "objects", r.Pruned, "bytes", r.PrunedBytes,
				"kept_for_queue", r.Kept, "remaining_objects", r.Objects, "remaining_bytes", r.Bytes)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Once makes one pass at now: it asks the queue which keys it needs, then
// lists the store and deletes, chunk by chunk, every object whose last
// write is older than the retention (and than MinAge)
// that the queue does not need. The queue is asked first: a key it starts
// to need during the listing can only be a new one, which is not past
// retention.
func (p *Pruner) Once(ctx context.Context, now time.Time) (Result, error) {
	var r Result
	inUse, err := p.o.Queue.RawKeysInUse(ctx)
	if err != nil {
		return r, err
	}
	cutoff := now.Add(-max(p.o.Retention, p.o.MinAge))
	var chunk []rawstore.Object
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		keys := make([]string, len(chunk))
		size := make(map[string]int64, len(chunk))
		for i, o := range chunk {
			keys[i], size[o.Key] = o.Key, o.Size
		}
		removed, err := p.o.Store.Delete(ctx, keys)
		gone := make(map[string]bool, len(removed))
		for _, k := range removed {
			gone[k] = true
			r.Pruned++
			r.PrunedBytes += size[k]
		}
		for _, o := range chunk { // what Delete left (an open segment) stays
			if !gone[o.Key] {
				r.add(o)
			}
		}
		p.m.pruned.Add(float64(len(removed)))
		p.m.prunedBytes.Add(float64(sumSizes(removed, size)))
		chunk = chunk[:0]
		return err
	}
	err = p.o.Store.Objects(ctx, func(o rawstore.Object) error {
		switch {
		case !o.Modified.Before(cutoff):
			r.add(o)
		case inUse[o.Key]:
			r.Kept++
			r.add(o)
		default:
			chunk = append(chunk, o)
			if len(chunk) == deleteChunk {
				return flush()
			}
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return r, fmt.Errorf("raw retention of %s: %w", p.o.Store, err)
	}
	p.m.objects.Set(float64(r.Objects))
	p.m.bytes.Set(float64(r.Bytes))
	p.m.kept.Set(float64(r.Kept))
	age := 0.0
	if !r.Oldest.IsZero() {
		age = now.Sub(r.Oldest).Seconds()
	}
	p.m.oldestAge.Set(age)
	p.m.lastPass.SetToCurrentTime()
	return r, nil
}

// add counts o as remaining in the store.
func (r *Result) add(o rawstore.Object) {
	r.Objects++
	r.Bytes += o.Size
	if r.Oldest.IsZero() || o.Modified.Before(r.Oldest) {
		r.Oldest = o.Modified
	}
}

func sumSizes(keys []string, size map[string]int64) int64 {
	var n int64
	for _, k := range keys {
		n += size[k]
	}
	return n
}

// metrics are the pruner's Prometheus metrics.
type metrics struct {
	objects, bytes, kept, oldestAge, lastPass prometheus.Gauge
	pruned, prunedBytes, errors               prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		objects: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_raw_store_objects",
			Help: "Raw objects (page segments, whole payloads) in the raw store at the last retention pass."}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_raw_store_bytes",
			Help: "Bytes in the raw store at the last retention pass."}),
		kept: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_raw_store_kept_for_queue_objects",
			Help: "Raw objects past retention kept at the last pass because a pending event or a dead letter points to them."}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_raw_store_oldest_object_age_seconds",
			Help: "Age of the oldest raw object's last write at the last retention pass (0 when the store is empty)."}),
		lastPass: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_raw_retention_last_pass_timestamp_seconds",
			Help: "Unix time of the last raw retention pass that completed."}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_raw_pruned_objects_total",
			Help: "Raw objects deleted by retention."}),
		prunedBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_raw_pruned_bytes_total",
			Help: "Bytes of raw objects deleted by retention."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_raw_retention_errors_total",
			Help: "Raw retention passes that failed (listing, the queue or a delete)."}),
	}
	if reg != nil {
		reg.MustRegister(m.objects, m.bytes, m.kept, m.oldestAge, m.lastPass, m.pruned, m.prunedBytes, m.errors)
	}
	return m
}
