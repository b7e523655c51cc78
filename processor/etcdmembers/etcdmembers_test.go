package etcdmembers_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/cluster"
	"github.com/ingestorhq/ingestor/internal/etcdtest"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
	"github.com/ingestorhq/ingestor/processor/etcdmembers"
)

// TestEtcdMembersFollowsJoinsAndLeaves watches the members of a cluster
// while daemons' member keys come and go (written as the daemon writes
// them, by cluster.Join), then while etcd is down: the last list stays,
// and a member that joined meanwhile shows once etcd is back.
func TestEtcdMembersFollowsJoinsAndLeaves(t *testing.T) {
	etcd := etcdtest.Start(t)
	client, err := cluster.Dial(config.Cluster{EtcdEndpoints: []string{etcd.Endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var mu sync.Mutex
	var lists [][]processor.Member
	latest := func() []string {
		mu.Lock()
		defer mu.Unlock()
		if len(lists) == 0 {
			return nil
		}
		var names []string
		for _, m := range lists[len(lists)-1] {
			names = append(names, m.Name+"@"+m.Endpoint)
		}
		return names
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- etcdmembers.New(client, "c", slog.New(slog.DiscardHandler)).Watch(ctx, func(l []processor.Member) {
			mu.Lock()
			defer mu.Unlock()
			lists = append(lists, l)
		})
	}()
	join := func(c *clientv3.Client, name string) *cluster.Member {
		jctx, jcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer jcancel()
		m, err := cluster.Join(jctx, c, cluster.Options{Cluster: "c", Member: name, TTL: 10 * time.Second,
			Info: []byte(`{"member":"` + name + `","events":"tcp://` + name + `:1","acks":"tcp://` + name + `:2"}`)})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	want := func(names ...string) {
		t.Helper()
		testsync.WaitFor(t, fmt.Sprintf("members %v to be reported", names), 20*time.Second, func() bool {
			return slices.Equal(latest(), names)
		})
	}
	want()
	m1 := join(client, "m1")
	want("m1@tcp://m1:1")
	m2 := join(client, "m2")
	want("m1@tcp://m1:1", "m2@tcp://m2:1")
	lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := m1.Leave(lctx); err != nil {
		t.Fatal(err)
	}
	lcancel()
	want("m2@tcp://m2:1")

	etcd.Stop()
	mu.Lock()
	before := len(lists)
	mu.Unlock()
	etcd.Restart()
	m3 := join(client, "m3")
	want("m2@tcp://m2:1", "m3@tcp://m3:1")
	mu.Lock()
	for _, l := range lists[before:] {
		if len(l) == 0 {
			t.Errorf("an empty membership was reported around the etcd outage: %v", lists[before:])
		}
	}
	mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, m := range []*cluster.Member{m2, m3} {
		lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = m.Leave(lctx) // m2's lease may have expired during the outage
		lcancel()
	}
}
