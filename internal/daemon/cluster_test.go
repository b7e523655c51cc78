package daemon

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/actors"
	"github.com/ingestorhq/ingestor/internal/cluster"
	"github.com/ingestorhq/ingestor/internal/etcdtest"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
	"github.com/ingestorhq/ingestor/sources"
)

// clusterSources is the source blocks of n http_poll sources s00.. on
// up, each with its own src= query so the upstream's log tells them apart.
func clusterSources(up *testupstream.Server, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `
[source.s%02d]
kind = "http_poll"
poll_url = "%s/feed?src=s%02d"
interval = "20ms"
jitter = "0%%"
timeout = "5s"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
`, i, up.URL, i)
	}
	return b.String()
}

// clusterTOML is the [cluster] block of member name on etcd.
func clusterTOML(etcd *etcdtest.Server, name string) string {
	return fmt.Sprintf(`
[cluster]
enabled = true
name = "test"
etcd_endpoints = [%q]
member_name = %q
lease_ttl = "5s"
checkpoint_interval = "1s"
rebalance_delay = "0s"
`, etcd.Endpoint, name)
}

// clusterDelivered counts deliveries by source and key, from every
// member's processor.
type clusterDelivered struct {
	mu   sync.Mutex
	seen map[string]int
	// noMember counts events whose frame named no member.
	noMember int
}

func (c *clusterDelivered) handle(_ context.Context, ev *processor.Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[ev.Source+"/"+ev.Key]++
	if ev.Member == "" {
		c.noMember++
	}
	return nil
}

func (c *clusterDelivered) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// TestClusterSharesSourcesAndHandsOverGracefully runs three members on one
// etcd and nine sources: each source runs on exactly one member at a time
// (the upstream sees which member asks, from the member header), each
// member runs some, and when one member stops gracefully its sources move
// to the others with their final cursor: no page is fetched twice and
// every event is delivered exactly once. The stopped member comes back on
// its data dir and delivers whatever it still had queued.
func TestClusterSharesSourcesAndHandsOverGracefully(t *testing.T) {
	r := startClusterRig(t)
	byMember := r.waitForPlacement()
	r.checkPlacementShows(byMember)

	// m2 leaves gracefully while the sources are mid-feed.
	leftAt := r.leaveGracefully("m2", byMember["m2"])
	r.waitForEveryEnd()
	// m2 comes back on its disk: what it still had queued is delivered.
	t.Logf("every source at its end after %v", time.Since(r.start).Round(time.Millisecond))
	backAt := time.Now()
	r.startMember("m2")
	testsync.WaitFor(t, "every event delivered", 60*time.Second, func() bool { return r.delivered.distinct() == r.nSources*r.total })

	r.checkHandOvers(leftAt, backAt)
	r.checkDeliveredOnce()
}

// clusterRig is three members on one etcd polling nSources sources on one
// upstream, and what their processors delivered.
type clusterRig struct {
	t               *testing.T
	nSources, total int
	etcd            *etcdtest.Server
	up              *testupstream.Server
	srcs            string
	delivered       *clusterDelivered
	members         map[string]*harness
	dirs            map[string]string
	// all is the members' names, names the sources'.
	all, names []string
	// start is when the members had started.
	start time.Time
}

// startClusterRig starts etcd, the upstream and the three members, each
// on a data dir of its own and with a processor counting deliveries.
func startClusterRig(t *testing.T) *clusterRig {
	t.Helper()
	const nSources, total = 9, 1500
	r := &clusterRig{t: t, nSources: nSources, total: total, etcd: etcdtest.Start(t)}
	r.up = testupstream.NewServer(t, testupstream.Options{Total: total, PageSize: 10})
	r.srcs = clusterSources(r.up, nSources)
	r.delivered = &clusterDelivered{seen: map[string]int{}}
	r.members = map[string]*harness{}
	r.dirs = map[string]string{}
	for _, name := range []string{"m1", "m2", "m3"} {
		r.dirs[name] = t.TempDir()
		r.startMember(name)
	}
	r.start = time.Now()
	r.all = []string{"m1", "m2", "m3"}
	r.names = make([]string, nSources)
	for i := range r.names {
		r.names[i] = fmt.Sprintf("s%02d", i)
	}
	return r
}

// startMember starts member name on its data dir, with a processor that
// counts what it delivers.
func (r *clusterRig) startMember(name string) {
	r.t.Helper()
	r.members[name] = startDaemonIn(r.t, r.dirs[name], "", "", "", r.srcs+clusterTOML(r.etcd, name), Options{})
	r.members[name].startProcessor(r.delivered.handle)
}

// waitForPlacement waits until each source runs on the member the cluster
// places it on, as the upstream sees from the member header, and returns
// how many sources each member runs, failing unless all three run some.
func (r *clusterRig) waitForPlacement() map[string]int {
	t := r.t
	t.Helper()
	// The first member up may take every source before the others join;
	// then each source moves to the member the cluster places it on.
	testsync.WaitFor(t, "every source to run on its placed member", 60*time.Second, func() bool {
		last := map[string]string{}
		for _, req := range r.up.Requests() {
			last[req.Query.Get("src")] = req.Header.Get(sources.MemberHeader)
		}
		for i := range r.nSources {
			src := fmt.Sprintf("s%02d", i)
			if last[src] != cluster.PlaceAll(r.names, r.all)[src] {
				return false
			}
		}
		return true
	})
	t.Logf("placement settled after %v", time.Since(r.start).Round(time.Millisecond))
	byMember := map[string]int{}
	for i := range r.nSources {
		byMember[cluster.PlaceAll(r.names, r.all)[fmt.Sprintf("s%02d", i)]]++
	}
	if len(byMember) != 3 {
		t.Fatalf("sources per member %v, want all three members running some", byMember)
	}
	return byMember
}

// checkPlacementShows checks that the cluster metrics and each member's
// status show the placement byMember.
func (r *clusterRig) checkPlacementShows(byMember map[string]int) {
	t := r.t
	t.Helper()
	// The metrics say the same.
	testsync.WaitFor(t, "the cluster metrics to show the placement and a checkpoint", 30*time.Second, func() bool {
		owned, written := 0.0, 0.0
		for _, name := range r.all {
			reg := r.members[name].d.Registry()
			if metric(t, reg, "ingestor_cluster_lease_valid") != 1 || metric(t, reg, "ingestor_cluster_members") != 3 ||
				metric(t, reg, "ingestor_cluster_sources_owned") != float64(byMember[name]) {
				return false
			}
			owned += metric(t, reg, "ingestor_cluster_sources_owned")
			written += metric(t, reg, "ingestor_cluster_checkpoints_total", "result", "written")
		}
		return owned == float64(r.nSources) && written > 0
	})
	// Each member's status shows where the sources it does not run are.
	for _, name := range r.all {
		for _, s := range r.members[name].d.status(t.Context()).Sources {
			placed := cluster.PlaceAll(r.names, r.all)[s.Name]
			if placed == name {
				if s.Reason == actors.ReasonElsewhere {
					t.Errorf("%s: its own source %s shown as elsewhere", name, s.Name)
				}
				continue
			}
			if s.State != actors.StateStopped || s.Reason != actors.ReasonElsewhere || s.Detail != "placed on member "+placed || s.Late {
				t.Errorf("%s: source %s placed on %s shown as %s/%s %q late=%v", name, s.Name, placed, s.State, s.Reason, s.Detail, s.Late)
			}
		}
	}
}

// leaveGracefully stops member name, which runs owned sources, once some
// events are delivered, checks that it handed every one of them over and
// dropped none, and returns when it had left.
func (r *clusterRig) leaveGracefully(name string, owned int) time.Time {
	t := r.t
	t.Helper()
	moves := func(kind string) float64 {
		return metric(t, r.members[name].d.Registry(), "ingestor_cluster_source_moves_total", "kind", kind)
	}
	testsync.WaitFor(t, "some events delivered", 30*time.Second, func() bool { return r.delivered.distinct() > r.nSources*r.total/10 })
	t.Logf("%s leaves after %v, %d events delivered", name, time.Since(r.start).Round(time.Millisecond), r.delivered.distinct())
	if err := r.members[name].stop(); err != nil {
		t.Fatal(err)
	}
	if got := moves("handed_over"); got < float64(owned) || moves("dropped") != 0 {
		t.Errorf("%s handed over %v sources and dropped %v on leaving, want its %d handed over and none dropped", name, got, moves("dropped"), owned)
	}
	return time.Now()
}

// waitForEveryEnd waits until the upstream was asked for what follows the
// last event of every source.
func (r *clusterRig) waitForEveryEnd() {
	r.t.Helper()
	testsync.WaitFor(r.t, "every source to reach its end on m1 and m3", 90*time.Second, func() bool {
		done := map[string]bool{}
		for _, req := range r.up.Requests() {
			if req.Query.Get("since") == fmt.Sprint(r.total) {
				done[req.Query.Get("src")] = true
			}
		}
		return len(done) == r.nSources
	})
}

// checkHandOvers checks the upstream's log: no page was fetched twice,
// and no source was polled by m2 after it left at leftAt until it came
// back at backAt, nor by two members at once: per source the members
// asking change only at a hand-over.
func (r *clusterRig) checkHandOvers(leftAt, backAt time.Time) {
	t := r.t
	t.Helper()
	pages := map[string]int{}
	runs := map[string][]string{} // per source, the members asking, one entry per run
	for _, req := range r.up.Requests() {
		src, since, m := req.Query.Get("src"), req.Query.Get("since"), req.Header.Get(sources.MemberHeader)
		if since != fmt.Sprint(r.total) {
			pages[src+"@"+since]++
		}
		if m == "m2" && req.Time.After(leftAt) && req.Time.Before(backAt) {
			t.Errorf("m2 polled %s at %v, after it left at %v and before it came back", src, req.Time, leftAt)
		}
		if rs := runs[src]; len(rs) == 0 || rs[len(rs)-1] != m {
			runs[src] = append(rs, m)
		}
	}
	for src, rs := range runs {
		// At most: the first member up, the placed member, a move when
		// m2 left, a move back when it returned.
		if len(rs) > 4 {
			t.Errorf("source %s changed members %d times (%v): members took turns, not hand-overs", src, len(rs)-1, rs)
		}
	}
	var twice []string
	for p, n := range pages {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s x%d", p, n))
		}
	}
	sort.Strings(twice)
	if len(twice) > 0 {
		t.Errorf("pages fetched more than once across graceful hand-overs: %v", twice)
	}
}

// checkDeliveredOnce checks that every event came in a frame naming its
// member and was delivered exactly once.
func (r *clusterRig) checkDeliveredOnce() {
	t := r.t
	t.Helper()
	r.delivered.mu.Lock()
	defer r.delivered.mu.Unlock()
	if r.delivered.noMember != 0 {
		t.Errorf("%d events came in frames without a member", r.delivered.noMember)
	}
	for k, n := range r.delivered.seen {
		if n != 1 {
			t.Errorf("%s delivered %d times, want once", k, n)
		}
	}
}
