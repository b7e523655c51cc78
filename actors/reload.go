package actors

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/sources"
)

// spawnSources asks the supervisor to spawn the named sources of the
// pipeline's current config; it answers spawnedSources.
type spawnSources struct{ names []string }

type spawnedSources struct{ err error }

// Apply changes the running sources to srcs as plan says: the sources
// plan stops or restarts drain (a fetch in progress is cancelled, what
// was fetched before commits) and stop; then those it starts or restarts
// are spawned from srcs, reading their durable cursor, with limiters as
// the shared limiters. The sources plan keeps are not touched: same actor,
// same schedule. Apply must not run concurrently with itself or Drain.
//
// A source that has not drained when ctx ends is stopped anyway: its
// cursor has not moved past what it fetched and did not commit, so its
// next incarnation fetches that again and nothing is lost.
func (p *Pipeline) Apply(ctx context.Context, plan config.Plan, srcs []config.Source, limiters *sources.RateLimiters) error {
	return p.apply(ctx, plan, srcs, limiters, false)
}

// HandOver stops the source name for cluster mode's hand-over to another
// member: unlike Apply's stop, a fetch in progress is not cancelled but
// finishes and commits (bounded by the source's timeout and its fence),
// so the final cursor covers every page this member asked for and the
// next owner fetches none of them again.
func (p *Pipeline) HandOver(ctx context.Context, name string) error {
	p.mu.Lock()
	srcs, limiters := p.srcs, p.limiters
	p.mu.Unlock()
	return p.apply(ctx, config.Plan{Stop: []string{name}}, srcs, limiters, true)
}

func (p *Pipeline) apply(ctx context.Context, plan config.Plan, srcs []config.Source, limiters *sources.RateLimiters, finishFetch bool) error {
	p.mu.Lock()
	leaving := make(map[string]*actor.PID)
	for _, n := range slices.Concat(plan.Stop, plan.Restart) {
		if pid, ok := p.sources[n]; ok {
			leaving[n] = pid
		}
	}
	p.mu.Unlock()
	if err := p.drain(ctx, leaving, finishFetch); err != nil {
		p.log.Warn("reload: a source did not drain in time; stopping it anyway (its cursor has not moved past what it did not commit)", "err", err)
	}
	for n, pid := range leaving {
		if err := p.system.Root.StopFuture(pid).Wait(); err != nil {
			return fmt.Errorf("stop source %q: %w", n, err)
		}
		p.mu.Lock()
		delete(p.sources, n)
		p.mu.Unlock()
	}
	for _, n := range plan.Stop {
		p.deps.Metrics.ForgetSource(n)
	}

	p.mu.Lock()
	p.srcs, p.limiters = srcs, limiters
	p.mu.Unlock()
	timeout := time.Minute
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Second)
	}
	res, err := p.system.Root.RequestFuture(p.root, &spawnSources{names: slices.Concat(plan.Start, plan.Restart)}, timeout).Result()
	if err != nil {
		return fmt.Errorf("spawn sources: %w", err)
	}
	return res.(*spawnedSources).err
}
