package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/cluster"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/sources"
)

// etcdClient returns a client of the rig's etcd, closed when the test ends.
func (r *clusterRig) etcdClient() *clientv3.Client {
	r.t.Helper()
	c, err := cluster.Dial(config.Cluster{EtcdEndpoints: []string{r.etcd.Endpoint}})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = c.Close() })
	return c
}

// signalProcessor sends sig to the rig's processor.
func (r *clusterRig) signalProcessor(sig syscall.Signal) {
	r.t.Helper()
	if err := r.proc.Process.Signal(sig); err != nil {
		r.t.Fatal(err)
	}
}

// appliedBySource returns, per source, the seqs the exactly-once
// database holds.
func (r *clusterRig) appliedBySource() map[string]map[int]bool {
	r.t.Helper()
	db, err := sql.Open("sqlite3", "file:"+r.appliedDB+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		r.t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT source, key FROM events`)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]map[int]bool{}
	for rows.Next() {
		var src, key string
		if err := rows.Scan(&src, &key); err != nil {
			r.t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimPrefix(key, "ev-"))
		if err != nil {
			r.t.Fatalf("key %q: %v", key, err)
		}
		if out[src] == nil {
			out[src] = map[int]bool{}
		}
		out[src][n] = true
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return out
}

// checkpoints returns the cursor checkpoint of each source in etcd.
func (r *clusterRig) checkpoints(c *clientv3.Client) map[string]int {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, "/ingestor/failover/sources/", clientv3.WithPrefix())
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]int{}
	for _, kv := range resp.Kvs {
		src, ok := strings.CutSuffix(strings.TrimPrefix(string(kv.Key), "/ingestor/failover/sources/"), "/cursor")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(string(kv.Value))
		if err != nil {
			r.t.Fatalf("checkpoint of %s = %q: %v", src, kv.Value, err)
		}
		out[src] = n
	}
	return out
}

// TestClusterLostDiskLosesNothing kills one of three members with SIGKILL
// and deletes its data dir (queue, raw store and all) while the
// processor is stopped, so that the member dies with committed events no
// processor acked. Those are not lost: the checkpoint in etcd is the
// settled cursor (checked while the processor is stopped: no checkpoint
// passes an event it has not applied), the survivors fetch the unacked
// tail again from it, and every event reaches the exactly-once processor
// once. With the committed cursor as the checkpoint (before), the killed
// member's unacked events were gone with its disk and the test timed out
// waiting for them.
func TestClusterLostDiskLosesNothing(t *testing.T) {
	const nSources, total = 30, 1000
	r := newClusterRig(t, nSources, total)
	r.start("m1", "m2", "m3")
	all := r.names()
	r.waitPlaced(all, 60*time.Second)
	// Stopped while the sources are mid-feed: on a loaded machine they
	// could otherwise reach their end, every event acked, before m2 holds
	// any unacked.
	r.signalProcessor(syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			r.signalProcessor(syscall.SIGCONT)
		}
	}()
	m2 := r.members["m2"]
	testsync.WaitFor(t, "m2 to hold events no processor acked", 60*time.Second, func() bool {
		return scrapeMetric(m2.httpAddr, "ingestor_queue_pending_events") >= 200
	})
	// Two checkpoint intervals go by with m2's events unacked: no
	// checkpoint may pass an event the processor has not applied.
	time.Sleep(2500 * time.Millisecond)
	applied, cps := r.appliedBySource(), r.checkpoints(r.etcdClient())
	behind := 0
	for _, src := range r.placedOn("m2", all) {
		cp := cps[src]
		for n := 1; n <= cp; n++ {
			if !applied[src][n] {
				t.Fatalf("the checkpoint of %s is %d but ev-%d was never applied: a committed, unacked cursor was checkpointed", src, cp, n)
			}
		}
		behind++
	}
	if behind == 0 {
		t.Fatal("no source placed on m2")
	}
	r.kill("m2")
	if err := os.RemoveAll(m2.dir); err != nil {
		t.Fatal(err)
	}
	delete(r.members, "m2")
	r.signalProcessor(syscall.SIGCONT)
	stopped = false
	r.waitPlaced([]string{"m1", "m3"}, 30*time.Second)
	r.waitEnd(120 * time.Second)
	r.waitApplied(120 * time.Second)
	t.Logf("m2 died with its disk; %d events applied once each", r.applied())
}

// TestClusterMemberLeavesOnlyAfterItsAcks stops a member with SIGTERM
// while the processor is stopped, so that its frames are in flight: it
// stays a member (its key says "draining") and keeps its sources (no
// other member polls them) until the processor is back and acks them,
// then hands them over with their final cursor and exits, well within
// its shutdown grace. Before, it revoked its lease first and waited out
// the whole grace with its frames unacked.
func TestClusterMemberLeavesOnlyAfterItsAcks(t *testing.T) {
	const nSources, total = 12, 600
	r := newClusterRig(t, nSources, total)
	r.startMidFeed("m1", "m2")
	all := r.names()
	m2 := r.members["m2"]
	mine := r.placedOn("m2", all)
	r.signalProcessor(syscall.SIGSTOP)
	testsync.WaitFor(t, "m2 to hold events no processor acked", 60*time.Second, func() bool {
		return scrapeMetric(m2.httpAddr, "ingestor_queue_pending_events") > 0
	})
	r.signal("m2", syscall.SIGTERM)
	termed := time.Now()
	exited := make(chan error, 1)
	go func() { exited <- m2.cmd.Wait() }()
	etcd := r.etcdClient()
	testsync.WaitFor(t, "m2's member key to say draining", 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := etcd.Get(ctx, "/ingestor/failover/members/m2")
		if err != nil || len(resp.Kvs) != 1 {
			return false
		}
		var info struct{ Draining bool }
		return json.Unmarshal(resp.Kvs[0].Value, &info) == nil && info.Draining
	})
	// The processor stays away for three seconds: m2 must still be there.
	time.Sleep(3 * time.Second)
	select {
	case err := <-exited:
		t.Fatalf("m2 exited (%v) with its frames unacked, %v after SIGTERM", err, time.Since(termed))
	default:
	}
	resumed := time.Now()
	r.signalProcessor(syscall.SIGCONT)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("m2 exited with %v\n%s", err, tail(m2.logs.String()))
		}
	case <-time.After(8 * time.Second):
		t.Fatalf("m2 still running 8s after the processor came back\n%s", tail(m2.logs.String()))
	}
	t.Logf("m2 left %v after the processor was back, %v after SIGTERM (shutdown_grace 30s)",
		time.Since(resumed).Round(time.Millisecond), time.Since(termed).Round(time.Millisecond))
	logs := m2.logs.String()
	if strings.Contains(logs, "grace period over") || !strings.Contains(logs, `"pending_events":0`) {
		t.Fatalf("m2 did not stop with every frame acked:\n%s", tail(logs))
	}
	for _, q := range r.up.Requests() {
		if q.Time.After(termed) && q.Time.Before(resumed) && q.Header.Get(sources.MemberHeader) == "m1" {
			for _, src := range mine {
				if q.Query.Get("src") == src {
					t.Fatalf("m1 polled %s, held by the draining m2, at %v", src, q.Time)
				}
			}
		}
	}
	r.waitPlaced([]string{"m1"}, 30*time.Second)
	r.waitEnd(120 * time.Second)
	r.waitApplied(120 * time.Second)
	r.checkNoPageMoved("across the drained hand-over")
}

// TestClusterRestartWithinRebalanceDelayMovesNothing restarts one of three
// members (SIGTERM, then started again on its data dir) within the
// rebalance delay: no other member polls one of its sources in between,
// and it gets back exactly its sources. The members compact etcd's history
// meanwhile (compact_interval = "10s"): a revision seen early on is
// compacted away, so the history etcd keeps stays bounded.
func TestClusterRestartWithinRebalanceDelayMovesNothing(t *testing.T) {
	const nSources, total = 30, 1500
	r := newClusterRig(t, nSources, total)
	r.rebalanceDelay, r.clusterExtra = "30s", `compact_interval = "10s"`
	r.start("m1", "m2", "m3")
	all := r.names()
	r.waitPlaced(all, 60*time.Second)
	etcd := r.etcdClient()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	early, err := etcd.Get(ctx, "/none")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	settled := time.Now()
	mine := r.placedOn("m2", all)
	r.signal("m2", syscall.SIGTERM)
	if err := r.members["m2"].cmd.Wait(); err != nil {
		t.Fatalf("m2's stop: %v", err)
	}
	r.startOne("m2")
	r.waitPlaced(all, 60*time.Second)
	for _, q := range r.up.Requests() {
		if q.Time.Before(settled) || q.Header.Get(sources.MemberHeader) == "m2" {
			continue
		}
		for _, src := range mine {
			if q.Query.Get("src") == src {
				t.Fatalf("%s polled m2's source %s at %v, while m2 restarted within the rebalance delay", q.Header.Get(sources.MemberHeader), src, q.Time)
			}
		}
	}
	testsync.WaitFor(t, "etcd's history before the restart to be compacted away", 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := etcd.Get(ctx, "/none", clientv3.WithRev(early.Header.Revision))
		return errors.Is(err, rpctypes.ErrCompacted)
	})
	r.waitEnd(120 * time.Second)
	r.waitApplied(120 * time.Second)
}
