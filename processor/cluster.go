package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
)

// Member is one daemon of a cluster (the daemon's [cluster] mode), as a
// processor reaches it: the value of its member key in etcd.
type Member struct {
	// Name is the member's name, its cluster.member_name.
	Name string `json:"member"`
	// Endpoint and AckEndpoint are its publish.endpoint and
	// publish.ack_endpoint, a wildcard host replaced by its
	// cluster.advertise_host.
	Endpoint    string `json:"events"`
	AckEndpoint string `json:"acks"`
}

// Members reports a cluster's membership.
type Members interface {
	// Watch calls update with the whole list of members, at once and then
	// each time it changes, until ctx ends; it returns nil then, or an
	// error that ends RunCluster. A membership that cannot be read for a
	// while (etcd down) keeps the last list: the processors go on
	// consuming from the members they know.
	Watch(ctx context.Context, update func([]Member)) error
}

// StaticMembers is a membership fixed by hand.
type StaticMembers []Member

// Watch implements Members: it reports s once.
func (s StaticMembers) Watch(ctx context.Context, update func([]Member)) error {
	update(slices.Clone(s))
	<-ctx.Done()
	return nil
}

// RunCluster processes the events of every member of a cluster: it runs
// one Client per member, made from o with the member's endpoints, and
// calls run with each (for example func(ctx context.Context, c *Client)
// error { return c.Run(ctx, h) }, or c.RunTx with a shared database). A
// member's frames arrive on its own sockets, so each ack goes back to the
// member that sent the frame. Clients start and stop as members join and
// leave; a member whose endpoints change gets a new Client. A Client that
// fails is logged and started again at the next change of membership.
//
// Every member sends its own copy of an event its source fetched twice
// across a failover (see PROTOCOL.md, "Several daemons"): deduplicate by
// (Event.Source, Event.Key) across all members, as RunTx does in one
// database. Options.DedupeDB opened by several Clients does not rule out
// two members' copies being handled at the same moment.
//
// RunCluster returns when ctx ends (after every Client stopped), or when
// members.Watch fails.
func RunCluster(ctx context.Context, o Options, members Members, run func(ctx context.Context, c *Client) error) error {
	if run == nil {
		return errors.New("processor: nil run function")
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	type running struct {
		m    Member
		stop context.CancelFunc
		done chan struct{}
	}
	var mu sync.Mutex
	clients := map[string]*running{}
	stop := func(r *running) {
		r.stop()
		<-r.done
	}
	update := func(list []Member) {
		want := map[string]Member{}
		for _, m := range list {
			if m.Name != "" {
				want[m.Name] = m
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, name := range slices.Sorted(maps.Keys(clients)) {
			r := clients[name]
			if m, ok := want[name]; ok && m == r.m {
				continue
			}
			stop(r)
			delete(clients, name)
			log.Info("processor: stopped following a member", "member", name)
		}
		if ctx.Err() != nil {
			return
		}
		for _, name := range slices.Sorted(maps.Keys(want)) {
			if _, ok := clients[name]; ok {
				continue
			}
			m := want[name]
			mo := o
			mo.Endpoint, mo.AckEndpoint, mo.Logger = m.Endpoint, m.AckEndpoint, log.With("member", name)
			c, err := New(mo)
			if err != nil {
				log.Error("processor: cannot follow a member", "member", name, "err", err)
				continue
			}
			cctx, cancel := context.WithCancel(ctx)
			r := &running{m: m, stop: cancel, done: make(chan struct{})}
			clients[name] = r
			go func() {
				defer close(r.done)
				if err := run(cctx, c); err != nil && cctx.Err() == nil {
					log.Error("processor: following a member failed", "member", name, "err", err)
				}
			}()
			log.Info("processor: following a member", "member", name, "endpoint", m.Endpoint, "ack_endpoint", m.AckEndpoint)
		}
	}
	err := members.Watch(ctx, update)
	mu.Lock()
	for _, r := range clients {
		stop(r)
	}
	clear(clients)
	mu.Unlock()
	if err != nil {
		return fmt.Errorf("processor: watch the cluster's members: %w", err)
	}
	return nil
}
