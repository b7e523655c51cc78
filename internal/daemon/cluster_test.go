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
	const nSources, total = 9, 1500
	etcd := etcdtest.Start(t)
	up := testupstream.NewServer(t, testupstream.Options{Total: total, PageSize: 10})
	srcs := clusterSources(up, nSources)
	delivered := &clusterDelivered{seen: map[string]int{}}
	members := map[string]*harness{}
	dirs := map[string]string{}
	for _, name := range []string{"m1", "m2", "m3"} {
		dirs[name] = t.TempDir()
		members[name] = startDaemonIn(t, dirs[name], "", "", "", srcs+clusterTOML(etcd, name), Options{})
		members[name].startProcessor(delivered.handle)
	}

	// The first member up may take every source before the others join;
	// then each source moves to the member the cluster places it on.
	start := time.Now()
	all := []string{"m1", "m2", "m3"}
	names := make([]string, nSources)
	for i := range names {
		names[i] = fmt.Sprintf("s%02d", i)
	}
	testsync.WaitFor(t, "every source to run on its placed member", 60*time.Second, func() bool {
		last := map[string]string{}
		for _, r := range up.Requests() {
			last[r.Query.Get("src")] = r.Header.Get(sources.MemberHeader)
		}
		for i := range nSources {
			src := fmt.Sprintf("s%02d", i)
			if last[src] != cluster.PlaceAll(names, all)[src] {
				return false
			}
		}
		return true
	})
	t.Logf("placement settled after %v", time.Since(start).Round(time.Millisecond))
	byMember := map[string]int{}
	for i := range nSources {
		byMember[cluster.PlaceAll(names, all)[fmt.Sprintf("s%02d", i)]]++
	}
	if len(byMember) != 3 {
		t.Fatalf("sources per member %v, want all three members running some", byMember)
	}
	// The metrics say the same.
	testsync.WaitFor(t, "the cluster metrics to show the placement and a checkpoint", 30*time.Second, func() bool {
		owned, written := 0.0, 0.0
		for _, name := range all {
			reg := members[name].d.Registry()
			if metric(t, reg, "ingestor_cluster_lease_valid") != 1 || metric(t, reg, "ingestor_cluster_members") != 3 ||
				metric(t, reg, "ingestor_cluster_sources_owned") != float64(byMember[name]) {
				return false
			}
			owned += metric(t, reg, "ingestor_cluster_sources_owned")
			written += metric(t, reg, "ingestor_cluster_checkpoints_total", "result", "written")
		}
		return owned == nSources && written > 0
	})
	// Each member's status shows where the sources it does not run are.
	for _, name := range all {
		for _, s := range members[name].d.status(t.Context()).Sources {
			placed := cluster.PlaceAll(names, all)[s.Name]
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
	m2Moves := func(kind string) float64 {
		return metric(t, members["m2"].d.Registry(), "ingestor_cluster_source_moves_total", "kind", kind)
	}

	// m2 leaves gracefully while the sources are mid-feed.
	testsync.WaitFor(t, "some events delivered", 30*time.Second, func() bool { return delivered.distinct() > nSources*total/10 })
	t.Logf("m2 leaves after %v, %d events delivered", time.Since(start).Round(time.Millisecond), delivered.distinct())
	if err := members["m2"].stop(); err != nil {
		t.Fatal(err)
	}
	if got := m2Moves("handed_over"); got < float64(byMember["m2"]) || m2Moves("dropped") != 0 {
		t.Errorf("m2 handed over %v sources and dropped %v on leaving, want its %d handed over and none dropped", got, m2Moves("dropped"), byMember["m2"])
	}
	leftAt := time.Now()
	testsync.WaitFor(t, "every source to reach its end on m1 and m3", 90*time.Second, func() bool {
		done := map[string]bool{}
		for _, r := range up.Requests() {
			if r.Query.Get("since") == fmt.Sprint(total) {
				done[r.Query.Get("src")] = true
			}
		}
		return len(done) == nSources
	})
	// m2 comes back on its disk: what it still had queued is delivered.
	t.Logf("every source at its end after %v", time.Since(start).Round(time.Millisecond))
	backAt := time.Now()
	members["m2"] = startDaemonIn(t, dirs["m2"], "", "", "", srcs+clusterTOML(etcd, "m2"), Options{})
	members["m2"].startProcessor(delivered.handle)
	testsync.WaitFor(t, "every event delivered", 60*time.Second, func() bool { return delivered.distinct() == nSources*total })

	// No page was fetched twice, and no source was polled by m2 after it
	// left until it came back, nor by two members at once: per source the
	// members asking change only at a hand-over.
	pages := map[string]int{}
	runs := map[string][]string{} // per source, the members asking, one entry per run
	for _, r := range up.Requests() {
		src, since, m := r.Query.Get("src"), r.Query.Get("since"), r.Header.Get(sources.MemberHeader)
		if since != fmt.Sprint(total) {
			pages[src+"@"+since]++
		}
		if m == "m2" && r.Time.After(leftAt) && r.Time.Before(backAt) {
			t.Errorf("m2 polled %s at %v, after it left at %v and before it came back", src, r.Time, leftAt)
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
	delivered.mu.Lock()
	defer delivered.mu.Unlock()
	if delivered.noMember != 0 {
		t.Errorf("%d events came in frames without a member", delivered.noMember)
	}
	for k, n := range delivered.seen {
		if n != 1 {
			t.Errorf("%s delivered %d times, want once", k, n)
		}
	}
}
