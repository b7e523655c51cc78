package cluster_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/cluster"
	"github.com/ingestorhq/ingestor/internal/etcdtest"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// dial returns a client of the etcd at endpoint, closed when the test ends.
func dial(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := cluster.Dial(config.Cluster{EtcdEndpoints: []string{endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// join joins the cluster "t" as name with its own client.
func join(t *testing.T, endpoint, name string, ttl time.Duration) (*cluster.Member, *clientv3.Client) {
	t.Helper()
	c := dial(t, endpoint)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	m, err := cluster.Join(ctx, c, cluster.Options{Cluster: "t", Member: name, TTL: ttl, Info: []byte(`{"name":"` + name + `"}`)})
	if err != nil {
		t.Fatalf("join as %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = m.Leave(ctx) // the test may have left, lost the lease or closed the client already
	})
	return m, c
}

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestEtcdOwnershipIsExclusiveAndFencesCheckpoints: of two members asking
// for one source only one gets it; once its lease is gone the other takes
// the source, and the first can neither checkpoint nor release it any
// more, so the cursor is the new owner's.
func TestEtcdOwnershipIsExclusiveAndFencesCheckpoints(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _ := join(t, etcd.Endpoint, "a", 5*time.Second)
	b, _ := join(t, etcd.Endpoint, "b", 5*time.Second)
	ctx := ctx10(t)

	oa, holder, err := a.Acquire(ctx, "orders")
	if err != nil || oa == nil {
		t.Fatalf("a acquires orders: %v %v", oa, err)
	}
	ob, holder, err := b.Acquire(ctx, "orders")
	if err != nil || ob != nil || holder != "a" {
		t.Fatalf("b acquires orders held by a: ownership %v, holder %q, %v; want refused, held by a", ob, holder, err)
	}
	if err := oa.Checkpoint(ctx, "10"); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := b.Checkpointed(ctx, "orders"); err != nil || !ok || c != "10" {
		t.Fatalf("checkpoint read by b: %q %v %v, want 10", c, ok, err)
	}
	members, _, err := b.Members(ctx)
	if err != nil || !slices.Equal(members, []string{"a", "b"}) {
		t.Fatalf("members %v %v, want [a b]", members, err)
	}

	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Valid() || oa.Valid() {
		t.Error("a still valid after leaving")
	}
	ob, _, err = b.Acquire(ctx, "orders")
	if err != nil || ob == nil {
		t.Fatalf("b acquires orders after a left: %v %v", ob, err)
	}
	if err := ob.Checkpoint(ctx, "20"); err != nil {
		t.Fatal(err)
	}
	if err := oa.Checkpoint(ctx, "11"); !errors.Is(err, cluster.ErrNotOwner) {
		t.Errorf("a's checkpoint after losing orders: %v, want ErrNotOwner", err)
	}
	if err := oa.Release(ctx, "12"); !errors.Is(err, cluster.ErrNotOwner) {
		t.Errorf("a's release after losing orders: %v, want ErrNotOwner", err)
	}
	if c, _, err := b.Checkpointed(ctx, "orders"); err != nil || c != "20" {
		t.Errorf("checkpoint %q %v, want b's 20", c, err)
	}
	if members, _, err := b.Members(ctx); err != nil || !slices.Equal(members, []string{"b"}) {
		t.Errorf("members after a left: %v %v, want [b]", members, err)
	}
}

// TestEtcdReleaseHandsOverTheFinalCursor: a graceful release writes the
// final cursor with the key's deletion, so the next owner starts there.
func TestEtcdReleaseHandsOverTheFinalCursor(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _ := join(t, etcd.Endpoint, "a", 5*time.Second)
	b, _ := join(t, etcd.Endpoint, "b", 5*time.Second)
	ctx := ctx10(t)
	oa, _, err := a.Acquire(ctx, "users")
	if err != nil || oa == nil {
		t.Fatal(oa, err)
	}
	if err := oa.Checkpoint(ctx, "5"); err != nil {
		t.Fatal(err)
	}
	if err := oa.Release(ctx, "9"); err != nil {
		t.Fatal(err)
	}
	ob, _, err := b.Acquire(ctx, "users")
	if err != nil || ob == nil {
		t.Fatalf("b acquires users after its release: %v %v", ob, err)
	}
	if c, ok, err := b.Checkpointed(ctx, "users"); err != nil || !ok || c != "9" {
		t.Errorf("checkpoint after the release: %q %v %v, want the final 9", c, ok, err)
	}
	if err := oa.Checkpoint(ctx, "10"); !errors.Is(err, cluster.ErrNotOwner) {
		t.Errorf("checkpoint after the release: %v, want ErrNotOwner", err)
	}
}

// TestEtcdMemberNameTaken: a second live daemon with the same member name
// is refused, and the name is free again once the first leaves.
func TestEtcdMemberNameTaken(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _ := join(t, etcd.Endpoint, "a", 5*time.Second)
	_, err := cluster.Join(ctx10(t), dial(t, etcd.Endpoint), cluster.Options{Cluster: "t", Member: "a", TTL: 5 * time.Second})
	if !errors.Is(err, cluster.ErrMemberTaken) || !strings.Contains(err.Error(), "/ingestor/t/members/a") {
		t.Fatalf("second join as a: %v, want ErrMemberTaken naming the key", err)
	}
	if err := a.Leave(ctx10(t)); err != nil {
		t.Fatal(err)
	}
	join(t, etcd.Endpoint, "a", 5*time.Second)
}

// TestEtcdPartitionedMemberStopsBeforeAnotherTakesOver cuts member a off
// from etcd (its client is closed: no keepalive gets through, as in a
// partition) while b keeps asking for a's source. a must see its lease
// lost before b can take the source, with at least the margin between.
func TestEtcdPartitionedMemberStopsBeforeAnotherTakesOver(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, ca := join(t, etcd.Endpoint, "a", 2*time.Second)
	b, _ := join(t, etcd.Endpoint, "b", 2*time.Second)
	ctx := ctx10(t)
	oa, _, err := a.Acquire(ctx, "orders")
	if err != nil || oa == nil {
		t.Fatal(oa, err)
	}
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	var validAtTakeover bool
	testsync.WaitFor(t, "b to take orders", 15*time.Second, func() bool {
		ob, _, err := b.Acquire(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		validAtTakeover = oa.Valid()
		return ob != nil
	})
	if validAtTakeover {
		t.Fatalf("b took orders while a's ownership was still valid (a's deadline %v)", a.Deadline())
	}
	select {
	case <-a.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a's lease is invalid but Lost is not closed")
	}
	if !strings.Contains(a.LostReason(), "keepalive") {
		t.Errorf("a lost its lease because %q, want no keepalive answered", a.LostReason())
	}
}

// TestEtcdMembersStopWhileEtcdIsDown stops etcd for longer than the lease:
// each member sees its lease lost by the end of its TTL and stops;
// when etcd is back, a member joining can take the sources of the old
// member only once etcd has expired its lease, which the old member never
// renews again.
func TestEtcdMembersStopWhileEtcdIsDown(t *testing.T) {
	etcd := etcdtest.Start(t)
	const ttl = 2 * time.Second
	a, _ := join(t, etcd.Endpoint, "a", ttl)
	ctx := ctx10(t)
	oa, _, err := a.Acquire(ctx, "orders")
	if err != nil || oa == nil {
		t.Fatal(oa, err)
	}
	deadline := a.Deadline()
	stopped := time.Now()
	etcd.Stop()
	select {
	case <-a.Lost():
	case <-time.After(ttl + 5*time.Second):
		t.Fatalf("a still holds its lease %v after etcd stopped (deadline was %v)", time.Since(stopped), deadline)
	}
	if lost := time.Now(); lost.After(deadline.Add(time.Second)) {
		t.Errorf("a saw its lease lost at %v, over a second after its deadline %v", lost, deadline)
	}
	if oa.Valid() {
		t.Error("a's ownership valid without a lease")
	}
	etcd.Restart()
	b, _ := join(t, etcd.Endpoint, "b", ttl)
	testsync.WaitFor(t, "b to take orders once etcd expires a's lease", 20*time.Second, func() bool {
		ob, _, err := b.Acquire(ctx10(t), "orders")
		return err == nil && ob != nil
	})
}
