package cluster

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ingestorhq/ingestor/internal/backoff"
)

// Host is what a Coordinator drives: the daemon's pipeline and queue.
type Host interface {
	// Placeable returns the sources to place: the enabled polled ones.
	Placeable() []string
	// Start starts source here, with cursor installed first when
	// checkpointed (the settled cursor it was handed over with).
	Start(ctx context.Context, source, cursor string, checkpointed bool) error
	// HandOver stops source gracefully: a fetch in progress commits.
	HandOver(ctx context.Context, source string) error
	// Stop stops source at once.
	Stop(ctx context.Context, source string) error
	// Cursor returns source's committed cursor.
	Cursor(ctx context.Context, source string) (string, bool, error)
	// Settled returns the settled cursors of sources, of those that have
	// one: every event committed up to it is acked or dead-lettered.
	Settled(ctx context.Context, sources []string) (map[string]string, error)
	// Forget drops what the host remembers of source's settled cursors.
	Forget(source string)
}

// CoordinatorOptions configure a Coordinator.
type CoordinatorOptions struct {
	// Cluster and Member are the cluster's and this member's names.
	Cluster, Member string
	// LeaseTTL, CheckpointInterval, RebalanceDelay, CompactInterval and
	// MaxTxnOps are [cluster]'s settings of the same names.
	LeaseTTL, CheckpointInterval, RebalanceDelay, CompactInterval time.Duration
	MaxTxnOps                                                     int
	// Info is the member key's value, DrainingInfo its value while the
	// member drains.
	Info, DrainingInfo []byte
	// HandOverWait bounds how long a source moving away waits for its
	// events to be acked, so that the next owner fetches nothing again.
	HandOverWait time.Duration
	// Metrics, when set, are kept up to date.
	Metrics *Metrics
	// Logger receives the coordinator's logs.
	Logger *slog.Logger
}

// Coordinator is a daemon's part of a cluster: it joins as a member, runs
// the sources the cluster places here, checkpoints their settled cursors
// to etcd, and hands them over when they move or the daemon stops.
type Coordinator struct {
	client *clientv3.Client
	host   Host
	o      CoordinatorOptions
	log    *slog.Logger
	m      *Metrics

	// passMu makes placement passes, checkpoints and the drain take
	// turns.
	passMu sync.Mutex

	mu     sync.Mutex
	member *Member
	owned  map[string]*ownedSource
	// placed is where the last placement put each source, live the
	// members seen then, and candidates and sources what it was
	// computed from (it is computed again only when they change).
	placed                    map[string]string
	live                      map[string]bool
	candidates, placedSources []string
	draining                  bool

	kick chan struct{}
	stop context.CancelFunc
	done chan struct{}
}

// ownedSource is a source this member holds and runs.
type ownedSource struct {
	o *Ownership
	// checkpoint is the cursor last written to etcd.
	checkpoint string
}

// joinRetry is the wait between failed joins: short, so that a member
// polls again soon after etcd answers again.
var joinRetry = backoff.Policy{Base: 200 * time.Millisecond, Max: time.Second}

// NewCoordinator returns a coordinator for host on client; Start runs it.
func NewCoordinator(client *clientv3.Client, host Host, o CoordinatorOptions) *Coordinator {
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nopRegisterer{})
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxTxnOps < 4 {
		o.MaxTxnOps = 128
	}
	return &Coordinator{client: client, host: host, o: o, log: o.Logger, m: o.Metrics,
		owned: map[string]*ownedSource{}, kick: make(chan struct{}, 1)}
}

// Start runs the coordinator until Shutdown.
func (c *Coordinator) Start() {
	ctx, stop := context.WithCancel(context.Background())
	c.stop, c.done = stop, make(chan struct{})
	go c.run(ctx)
}

// Kick makes the coordinator place the sources again (the source set
// changed).
func (c *Coordinator) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Fence reports whether this member holds source, and until when its
// lease is valid as it judges it: a poll must end by then.
func (c *Coordinator) Fence(source string) (time.Time, bool) {
	c.mu.Lock()
	own := c.owned[source]
	c.mu.Unlock()
	if own == nil || !own.o.Valid() {
		return time.Time{}, false
	}
	return own.o.Deadline(), true
}

// Placement returns the member source is placed on ("" when none yet),
// and whether this member holds it.
func (c *Coordinator) Placement(source string) (member string, here bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, here = c.owned[source]
	return c.placed[source], here
}

// Name returns this member's name.
func (c *Coordinator) Name() string { return c.o.Member }

// run joins, serves the membership until it is lost or the coordinator
// stops, and joins again after a loss: at once, after revoking the lost
// lease, which etcd would otherwise keep until it expires.
func (c *Coordinator) run(ctx context.Context) {
	defer close(c.done)
	var stale *Member
	for attempt := 0; ctx.Err() == nil; {
		if stale != nil {
			rctx, cancel := context.WithTimeout(ctx, c.o.LeaseTTL)
			if err := stale.Revoke(rctx); err == nil {
				stale = nil
			}
			cancel()
		}
		jctx, cancel := context.WithTimeout(ctx, c.o.LeaseTTL)
		m, err := Join(jctx, c.client, Options{Cluster: c.o.Cluster, Member: c.o.Member, TTL: c.o.LeaseTTL,
			Info: c.o.Info, RebalanceDelay: c.o.RebalanceDelay, Logger: c.log})
		cancel()
		if err != nil {
			wait := joinRetry.Delay(attempt)
			attempt++
			if attempt == 1 || attempt%10 == 0 {
				c.log.Warn("cluster: joining failed; retrying", "cluster", c.o.Cluster, "err", err, "retry_in", wait.Round(time.Millisecond), "attempt", attempt)
			}
			if !backoff.Sleep(ctx, wait) {
				return
			}
			continue
		}
		attempt = 0
		c.mu.Lock()
		c.member, c.candidates = m, nil
		c.mu.Unlock()
		c.log.Info("cluster: joined", "cluster", c.o.Cluster, "lease_ttl", c.o.LeaseTTL, "rebalance_delay", c.o.RebalanceDelay)
		c.serve(ctx, m)
		if ctx.Err() != nil {
			return
		}
		// The lease is lost: every source stops at once (their fence
		// already stopped their polls); another member may hold them now.
		c.m.leaseLost.Inc()
		c.dropAll("the member's lease is lost")
		stale = m
	}
}

// serve places sources and checkpoints cursors while m is valid and the
// coordinator runs. Placement is computed again when the members, their
// seats or the source set change; every checkpoint interval the settled
// cursors are written and sources placed here but still held elsewhere
// are tried again.
func (c *Coordinator) serve(ctx context.Context, m *Member) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchMembers := m.WatchMembers(wctx)
	var watchSeats clientv3.WatchChan
	if c.o.RebalanceDelay > 0 {
		watchSeats = m.WatchSeats(wctx)
	}
	tick := time.NewTicker(c.o.CheckpointInterval)
	defer tick.Stop()
	var compact <-chan time.Time
	if c.o.CompactInterval > 0 {
		t := time.NewTicker(c.o.CompactInterval)
		defer t.Stop()
		compact = t.C
	}
	status := time.NewTicker(statusInterval)
	defer status.Stop()
	c.m.leaseValid.Set(1)
	defer c.m.leaseValid.Set(0)
	c.reconcile(ctx, m, true)
	c.dbStatus(ctx, m)
	var lastRev int64
	for {
		relist := false
		select {
		case <-ctx.Done():
			return
		case <-m.Lost():
			return
		case _, ok := <-watchMembers:
			relist = true
			if !ok {
				watchMembers = nil // listed on every tick until the next join
			}
		case _, ok := <-watchSeats:
			relist = true
			if !ok {
				watchSeats = nil
			}
		case <-c.kick:
			relist = true
		case <-tick.C:
			c.checkpoint(ctx, m)
			// The members are listed again on every tick too (a range
			// read, no write): a watch starts on the server after the
			// call returns, so a join in between is seen only here.
			// Placement is computed again only if the list changed.
			relist = true
		case <-compact:
			lastRev = c.compact(ctx, m, lastRev)
			continue
		case <-status.C:
			c.dbStatus(ctx, m)
			continue
		}
		c.reconcile(ctx, m, relist)
	}
}

// statusInterval is how often etcd's database size is read.
const statusInterval = 10 * time.Second

// Drain marks the member as draining: it takes and hands over nothing
// more, keeps checkpointing, and its member key says "draining" so that
// processors and operators see it. Its sources stop polling, each as for
// a hand-over. Shutdown then hands them over and leaves; the daemon
// drains its pipeline (acks included) in between.
func (c *Coordinator) Drain(ctx context.Context) {
	c.passMu.Lock()
	c.mu.Lock()
	c.draining = true
	m := c.member
	c.mu.Unlock()
	c.passMu.Unlock()
	c.m.draining.Set(1)
	if m != nil && m.Valid() && c.o.DrainingInfo != nil {
		if err := m.SetInfo(ctx, c.o.DrainingInfo); err != nil {
			c.log.Warn("cluster: marking the member draining failed", "err", err)
		}
	}
	c.mu.Lock()
	names := slices.Sorted(maps.Keys(c.owned))
	c.mu.Unlock()
	c.log.Info("cluster: draining; sources stay here until their events are acked", "sources", len(names))
	// Stopped as for a hand-over: a fetch in progress finishes and
	// commits, so the next owner does not fetch its page again.
	each(names, func(name string) {
		if err := c.host.HandOver(ctx, name); err != nil {
			c.log.Error("cluster: stopping a source to drain failed", "source", name, "err", err)
		}
	})
}

// Shutdown stops the coordinator, hands every source it holds over with
// its settled cursor (in as few etcd transactions as etcd allows) and
// leaves the cluster. It does not close the client.
func (c *Coordinator) Shutdown(ctx context.Context) error {
	if c.stop != nil {
		c.stop()
		<-c.done
	}
	defer c.m.draining.Set(0)
	c.mu.Lock()
	m, owned := c.member, maps.Clone(c.owned)
	clear(c.owned)
	c.mu.Unlock()
	c.m.owned.Set(0)
	if m == nil || !m.Valid() {
		return nil
	}
	names := slices.Sorted(maps.Keys(owned))
	settled, err := c.host.Settled(ctx, names)
	if err != nil {
		c.log.Warn("cluster: reading the settled cursors failed; the next owners resume from the last checkpoints", "err", err)
	}
	writes := make([]Write, 0, len(names))
	for _, name := range names {
		w := Write{O: owned[name].o, Release: true}
		if cur, ok := settled[name]; ok && cur != owned[name].checkpoint {
			w.Cursor = cur
		}
		writes = append(writes, w)
	}
	if _, _, err := m.WriteAll(ctx, writes, c.o.MaxTxnOps); err != nil {
		c.log.Warn("cluster: handing sources over failed; they move when the lease expires", "err", err)
	}
	for _, name := range names {
		c.host.Forget(name)
	}
	c.m.moves.WithLabelValues("handed_over").Add(float64(len(names)))
	if err := m.Leave(ctx); err != nil {
		c.log.Warn("cluster: leaving failed; the lease expires by itself", "err", err)
		return err
	}
	c.log.Info("cluster: left", "cluster", c.o.Cluster, "handed_over", len(names))
	return nil
}

// compact compacts etcd's history to lastRev, the revision seen one
// interval before, when this member holds the compaction key, and returns
// the revision to compact to next time.
func (c *Coordinator) compact(ctx context.Context, m *Member, lastRev int64) int64 {
	cctx, cancel := context.WithTimeout(ctx, c.o.LeaseTTL)
	defer cancel()
	mine, err := m.HoldCompactor(cctx)
	if err != nil || !mine {
		if err != nil {
			c.log.Warn("cluster: compaction skipped", "err", err)
		}
		return 0
	}
	st, err := m.Status(cctx)
	if err != nil {
		c.m.compactions.WithLabelValues("failed").Inc()
		c.log.Warn("cluster: compaction skipped", "err", err)
		return lastRev
	}
	if lastRev > 0 {
		if err := m.Compact(cctx, lastRev); err != nil {
			c.m.compactions.WithLabelValues("failed").Inc()
			c.log.Warn("cluster: compaction failed", "err", err)
			return lastRev
		}
		c.m.compactions.WithLabelValues("done").Inc()
		c.log.Debug("cluster: etcd history compacted", "revision", lastRev)
	}
	return st.Revision
}

// dbStatus reads etcd's database size into the metrics.
func (c *Coordinator) dbStatus(ctx context.Context, m *Member) {
	sctx, cancel := context.WithTimeout(ctx, c.o.LeaseTTL)
	defer cancel()
	st, err := m.Status(sctx)
	if err != nil {
		return
	}
	c.m.dbSize.Set(float64(st.Size))
	c.m.dbInUse.Set(float64(st.InUse))
}

// nopRegisterer registers nothing: the metrics of a coordinator made
// without any.
type nopRegisterer struct{}

func (nopRegisterer) Register(prometheus.Collector) error  { return nil }
func (nopRegisterer) MustRegister(...prometheus.Collector) {}
func (nopRegisterer) Unregister(prometheus.Collector) bool { return true }
