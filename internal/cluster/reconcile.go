package cluster

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ingestorhq/ingestor/internal/backoff"
)

// parallel is how many takes or hand-overs run at once.
const parallel = 16

// reconcile makes this member run exactly the sources placed on it: it
// hands over those placed elsewhere (all at once), stops those whose hold
// lapsed, and takes those placed here that no one holds. With relist the
// members and seats are read again from etcd.
func (c *Coordinator) reconcile(ctx context.Context, m *Member, relist bool) {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	if !m.Valid() {
		c.m.leaseValid.Set(0)
		return
	}
	c.m.leaseValid.Set(1)
	if !c.place(ctx, m, relist) {
		return
	}
	c.mu.Lock()
	draining, placed, owned := c.draining, c.placed, maps.Clone(c.owned)
	c.mu.Unlock()
	if draining {
		return
	}
	var leave []string
	for _, name := range slices.Sorted(maps.Keys(owned)) {
		switch {
		case !owned[name].o.Valid():
			c.drop(name, "this member's hold lapsed")
		case placed[name] != c.o.Member:
			leave = append(leave, name)
		}
	}
	c.HandOver(ctx, leave)
	var take []string
	for _, name := range slices.Sorted(maps.Keys(placed)) {
		if _, ok := owned[name]; !ok && placed[name] == c.o.Member {
			take = append(take, name)
		}
	}
	c.takeAll(ctx, m, take)
	c.mu.Lock()
	waiting := 0
	for _, name := range take {
		if _, ok := c.owned[name]; !ok {
			waiting++
		}
	}
	c.mu.Unlock()
	c.m.waiting.Set(float64(waiting))
}

// place computes where each source goes, again only when the candidates
// (members with a seat, and live members) or the sources changed. It
// reports false when the members could not be listed.
func (c *Coordinator) place(ctx context.Context, m *Member, relist bool) bool {
	c.mu.Lock()
	candidates, live := c.candidates, c.live
	c.mu.Unlock()
	if relist || candidates == nil {
		lctx, cancel := context.WithTimeout(ctx, c.o.LeaseTTL)
		defer cancel()
		members, _, err := m.Members(lctx)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("cluster: listing members failed; placement waits", "err", err)
			}
			return false
		}
		live = make(map[string]bool, len(members))
		for _, name := range members {
			live[name] = true
		}
		all := slices.Clone(members)
		if c.o.RebalanceDelay > 0 {
			seats, err := m.Seats(lctx)
			if err != nil {
				if ctx.Err() == nil {
					c.log.Warn("cluster: listing seats failed; placement waits", "err", err)
				}
				return false
			}
			all = append(all, seats...)
		}
		slices.Sort(all)
		candidates = slices.Compact(all)
		c.m.members.Set(float64(len(members)))
	}
	sources := slices.Sorted(slices.Values(c.host.Placeable()))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.placed == nil || !slices.Equal(candidates, c.candidates) || !slices.Equal(sources, c.placedSources) {
		c.placed = PlaceAll(sources, candidates)
		c.placedSources = sources
	}
	c.candidates, c.live = candidates, live
	unplaced := 0
	for _, name := range sources {
		if !live[c.placed[name]] {
			unplaced++
		}
	}
	c.m.unplaced.Set(float64(unplaced))
	return true
}

// each calls f for every item, parallel at a time, and waits.
func each[T any](items []T, f func(T)) {
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, item := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(item)
		})
	}
	wg.Wait()
}

// takeAll acquires those of names that no one holds, with their
// checkpoints, and starts them.
func (c *Coordinator) takeAll(ctx context.Context, m *Member, names []string) {
	if len(names) == 0 || ctx.Err() != nil || !m.Valid() {
		return
	}
	actx, cancel := context.WithTimeout(ctx, c.o.LeaseTTL)
	defer cancel()
	taken, err := m.AcquireAll(actx, names, c.o.MaxTxnOps)
	if err != nil && ctx.Err() == nil {
		c.log.Warn("cluster: taking sources failed; retrying", "err", err)
	}
	each(taken, func(t Taken) {
		if t.O == nil {
			c.log.Debug("cluster: source placed here is still held; waiting for its release", "source", t.Source, "holder", t.Holder)
			return
		}
		c.start(actx, t)
	})
}

// start installs t's checkpointed cursor and starts its source here.
func (c *Coordinator) start(ctx context.Context, t Taken) {
	c.mu.Lock()
	c.owned[t.Source] = &ownedSource{o: t.O, checkpoint: t.Cursor}
	c.m.owned.Set(float64(len(c.owned)))
	c.mu.Unlock()
	if err := c.host.Start(ctx, t.Source, t.Cursor, t.Checkpointed); err != nil {
		c.log.Error("cluster: starting a source placed here failed; releasing it", "source", t.Source, "err", err)
		c.forget(t.Source)
		c.release(t.O, "")
		return
	}
	c.m.moves.WithLabelValues("taken").Inc()
	c.log.Info("cluster: source placed here", "source", t.Source, "cursor", t.Cursor, "checkpointed", t.Checkpointed)
}

// HandOver stops the named sources held here gracefully, all at once:
// each one's fetched batches commit, its events get up to HandOverWait
// to be acked, and it is released with its settled cursor, so that the
// next owner fetches again only what was not acked.
func (c *Coordinator) HandOver(ctx context.Context, names []string) {
	each(names, func(name string) { c.handOver(ctx, name) })
}

func (c *Coordinator) handOver(ctx context.Context, name string) {
	own := c.forget(name)
	if own == nil {
		return
	}
	// The stop and the wait for acks each get the whole budget: stops
	// of many sources take turns on the pipeline, and the last one must
	// not find its wait for acks already spent.
	dctx, cancel := context.WithTimeout(ctx, c.o.HandOverWait)
	defer cancel()
	if err := c.host.HandOver(dctx, name); err != nil {
		c.log.Error("cluster: stopping a source to hand it over failed", "source", name, "err", err)
	}
	actx, cancelAcks := context.WithTimeout(ctx, c.o.HandOverWait)
	defer cancelAcks()
	cursor := c.settledCursor(actx, name)
	c.release(own.o, cursor)
	c.host.Forget(name)
	c.m.moves.WithLabelValues("handed_over").Inc()
	if committed, _, _ := c.host.Cursor(ctx, name); committed != cursor {
		c.log.Warn("cluster: source handed over before its events were acked; the next owner fetches them again", "source", name, "cursor", cursor, "committed", committed)
	} else {
		c.log.Info("cluster: source handed over", "source", name, "cursor", cursor)
	}
}

// settledCursor waits until name's committed cursor is settled, or ctx
// ends, and returns the newest settled cursor ("" when none).
func (c *Coordinator) settledCursor(ctx context.Context, name string) string {
	committed, _, err := c.host.Cursor(ctx, name)
	if err != nil {
		c.log.Warn("cluster: reading the final cursor failed; the next owner resumes from the last checkpoint", "source", name, "err", err)
	}
	settled := ""
	for {
		s, err := c.host.Settled(ctx, []string{name})
		if err == nil {
			if cur, ok := s[name]; ok {
				settled = cur
			}
		}
		if settled == committed || ctx.Err() != nil || !backoff.Sleep(ctx, 50*time.Millisecond) {
			return settled
		}
	}
}

// release gives up o, writing cursor as the final checkpoint unless it is
// empty.
func (c *Coordinator) release(o *Ownership, cursor string) {
	rctx, cancel := context.WithTimeout(context.Background(), c.o.LeaseTTL)
	defer cancel()
	if err := o.Release(rctx, cursor); err != nil {
		c.log.Warn("cluster: releasing a source failed; it moves when the lease expires", "source", o.Source(), "err", err)
	}
}

// drop stops name at once: this member no longer holds it.
func (c *Coordinator) drop(name, why string) {
	if c.forget(name) == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.o.HandOverWait)
	defer cancel()
	if err := c.host.Stop(ctx, name); err != nil {
		c.log.Error("cluster: stopping a source failed", "source", name, "err", err)
	}
	c.host.Forget(name)
	c.m.moves.WithLabelValues("dropped").Inc()
	c.log.Warn("cluster: source stopped", "source", name, "reason", why)
}

// dropAll stops every source this member runs.
func (c *Coordinator) dropAll(why string) {
	c.mu.Lock()
	names := slices.Sorted(maps.Keys(c.owned))
	c.mu.Unlock()
	each(names, func(name string) { c.drop(name, why) })
}

// forget removes name from the sources this member holds, so that its
// fence fails from now on, and returns what it held.
func (c *Coordinator) forget(name string) *ownedSource {
	c.mu.Lock()
	defer c.mu.Unlock()
	own := c.owned[name]
	delete(c.owned, name)
	c.m.owned.Set(float64(len(c.owned)))
	return own
}

// checkpoint writes the settled cursor of each source held whose settled
// cursor moved since its last checkpoint, in as few transactions as etcd
// allows. A checkpoint refused (the hold is gone) stops the source.
func (c *Coordinator) checkpoint(ctx context.Context, m *Member) {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	c.mu.Lock()
	owned := maps.Clone(c.owned)
	c.mu.Unlock()
	if len(owned) == 0 {
		return
	}
	names := slices.Sorted(maps.Keys(owned))
	settled, err := c.host.Settled(ctx, names)
	if err != nil {
		c.log.Warn("cluster: reading the settled cursors failed; checkpoints wait", "err", err)
		return
	}
	var writes []Write
	for _, name := range names {
		if cur, ok := settled[name]; ok && cur != owned[name].checkpoint {
			writes = append(writes, Write{O: owned[name].o, Cursor: cur})
		}
	}
	if len(writes) == 0 {
		return
	}
	// A checkpoint is worth nothing past the lease: a member cut off from
	// etcd notices its loss at the deadline, not a whole TTL later.
	cctx, cancel := context.WithDeadline(ctx, m.Deadline())
	refused, failed, err := m.WriteAll(cctx, writes, c.o.MaxTxnOps)
	cancel()
	if err != nil {
		c.log.Warn("cluster: checkpoints failed; retrying", "sources", len(failed), "err", err)
	}
	c.m.checkpoints.WithLabelValues("refused").Add(float64(len(refused)))
	c.m.checkpoints.WithLabelValues("failed").Add(float64(len(failed)))
	c.m.checkpoints.WithLabelValues("written").Add(float64(len(writes) - len(refused) - len(failed)))
	notWritten := map[string]bool{}
	for _, name := range slices.Concat(refused, failed) {
		notWritten[name] = true
	}
	c.mu.Lock()
	for _, w := range writes {
		if own := c.owned[w.O.source]; own == owned[w.O.source] && !notWritten[w.O.source] {
			own.checkpoint = w.Cursor
		}
	}
	c.mu.Unlock()
	for _, name := range refused {
		c.drop(name, "its checkpoint was refused: another member holds it")
	}
}
