package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/cluster"
)

// modeClusterScale runs -members coordinators in this process (each with
// its own etcd client, lease and seat) sharing -sources stub sources on one
// real etcd for -duration, then kills one member, and reports what cluster
// mode costs etcd and the members at that scale.
const modeClusterScale = "cluster-scale"

// The scale mode's defaults: the 20 members and 10,000 sources
// for ten minutes.
const (
	scaleMembers  = 20
	scaleSources  = 10_000
	scaleDuration = 10 * time.Minute
)

// scaleSettings are the members' [cluster] settings in the scale mode;
// compaction runs every tenth of the run, at most every minute.
var scaleSettings = struct {
	ttl, checkpoint time.Duration
	maxTxnOps       int
}{ttl: 10 * time.Second, checkpoint: time.Second, maxTxnOps: 1024}

// compactEvery is the members' compact_interval for a run of d.
func compactEvery(d time.Duration) time.Duration { return min(time.Minute, max(2*time.Second, d/10)) }

// scaleResult is what the scale mode measured.
type scaleResult struct {
	// Compact is the members' compact_interval.
	Compact  float64 `json:"compact_interval_s"`
	Members  int     `json:"members"`
	Sources  int     `json:"sources"`
	Duration float64 `json:"duration_s"`
	// OwnedAfter is how long until every source was held after start,
	// SettledAfter until every member placed every source alike and its
	// member ran it: the steady state starts there.
	OwnedAfter   float64 `json:"owned_after_s"`
	SettledAfter float64 `json:"settled_after_s"`
	// WritesPerSec is etcd's revisions per second in the steady state,
	// WritesTarget its target (2 x members per checkpoint interval).
	WritesPerSec float64 `json:"etcd_writes_per_s"`
	WritesTarget float64 `json:"etcd_writes_target_per_s"`
	// DBSizes are etcd's database size (bytes) and in-use bytes at each
	// sample, SampleEvery apart.
	DBSizes     []int64 `json:"etcd_db_size_bytes"`
	DBInUse     []int64 `json:"etcd_db_in_use_bytes"`
	SampleEvery float64 `json:"sample_every_s"`
	// MemberCPU is the process's CPU per member, as a share of one core;
	// EtcdCPU etcd's, in the steady state.
	MemberCPU float64 `json:"member_cpu_core_share"`
	EtcdCPU   float64 `json:"etcd_cpu_core_share"`
	// Spread is the fewest and most sources a member held, Held what
	// each held.
	SpreadMin int   `json:"spread_min"`
	SpreadMax int   `json:"spread_max"`
	Held      []int `json:"held"`
	// Reowned is how long after a member was killed every source was
	// held again, ReownTarget its target (lease TTL + 2 s). Expired is
	// how long after the kill the member's key was gone: its lease
	// expired in etcd (at most lease_ttl after its last keepalive, plus
	// etcd's expiry check), the part of Reowned the members cannot
	// shorten.
	Reowned     float64 `json:"reowned_after_s"`
	Expired     float64 `json:"expired_after_s"`
	ReownTarget float64 `json:"reown_target_s"`
	// Moves counts the members' source moves in the steady state, by
	// kind (taken, handed_over, dropped), and Checkpoints their
	// checkpoints, by result (written, refused, failed): what etcd's
	// writes are made of, when there are more than the checkpoints'.
	Moves       map[string]float64 `json:"steady_moves"`
	Checkpoints map[string]float64 `json:"steady_checkpoints"`
}

// failures lists the targets r misses.
func (r *scaleResult) failures() []string {
	var out []string
	if r.WritesPerSec > r.WritesTarget {
		out = append(out, fmt.Sprintf("etcd writes %.1f/s, above the target %.0f/s", r.WritesPerSec, r.WritesTarget))
	}
	if n := len(r.DBSizes); n >= 4 {
		mid, end := slices.Max(r.DBSizes[:n/2]), slices.Max(r.DBSizes[n/2:])
		if float64(end) > 1.1*float64(mid)+(1<<20) {
			out = append(out, fmt.Sprintf("etcd's database grew from %d to %d bytes in the second half of the run: not flat", mid, end))
		}
	}
	mean := float64(r.Sources) / float64(r.Members)
	if float64(r.SpreadMin) < 0.9*mean || float64(r.SpreadMax) > 1.1*mean {
		out = append(out, fmt.Sprintf("sources per member %d-%d, beyond ±10%% of %.0f", r.SpreadMin, r.SpreadMax, mean))
	}
	if r.Reowned > r.ReownTarget {
		out = append(out, fmt.Sprintf("every source held again %.1fs after a member was killed (its lease expired after %.1fs), above the target %.0fs", r.Reowned, r.Expired, r.ReownTarget))
	}
	return out
}

// scaleHost is a member's stub sources: a running source's cursor moves
// on every step, and is settled at once.
type scaleHost struct {
	sources []string
	mu      sync.Mutex
	cursor  map[string]int
	running map[string]bool
}

func (h *scaleHost) Placeable() []string { return h.sources }

func (h *scaleHost) Start(_ context.Context, source, cursor string, checkpointed bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	if checkpointed {
		n, _ = strconv.Atoi(cursor)
	}
	h.cursor[source], h.running[source] = n, true
	return nil
}

func (h *scaleHost) HandOver(ctx context.Context, source string) error { return h.Stop(ctx, source) }

func (h *scaleHost) Stop(_ context.Context, source string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.running, source)
	return nil
}

func (h *scaleHost) Cursor(_ context.Context, source string) (string, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok := h.cursor[source]
	return strconv.Itoa(n), ok, nil
}

func (h *scaleHost) Settled(_ context.Context, names []string) (map[string]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]string, len(names))
	for _, name := range names {
		if n, ok := h.cursor[name]; ok {
			out[name] = strconv.Itoa(n)
		}
	}
	return out, nil
}

func (h *scaleHost) Forget(string) {}

// step moves every running source's cursor.
func (h *scaleHost) step() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for name := range h.running {
		h.cursor[name]++
	}
}

func (h *scaleHost) runs(source string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.running[source]
}

func (h *scaleHost) held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.running)
}

// scaleMember is one in-process member.
type scaleMember struct {
	host   *scaleHost
	client *clientv3.Client
	coord  *cluster.Coordinator
	reg    *prometheus.Registry // its coordinator's metrics
	// stopped is set by stop, on the goroutine that runs the mode.
	stopped bool
}

// counters sums the members' counter vectors named name by the value of
// their one label.
func counters(members []*scaleMember, name string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range members {
		mfs, err := m.reg.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, mt := range mf.GetMetric() {
				if l := mt.GetLabel(); len(l) == 1 {
					out[l[0].GetValue()] += mt.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// since returns now minus then, by key.
func since(now, then map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(now))
	for k, v := range now {
		out[k] = v - then[k]
	}
	return out
}

// runClusterScale runs the scale mode and prints its result.
func runClusterScale(ctx context.Context, o options, dir string, stdout, stderr io.Writer) error {
	etcd, endpoint, err := startEtcd(ctx, dir, stderr, "--max-txn-ops", strconv.Itoa(scaleSettings.maxTxnOps))
	if err != nil {
		return err
	}
	defer etcd.stopLogged(stderr)
	res, err := clusterScale(ctx, o, endpoint, etcd.cmd.Process.Pid, stderr)
	if err != nil {
		return err
	}
	if o.json {
		err = printJSONLine(stdout, res)
	} else {
		err = printClusterScale(stdout, res)
	}
	if f := res.failures(); len(f) > 0 {
		return fmt.Errorf("cluster scale targets missed: %v", f)
	}
	return err
}

// clusterScale starts the members, measures the steady state for
// o.duration, then kills one member and measures until its sources are
// held again.
func clusterScale(ctx context.Context, o options, endpoint string, etcdPid int, stderr io.Writer) (*scaleResult, error) {
	names := make([]string, o.sources)
	for i := range names {
		names[i] = fmt.Sprintf("src-%05d", i)
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	members := make([]*scaleMember, o.members)
	defer func() {
		for _, m := range members {
			if m != nil {
				m.stop()
			}
		}
	}()
	start := time.Now()
	for i := range members {
		m, err := startScaleMember(endpoint, fmt.Sprintf("member-%02d", i), names, compactEvery(o.duration), log)
		if err != nil {
			return nil, err
		}
		members[i] = m
	}
	if err := waitUntil(ctx, 5*time.Minute, func() bool { return held(members) == o.sources }); err != nil {
		return nil, fmt.Errorf("every source held: %w", err)
	}
	res := &scaleResult{Compact: compactEvery(o.duration).Seconds(), Members: o.members, Sources: o.sources, OwnedAfter: time.Since(start).Seconds(),
		WritesTarget: 2 * float64(o.members) / scaleSettings.checkpoint.Seconds(), ReownTarget: (scaleSettings.ttl + 2*time.Second).Seconds()}
	// The steady state starts once the placement is settled: a member
	// that joined after the others held everything takes its share first,
	// and those moves are the start's, not the steady state's writes.
	if err := waitUntil(ctx, 5*time.Minute, func() bool { return settled(members, names) }); err != nil {
		return nil, fmt.Errorf("the placement settled: %w", err)
	}
	res.SettledAfter = time.Since(start).Seconds()
	stopSteps := make(chan struct{})
	var steps sync.WaitGroup
	steps.Go(func() { stepCursors(members, stopSteps) })
	defer func() {
		close(stopSteps)
		steps.Wait()
	}()
	if err := scaleSteady(ctx, o, members, endpoint, etcdPid, res); err != nil {
		return nil, err
	}
	if err := killOne(ctx, o, members, res); err != nil {
		return nil, err
	}
	return res, nil
}

// startScaleMember starts a member with its own etcd client and stub
// sources.
func startScaleMember(endpoint, name string, sources []string, compact time.Duration, log *slog.Logger) (*scaleMember, error) {
	client, err := cluster.Dial(config.Cluster{EtcdEndpoints: []string{endpoint}})
	if err != nil {
		return nil, err
	}
	h := &scaleHost{sources: sources, cursor: map[string]int{}, running: map[string]bool{}}
	reg := prometheus.NewRegistry()
	c := cluster.NewCoordinator(client, h, cluster.CoordinatorOptions{Cluster: "scale", Member: name,
		LeaseTTL: scaleSettings.ttl, CheckpointInterval: scaleSettings.checkpoint, CompactInterval: compact,
		MaxTxnOps: scaleSettings.maxTxnOps, HandOverWait: 5 * time.Second, Info: []byte(`{"member":"` + name + `"}`),
		Logger: log.With("member", name), Metrics: cluster.NewMetrics(reg)})
	c.Start()
	return &scaleMember{host: h, client: client, coord: c, reg: reg}, nil
}

// stop shuts m's coordinator down and closes its client, once.
func (m *scaleMember) stop() {
	if m.stopped {
		return
	}
	m.stopped = true
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_ = m.coord.Shutdown(sctx)
	cancel()
	_ = m.client.Close()
}

// held returns how many sources the members run.
func held(ms []*scaleMember) int {
	n := 0
	for _, m := range ms {
		n += m.host.held()
	}
	return n
}

// stepCursors moves every running source's cursor twice a checkpoint
// interval until stop closes.
func stepCursors(members []*scaleMember, stop <-chan struct{}) {
	t := time.NewTicker(scaleSettings.checkpoint / 2)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			for _, m := range members {
				m.host.step()
			}
		}
	}
}

// killOne kills the last member (its client closes without a word, its
// lease and seat expire, the others take its sources), and records when
// its lease expired and when every source was held again.
func killOne(ctx context.Context, o options, members []*scaleMember, res *scaleResult) error {
	victim := members[len(members)-1]
	_ = victim.client.Close()
	killed := time.Now()
	rest := members[:len(members)-1]
	expired, err := waitGone(ctx, rest[0].client, "/ingestor/scale/members/"+victim.coord.Name())
	if err != nil {
		return fmt.Errorf("the killed member's lease expired: %w", err)
	}
	res.Expired = expired.Sub(killed).Seconds()
	if err := waitUntil(ctx, 2*time.Minute, func() bool { return held(rest) == o.sources }); err != nil {
		return fmt.Errorf("every source held again after a member was killed: %w", err)
	}
	res.Reowned = time.Since(killed).Seconds()
	victim.stop()
	return nil
}

// settled reports whether every member places every source on the same
// member, and that member runs it.
func settled(members []*scaleMember, sources []string) bool {
	byName := make(map[string]*scaleMember, len(members))
	for _, m := range members {
		byName[m.coord.Name()] = m
	}
	for _, s := range sources {
		at, _ := members[0].coord.Placement(s)
		for _, m := range members[1:] {
			if p, _ := m.coord.Placement(s); p != at {
				return false
			}
		}
		owner := byName[at]
		if owner == nil || !owner.host.runs(s) {
			return false
		}
	}
	return true
}

// waitGone polls key every 50 ms until etcd no longer has it, and returns
// when it saw it gone.
func waitGone(ctx context.Context, client *clientv3.Client, key string) (time.Time, error) {
	var gone time.Time
	err := waitUntil(ctx, 2*time.Minute, func() bool {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := client.Get(gctx, key, clientv3.WithCountOnly())
		if err != nil || resp.Count > 0 {
			return false
		}
		gone = time.Now()
		return true
	})
	return gone, err
}

// scaleSteady samples etcd and the CPU for o.duration.
func scaleSteady(ctx context.Context, o options, members []*scaleMember, endpoint string, etcdPid int, res *scaleResult) error {
	client, err := cluster.Dial(config.Cluster{EtcdEndpoints: []string{endpoint}})
	if err != nil {
		return err
	}
	defer client.Close()
	sample := func() (*clientv3.StatusResponse, error) {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return client.Status(sctx, endpoint)
	}
	every := min(30*time.Second, max(time.Second, o.duration/20))
	res.SampleEvery = every.Seconds()
	first, err := sample()
	if err != nil {
		return err
	}
	moves0, checkpoints0 := counters(members, "ingestor_cluster_source_moves_total"), counters(members, "ingestor_cluster_checkpoints_total")
	ticks := clockTicks()
	cpu0, err := procCPUTicks(os.Getpid())
	if err != nil {
		return err
	}
	etcd0, err := procCPUTicks(etcdPid)
	if err != nil {
		return err
	}
	t0 := time.Now()
	for time.Since(t0) < o.duration {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
		st, err := sample()
		if err != nil {
			return err
		}
		res.DBSizes, res.DBInUse = append(res.DBSizes, st.DbSize), append(res.DBInUse, st.DbSizeInUse)
	}
	last, err := sample()
	if err != nil {
		return err
	}
	res.Moves = since(counters(members, "ingestor_cluster_source_moves_total"), moves0)
	res.Checkpoints = since(counters(members, "ingestor_cluster_checkpoints_total"), checkpoints0)
	elapsed := time.Since(t0).Seconds()
	cpu1, err := procCPUTicks(os.Getpid())
	if err != nil {
		return err
	}
	etcd1, err := procCPUTicks(etcdPid)
	if err != nil {
		return err
	}
	res.Duration = elapsed
	res.WritesPerSec = float64(last.Header.Revision-first.Header.Revision) / elapsed
	res.MemberCPU = (cpu1 - cpu0) / ticks / elapsed / float64(len(members))
	res.EtcdCPU = (etcd1 - etcd0) / ticks / elapsed
	res.SpreadMin, res.SpreadMax = o.sources, 0
	for _, m := range members {
		n := m.host.held()
		res.Held = append(res.Held, n)
		res.SpreadMin, res.SpreadMax = min(res.SpreadMin, n), max(res.SpreadMax, n)
	}
	return nil
}

// waitUntil polls cond every 50 ms until it holds, ctx ends or timeout
// passes.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// printClusterScale prints res as a table.
func printClusterScale(w io.Writer, r *scaleResult) error {
	mib := func(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	sizes := make([]string, 0, len(r.DBSizes))
	for i := range r.DBSizes {
		sizes = append(sizes, mib(r.DBSizes[i])+"/"+mib(r.DBInUse[i]))
	}
	_, err := fmt.Fprintf(w, `ingestor-bench -mode cluster-scale: %d in-process members, %d stub sources whose cursors move every %v, one etcd (--max-txn-ops %d), lease_ttl %v, checkpoint_interval %v, compact_interval %.0fs, rebalance_delay 0s
| measure | value | target |
|---|---|---|
| every source held after start; the placement settled | %.1f s; %.1f s | |
| etcd writes (revisions) per second, %.0f s steady state | %.1f | <= %.0f |
| of which: source moves (taken / handed over / dropped), checkpoints (written / refused / failed) | %.0f / %.0f / %.0f, %.0f / %.0f / %.0f | |
| etcd database size / in use, MiB, every %.0f s | %v | flat |
| CPU per member (process CPU / members) | %.1f%% of a core | |
| etcd CPU | %.1f%% of a core | |
| sources per member | %d-%d (mean %.0f) | ±10%% |
| every source held again after a member was killed (its lease expired after) | %.1f s (%.1f s) | <= %.0f s |
`, r.Members, r.Sources, scaleSettings.checkpoint/2, scaleSettings.maxTxnOps, scaleSettings.ttl, scaleSettings.checkpoint, r.Compact,
		r.OwnedAfter, r.SettledAfter, r.Duration, r.WritesPerSec, r.WritesTarget,
		r.Moves["taken"], r.Moves["handed_over"], r.Moves["dropped"], r.Checkpoints["written"], r.Checkpoints["refused"], r.Checkpoints["failed"],
		r.SampleEvery, sizes, 100*r.MemberCPU, 100*r.EtcdCPU,
		r.SpreadMin, r.SpreadMax, float64(r.Sources)/float64(r.Members), r.Reowned, r.Expired, r.ReownTarget)
	return err
}
