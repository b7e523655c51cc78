package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ingestorhq/ingestor/actors"
	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/backoff"
	"github.com/ingestorhq/ingestor/internal/cluster"
	"github.com/ingestorhq/ingestor/sources"
)

// coordinator is this daemon's part of a cluster ([cluster]): it joins as
// a member, runs the polled sources the cluster places here, checkpoints
// their cursors to etcd, and hands them over when they move. Push sources
// are not placed: every member serves them.
type coordinator struct {
	d      *Daemon
	cfg    config.Cluster
	name   string
	info   []byte
	client *clientv3.Client
	log    *slog.Logger

	// applyMu serializes the changes to the pipeline's sources: placement
	// here, and reloads.
	applyMu sync.Mutex

	mu    sync.Mutex
	owned map[string]*ownedSource
	// placed is where the last placement put each enabled polled source.
	placed map[string]string

	metrics *clusterMetrics

	kick chan struct{}
	stop context.CancelFunc
	done chan struct{}
	// closed makes shutdown run once.
	closed   sync.Once
	closeErr error
}

// ownedSource is a source this member holds and runs.
type ownedSource struct {
	o *cluster.Ownership
	// checkpoint is the cursor last written to etcd.
	checkpoint string
}

// clusterMetrics are cluster mode's metrics. They are registered in every
// daemon, so that dashboards and alerts need no special case; outside
// cluster mode they stay at 0.
type clusterMetrics struct {
	leaseValid, members, owned prometheus.Gauge
	moves, checkpoints         *prometheus.CounterVec
}

func newClusterMetrics(reg prometheus.Registerer) *clusterMetrics {
	m := &clusterMetrics{
		leaseValid: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_cluster_lease_valid",
			Help: "Cluster mode: 1 while this member's etcd lease is valid as it judges it from its keepalives, else 0 (always 0 outside cluster mode)."}),
		members: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_cluster_members",
			Help: "Cluster mode: live members seen at the last placement."}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_cluster_sources_owned",
			Help: "Cluster mode: polled sources this member holds and runs."}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_cluster_source_moves_total",
			Help: "Cluster mode: sources taken by this member, handed over gracefully, or dropped at once (lease lost, checkpoint refused)."},
			[]string{"kind"}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_cluster_checkpoints_total",
			Help: "Cluster mode: cursor checkpoints written to etcd, refused (another member holds the source) or failed (etcd error)."},
			[]string{"result"}),
	}
	reg.MustRegister(m.leaseValid, m.members, m.owned, m.moves, m.checkpoints)
	for _, k := range []string{"taken", "handed_over", "dropped"} {
		m.moves.WithLabelValues(k)
	}
	for _, r := range []string{"written", "refused", "failed"} {
		m.checkpoints.WithLabelValues(r)
	}
	return m
}

// memberInfo is the member key's value: what processors need to follow
// the member.
type memberInfo struct {
	Member  string `json:"member"`
	Events  string `json:"events"`
	Acks    string `json:"acks"`
	Version string `json:"version"`
}

// joinRetry is the wait between failed joins (etcd down, or this member's
// previous lease not expired yet after a crash).
var joinRetry = backoff.Policy{Base: 500 * time.Millisecond, Max: 5 * time.Second}

// newCoordinator dials etcd (it does not wait for it) and prepares the
// member's key; start runs it.
func newCoordinator(d *Daemon, cfg *config.Config) (*coordinator, error) {
	name, err := cfg.Cluster.Member()
	if err != nil {
		return nil, err
	}
	info, err := json.Marshal(memberInfo{Member: name, Events: advertise(cfg.Publish.Endpoint, cfg.Cluster.AdvertiseHost),
		Acks: advertise(cfg.Publish.AckEndpoint, cfg.Cluster.AdvertiseHost), Version: Version()})
	if err != nil {
		return nil, err
	}
	client, err := cluster.Dial(cfg.Cluster)
	if err != nil {
		return nil, err
	}
	return &coordinator{d: d, cfg: cfg.Cluster, name: name, info: info, client: client, metrics: d.clusterMetrics,
		log: d.log.With("member", name), owned: map[string]*ownedSource{}, kick: make(chan struct{}, 1)}, nil
}

// advertise returns endpoint with a wildcard host (0.0.0.0, ::, *)
// replaced by host, when host is set.
func advertise(endpoint, host string) string {
	if host == "" {
		return endpoint
	}
	u, err := url.Parse(strings.Replace(endpoint, "://*:", "://0.0.0.0:", 1))
	if err != nil || u.Scheme != "tcp" {
		return endpoint
	}
	switch u.Hostname() {
	case "0.0.0.0", "::", "":
		return "tcp://" + joinHostPort(host, u.Port())
	}
	return endpoint
}

func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

// start runs the coordinator until shutdown.
func (c *coordinator) start() {
	ctx, stop := context.WithCancel(context.Background())
	c.stop, c.done = stop, make(chan struct{})
	go c.run(ctx)
}

// shutdown hands every source over (drained, final cursor checkpointed,
// ownership released), leaves the cluster and closes the etcd client.
func (c *coordinator) shutdown() error {
	c.closed.Do(func() {
		if c.stop != nil {
			c.stop()
			<-c.done
		}
		c.closeErr = c.client.Close()
	})
	return c.closeErr
}

// reload applies a reload's plan in cluster mode: the sources it stops or
// restarts are handed over if held here, the pipeline takes the new
// config, and placement runs again (a restarted source is taken again,
// likely here, with its new settings).
func (c *coordinator) reload(ctx context.Context, plan config.Plan, next *config.Config, limiters *sources.RateLimiters) error {
	for _, name := range slices.Concat(plan.Stop, plan.Restart) {
		c.handOver(ctx, name)
	}
	c.applyMu.Lock()
	err := c.d.pipeline.Apply(ctx, config.Plan{Stop: plan.Stop}, next.Sources, limiters)
	c.d.cfgNow.Store(next)
	c.d.limiters = limiters
	c.applyMu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return err
}

// placedStatus marks in s a polled source this member does not run: it
// is placed on another member, or on none yet.
func (c *coordinator) placedStatus(src config.Source, s *SourceStatus) {
	if _, push := src.Spec.(sources.PushSpec); !src.Enabled || push {
		return
	}
	c.mu.Lock()
	_, here := c.owned[src.Name]
	member := c.placed[src.Name]
	c.mu.Unlock()
	if here {
		return
	}
	s.State, s.Reason, s.Until, s.Late = actors.StateStopped, actors.ReasonElsewhere, nil, false
	switch member {
	case "":
		s.Detail = "not placed yet"
	case c.name:
		s.Detail = "placed here; waiting for the member holding it to hand it over"
	default:
		s.Detail = "placed on member " + member
	}
}

// fence implements actors.Deps.Fence.
func (c *coordinator) fence(source string) (time.Time, bool) {
	c.mu.Lock()
	own := c.owned[source]
	c.mu.Unlock()
	if own == nil || !own.o.Valid() {
		return time.Time{}, false
	}
	return own.o.Deadline(), true
}

// run joins, serves the membership until it is lost or the daemon stops,
// and joins again after a loss.
func (c *coordinator) run(ctx context.Context) {
	defer close(c.done)
	for attempt := 0; ctx.Err() == nil; {
		jctx, cancel := context.WithTimeout(ctx, c.cfg.LeaseTTL)
		m, err := cluster.Join(jctx, c.client, cluster.Options{Cluster: c.cfg.Name, Member: c.name, TTL: c.cfg.LeaseTTL, Info: c.info, Logger: c.log})
		cancel()
		if err != nil {
			wait := joinRetry.Delay(attempt)
			attempt++
			c.log.Warn("cluster: joining failed; retrying", "cluster", c.cfg.Name, "err", err, "retry_in", wait.Round(time.Millisecond))
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		attempt = 0
		c.log.Info("cluster: joined", "cluster", c.cfg.Name, "lease_ttl", c.cfg.LeaseTTL)
		c.serve(ctx, m)
		if ctx.Err() != nil {
			c.leave(m)
			return
		}
		// The lease is lost: every source stops at once (their fence
		// already stopped their polls); another member may hold them now.
		c.dropAll()
	}
}

// serve places sources and checkpoints cursors while m is valid and the
// daemon runs: on every membership change, every checkpoint interval,
// and when kicked (a reload).
func (c *coordinator) serve(ctx context.Context, m *cluster.Member) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := m.WatchMembers(wctx)
	tick := time.NewTicker(c.cfg.CheckpointInterval)
	defer tick.Stop()
	c.reconcile(ctx, m)
	c.metrics.leaseValid.Set(1)
	defer c.metrics.leaseValid.Set(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.Lost():
			return
		case _, ok := <-watch:
			if !ok {
				watch = nil // the periodic pass goes on; a new watch comes with the next join
				continue
			}
		case <-c.kick:
		case <-tick.C:
			c.checkpoint(ctx)
		}
		c.reconcile(ctx, m)
	}
}

// reconcile makes this member run exactly the enabled polled sources the
// cluster places on it: it hands over those placed elsewhere, stops those
// whose hold lapsed, and takes those placed here that no one holds.
func (c *coordinator) reconcile(ctx context.Context, m *cluster.Member) {
	if !m.Valid() {
		c.metrics.leaseValid.Set(0)
		return
	}
	c.metrics.leaseValid.Set(1)
	lctx, cancel := context.WithTimeout(ctx, c.cfg.LeaseTTL)
	members, _, err := m.Members(lctx)
	cancel()
	if err != nil {
		c.log.Warn("cluster: listing members failed; placement waits", "err", err)
		return
	}
	c.metrics.members.Set(float64(len(members)))
	want, placed := map[string]bool{}, map[string]string{}
	for _, s := range c.d.currentConfig().Sources {
		if _, push := s.Spec.(sources.PushSpec); s.Enabled && !push {
			placed[s.Name] = cluster.Place(s.Name, members)
			want[s.Name] = placed[s.Name] == c.name
		}
	}
	c.mu.Lock()
	c.placed = placed
	c.mu.Unlock()
	c.mu.Lock()
	owned := maps.Clone(c.owned)
	c.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(owned)) {
		switch {
		case !owned[name].o.Valid():
			c.drop(name, "this member's hold lapsed")
		case !want[name]:
			c.handOver(ctx, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := owned[name]; ok || !want[name] || ctx.Err() != nil || !m.Valid() {
			continue
		}
		c.take(ctx, m, name)
	}
}

// take acquires name, installs its checkpointed cursor and starts it.
func (c *coordinator) take(ctx context.Context, m *cluster.Member, name string) {
	actx, cancel := context.WithTimeout(ctx, c.cfg.LeaseTTL)
	defer cancel()
	o, holder, err := m.Acquire(actx, name)
	if err != nil || o == nil {
		if err != nil {
			c.log.Warn("cluster: taking a source failed", "source", name, "err", err)
		} else {
			c.log.Debug("cluster: source placed here is still held; waiting for its release", "source", name, "holder", holder)
		}
		return
	}
	cursor, ok, err := m.Checkpointed(actx, name)
	if err == nil && ok {
		err = c.d.queue.SetCursor(actx, name, cursor)
	}
	if err != nil {
		c.log.Warn("cluster: reading the handed-over cursor failed; releasing the source", "source", name, "err", err)
		c.release(o, "")
		return
	}
	c.mu.Lock()
	c.owned[name] = &ownedSource{o: o, checkpoint: cursor}
	c.metrics.owned.Set(float64(len(c.owned)))
	c.mu.Unlock()
	c.metrics.moves.WithLabelValues("taken").Inc()
	if err := c.apply(ctx, config.Plan{Start: []string{name}}); err != nil {
		c.log.Error("cluster: starting a source placed here failed", "source", name, "err", err)
		return
	}
	c.log.Info("cluster: source placed here", "source", name, "cursor", cursor, "checkpointed", ok)
}

// handOver stops name gracefully (its fetched batches commit) and
// releases it with its final cursor, so the next owner fetches nothing
// twice.
func (c *coordinator) handOver(ctx context.Context, name string) {
	own := c.forget(name)
	if own == nil {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, c.d.cfg.Daemon.ShutdownGrace)
	defer cancel()
	c.applyMu.Lock()
	err := c.d.pipeline.HandOver(dctx, name)
	c.applyMu.Unlock()
	if err != nil {
		c.log.Error("cluster: stopping a source to hand it over failed", "source", name, "err", err)
	}
	cursor, _, err := c.d.queue.Cursor(dctx, name)
	if err != nil {
		c.log.Warn("cluster: reading the final cursor failed; the next owner resumes from the last checkpoint", "source", name, "err", err)
		cursor = ""
	}
	c.release(own.o, cursor)
	c.metrics.moves.WithLabelValues("handed_over").Inc()
	c.log.Info("cluster: source handed over", "source", name, "cursor", cursor)
}

// release gives up o, writing cursor as the final checkpoint unless it is
// empty.
func (c *coordinator) release(o *cluster.Ownership, cursor string) {
	rctx, cancel := context.WithTimeout(context.Background(), c.cfg.LeaseTTL)
	defer cancel()
	if err := o.Release(rctx, cursor); err != nil {
		c.log.Warn("cluster: releasing a source failed; it moves when the lease expires", "source", o.Source(), "err", err)
	}
}

// drop stops name at once: this member no longer holds it.
func (c *coordinator) drop(name, why string) {
	if c.forget(name) == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.d.cfg.Daemon.ShutdownGrace)
	defer cancel()
	if err := c.apply(ctx, config.Plan{Stop: []string{name}}); err != nil {
		c.log.Error("cluster: stopping a source failed", "source", name, "err", err)
	}
	c.metrics.moves.WithLabelValues("dropped").Inc()
	c.log.Warn("cluster: source stopped", "source", name, "reason", why)
}

// dropAll stops every source this member runs: its lease is lost.
func (c *coordinator) dropAll() {
	c.mu.Lock()
	names := slices.Sorted(maps.Keys(c.owned))
	c.mu.Unlock()
	for _, name := range names {
		c.drop(name, "the member's lease is lost")
	}
}

// leave hands every source over and leaves the cluster: the daemon stops.
func (c *coordinator) leave(m *cluster.Member) {
	c.mu.Lock()
	names := slices.Sorted(maps.Keys(c.owned))
	c.mu.Unlock()
	for _, name := range names {
		c.handOver(context.Background(), name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LeaseTTL)
	defer cancel()
	if err := m.Leave(ctx); err != nil {
		c.log.Warn("cluster: leaving failed; the lease expires by itself", "err", err)
	}
	c.log.Info("cluster: left", "cluster", c.cfg.Name)
}

// forget removes name from the sources this member holds, so that its
// fence fails from now on, and returns what it held.
func (c *coordinator) forget(name string) *ownedSource {
	c.mu.Lock()
	defer c.mu.Unlock()
	own := c.owned[name]
	delete(c.owned, name)
	c.metrics.owned.Set(float64(len(c.owned)))
	return own
}

// checkpoint writes the durable cursor of each source held whose cursor
// moved since its last checkpoint. A checkpoint refused (the hold is gone)
// stops the source.
func (c *coordinator) checkpoint(ctx context.Context) {
	c.mu.Lock()
	owned := maps.Clone(c.owned)
	c.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(owned)) {
		own := owned[name]
		cursor, ok, err := c.d.queue.Cursor(ctx, name)
		if err != nil || !ok || cursor == own.checkpoint {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, c.cfg.LeaseTTL)
		err = own.o.Checkpoint(cctx, cursor)
		cancel()
		switch {
		case errors.Is(err, cluster.ErrNotOwner):
			c.metrics.checkpoints.WithLabelValues("refused").Inc()
			c.drop(name, "its checkpoint was refused: another member holds it")
		case err != nil:
			c.metrics.checkpoints.WithLabelValues("failed").Inc()
			c.log.Warn("cluster: checkpoint failed; retrying", "source", name, "err", err)
		default:
			c.metrics.checkpoints.WithLabelValues("written").Inc()
			c.mu.Lock()
			if cur := c.owned[name]; cur == own {
				own.checkpoint = cursor
			}
			c.mu.Unlock()
		}
	}
}

// apply changes the pipeline's running sources; placement and reloads
// take turns.
func (c *coordinator) apply(ctx context.Context, plan config.Plan) error {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	cfg := c.d.currentConfig()
	if err := c.d.pipeline.Apply(ctx, plan, cfg.Sources, c.d.limiters); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}
