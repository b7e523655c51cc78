package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ingestorhq/ingestor/internal/cluster"
	"github.com/ingestorhq/ingestor/internal/etcdtest"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// memHost is a cluster.Host whose sources only move their cursor: each
// running source's cursor counts up on every Tick, and is settled at
// once unless the test holds settling back.
type memHost struct {
	sources []string

	mu       sync.Mutex
	running  map[string]bool
	cursor   map[string]int
	settled  map[string]int
	hold     bool // cursors stop settling
	started  map[string]int
	startedW map[string]string // the cursor each start was given
}

func newMemHost(n int) *memHost {
	h := &memHost{running: map[string]bool{}, cursor: map[string]int{}, settled: map[string]int{},
		started: map[string]int{}, startedW: map[string]string{}}
	for i := range n {
		h.sources = append(h.sources, fmt.Sprintf("s%04d", i))
	}
	return h
}

func (h *memHost) Placeable() []string { return slices.Clone(h.sources) }

func (h *memHost) Start(_ context.Context, source, cursor string, checkpointed bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if checkpointed {
		n, err := strconv.Atoi(cursor)
		if err != nil {
			return err
		}
		h.cursor[source], h.settled[source] = n, n
		h.startedW[source] = cursor
	}
	h.running[source] = true
	h.started[source]++
	return nil
}

func (h *memHost) HandOver(ctx context.Context, source string) error { return h.Stop(ctx, source) }

func (h *memHost) Stop(_ context.Context, source string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.running, source)
	return nil
}

func (h *memHost) Cursor(_ context.Context, source string) (string, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok := h.cursor[source]
	return strconv.Itoa(n), ok, nil
}

func (h *memHost) Settled(_ context.Context, names []string) (map[string]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]string{}
	for _, name := range names {
		if n, ok := h.settled[name]; ok {
			out[name] = strconv.Itoa(n)
		}
	}
	return out, nil
}

func (h *memHost) Forget(string) {}

// tick moves every running source's cursor by one.
func (h *memHost) tick() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for name := range h.running {
		h.cursor[name]++
		if !h.hold {
			h.settled[name] = h.cursor[name]
		}
	}
}

func (h *memHost) runningSet() map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.running)
}

// coordinated is a coordinator on its own client and host.
type coordinated struct {
	c      *cluster.Coordinator
	client *clientv3.Client
	host   *memHost
	reg    *prometheus.Registry
}

func startCoordinator(t *testing.T, endpoint, name string, host *memHost, o cluster.CoordinatorOptions) *coordinated {
	t.Helper()
	reg := prometheus.NewRegistry()
	o.Cluster, o.Member, o.Metrics = "t", name, cluster.NewMetrics(reg)
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 3 * time.Second
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = 200 * time.Millisecond
	}
	if o.HandOverWait == 0 {
		o.HandOverWait = 2 * time.Second
	}
	o.Info = []byte(`{"member":"` + name + `"}`)
	if testing.Verbose() {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test_member", name)
	}
	client := dial(t, endpoint)
	c := cluster.NewCoordinator(client, host, o)
	c.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Shutdown(ctx) // the test may have stopped it, or closed its client
	})
	return &coordinated{c: c, client: client, host: host, reg: reg}
}

func (cd *coordinated) metric(name string, labels ...string) float64 {
	mfs, err := cd.reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// revision returns etcd's current revision.
func revision(t *testing.T, c *clientv3.Client) int64 {
	t.Helper()
	r, err := c.Get(ctx10(t), "/none")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

// TestCoordinatorCheckpointsInOneTransactionPerBatch: a member holding
// 300 sources whose cursors all move writes their settled cursors in
// ceil(300/(max_txn_ops-2)) transactions per interval, not 300: etcd's
// revisions grow with members, not sources. It failed with one
// transaction per source (300 revisions a pass).
func TestCoordinatorCheckpointsInOneTransactionPerBatch(t *testing.T) {
	etcd := etcdtest.Start(t)
	host := newMemHost(300)
	cd := startCoordinator(t, etcd.Endpoint, "m1", host, cluster.CoordinatorOptions{MaxTxnOps: 128, CheckpointInterval: time.Second})
	testsync.WaitFor(t, "every source to run", 30*time.Second, func() bool { return len(host.runningSet()) == 300 })
	watcher := dial(t, etcd.Endpoint)
	host.tick()
	testsync.WaitFor(t, "a first checkpoint of every source", 30*time.Second, func() bool {
		return cd.metric("ingestor_cluster_checkpoints_total", "result", "written") >= 300
	})
	before := revision(t, watcher)
	written := cd.metric("ingestor_cluster_checkpoints_total", "result", "written")
	host.tick()
	testsync.WaitFor(t, "the next checkpoint of every source", 30*time.Second, func() bool {
		return cd.metric("ingestor_cluster_checkpoints_total", "result", "written") >= written+300
	})
	if got := revision(t, watcher) - before; got > 3 {
		t.Fatalf("checkpointing 300 moved cursors took %d etcd revisions, want at most 3 (transactions of 126)", got)
	}
	r, err := watcher.Get(ctx10(t), "/ingestor/t/sources/s0123/cursor")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "2" {
		t.Fatalf("checkpoint of s0123 = %v (err %v), want 2", r.Kvs, err)
	}
}

// TestCoordinatorCheckpointsOnlySettledCursors: while a source's events
// are not acked its checkpoint stays at the last settled cursor; a member
// that dies then gives the next owner that cursor, so the unacked tail is
// fetched again instead of lost.
func TestCoordinatorCheckpointsOnlySettledCursors(t *testing.T) {
	etcd := etcdtest.Start(t)
	host := newMemHost(1)
	cd := startCoordinator(t, etcd.Endpoint, "m1", host, cluster.CoordinatorOptions{})
	testsync.WaitFor(t, "the source to run", 30*time.Second, func() bool { return len(host.runningSet()) == 1 })
	host.tick() // cursor 1, settled
	testsync.WaitFor(t, "checkpoint 1", 30*time.Second, func() bool {
		return cd.metric("ingestor_cluster_checkpoints_total", "result", "written") >= 1
	})
	host.mu.Lock()
	host.hold = true
	host.mu.Unlock()
	host.tick() // cursor 2, 3: committed, not acked
	host.tick()
	time.Sleep(3 * 200 * time.Millisecond) // three checkpoint intervals go by: none may write 3
	// m1 dies without a word: its client is gone, its lease expires, and
	// m2 takes the source over.
	if err := cd.client.Close(); err != nil {
		t.Fatal(err)
	}
	other := newMemHost(1)
	startCoordinator(t, etcd.Endpoint, "m2", other, cluster.CoordinatorOptions{})
	testsync.WaitFor(t, "m2 to take the source", 30*time.Second, func() bool { return len(other.runningSet()) == 1 })
	other.mu.Lock()
	got := other.startedW["s0000"]
	other.mu.Unlock()
	if got != "1" {
		t.Fatalf("m2 started the source from cursor %q, want the settled 1 (3 was committed, never acked)", got)
	}
}

// TestCoordinatorRejoinsAtOnceAfterAnEtcdOutage: etcd down past the lease
// stops the member's sources; once etcd answers again the member revokes
// its lost lease and joins at once, instead of waiting for etcd to expire
// it ("member name is taken" for a whole TTL): etcd renews every lease to
// its full TTL when it starts, so a member that waited would run its
// sources again a TTL (8 s) after etcd's return. The bound is half of
// that: about 2 s is usual (docs/cluster.md; 0.01-1.2 s here, the gRPC
// reconnect backoff is at most a second), and make test's load on a fast
// machine has pushed it past 2 s once.
func TestCoordinatorRejoinsAtOnceAfterAnEtcdOutage(t *testing.T) {
	const ttl = 8 * time.Second
	etcd := etcdtest.Start(t)
	host := newMemHost(3)
	cd := startCoordinator(t, etcd.Endpoint, "m1", host, cluster.CoordinatorOptions{LeaseTTL: ttl})
	testsync.WaitFor(t, "the sources to run", 30*time.Second, func() bool { return len(host.runningSet()) == 3 })
	etcd.Stop()
	testsync.WaitFor(t, "the member to stop its sources", 30*time.Second, func() bool { return len(host.runningSet()) == 0 })
	etcd.Restart()
	back := time.Now()
	testsync.WaitFor(t, "the sources to run again", 30*time.Second, func() bool { return len(host.runningSet()) == 3 })
	took := time.Since(back)
	t.Logf("the sources ran again %v after etcd was back", took.Round(time.Millisecond))
	if took >= ttl/2 {
		t.Fatalf("the sources ran again %v after etcd was back, want well within the lease TTL %v "+
			"(a member that waits for its old lease to expire takes a TTL)", took.Round(time.Millisecond), ttl)
	}
	if got := cd.metric("ingestor_cluster_lease_lost_total"); got != 1 {
		t.Errorf("ingestor_cluster_lease_lost_total = %v, want 1", got)
	}
}

// TestCoordinatorRebalanceDelayKeepsAMembersSources: a member that stops
// and comes back within the rebalance delay gets exactly its sources
// back, and no other member takes one in between; once a member stays
// away past the delay, its sources move.
func TestCoordinatorRebalanceDelayKeepsAMembersSources(t *testing.T) {
	etcd := etcdtest.Start(t)
	o := cluster.CoordinatorOptions{RebalanceDelay: 4 * time.Second}
	h1, h2 := newMemHost(40), newMemHost(40)
	m1 := startCoordinator(t, etcd.Endpoint, "m1", h1, o)
	m2 := startCoordinator(t, etcd.Endpoint, "m2", h2, o)
	placed := cluster.PlaceAll(h1.sources, []string{"m1", "m2"})
	settled := func(h *memHost, name string) func() bool {
		return func() bool {
			run := h.runningSet()
			for src, member := range placed {
				if run[src] != (member == name) {
					return false
				}
			}
			return true
		}
	}
	testsync.WaitFor(t, "m1 to run its sources", 30*time.Second, settled(h1, "m1"))
	testsync.WaitFor(t, "m2 to run its sources", 30*time.Second, settled(h2, "m2"))
	mine := h1.runningSet()
	taken := m2.metric("ingestor_cluster_source_moves_total", "kind", "taken")
	if err := m1.c.Shutdown(ctx10(t)); err != nil {
		t.Fatal(err)
	}
	// m1 restarts at once (a new coordinator, as a new process would be),
	// well within the delay.
	h1b := newMemHost(40)
	m1b := startCoordinator(t, etcd.Endpoint, "m1", h1b, o)
	testsync.WaitFor(t, "m1 to run its sources again", 30*time.Second, func() bool { return maps.Equal(h1b.runningSet(), mine) })
	if got := m2.metric("ingestor_cluster_source_moves_total", "kind", "taken"); got != taken {
		t.Fatalf("m2 took %v sources while m1 restarted within the delay, want none", got-taken)
	}
	if got := m2.metric("ingestor_cluster_sources_unplaced"); got != 0 {
		t.Errorf("ingestor_cluster_sources_unplaced = %v with both members back, want 0", got)
	}
	// m1 goes away for good: its sources wait the delay, then move.
	if err := m1b.c.Shutdown(ctx10(t)); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	testsync.WaitFor(t, "m2 to run every source", 30*time.Second, func() bool { return len(h2.runningSet()) == 40 })
	if took := time.Since(gone); took < 3*time.Second {
		t.Fatalf("m1's sources moved %v after it left, before the 4s rebalance delay", took.Round(time.Millisecond))
	}
}

// TestCoordinatorCompactsEtcdHistory: the member holding the compaction
// key compacts etcd's history every interval to the revision of the
// interval before, so revisions older than that are gone.
func TestCoordinatorCompactsEtcdHistory(t *testing.T) {
	etcd := etcdtest.Start(t)
	host := newMemHost(5)
	cd := startCoordinator(t, etcd.Endpoint, "m1", host, cluster.CoordinatorOptions{CompactInterval: 500 * time.Millisecond})
	c := dial(t, etcd.Endpoint)
	first := revision(t, c)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				host.tick()
			}
		}
	}()
	defer close(stop)
	testsync.WaitFor(t, "the first revision to be compacted away", 30*time.Second, func() bool {
		_, err := c.Get(ctx10(t), "/ingestor/t/sources/s0000/cursor", clientv3.WithRev(first))
		return errors.Is(err, rpctypes.ErrCompacted)
	})
	testsync.WaitFor(t, "ingestor_cluster_compactions_total{result=done} to count it", 10*time.Second, func() bool {
		return cd.metric("ingestor_cluster_compactions_total", "result", "done") >= 1
	})
	if cd.metric("ingestor_cluster_etcd_db_size_bytes") <= 0 {
		t.Errorf("ingestor_cluster_etcd_db_size_bytes not set")
	}
}
