package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/backoff"
	"github.com/ingestorhq/ingestor/sources"
)

// restartStrategy restarts only the failed child, after a capped
// exponential backoff with full jitter. The failure count resets once the
// child has run for resetAfter without failing. (protoactor-go's own
// ExponentialBackoffStrategy grows linearly and jitters by nanoseconds.)
type restartStrategy struct {
	policy     backoff.Policy
	resetAfter time.Duration
	log        *slog.Logger
	metrics    *Metrics
}

// HandleFailure implements actor.SupervisorStrategy.
func (s *restartStrategy) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, _ any) {
	if rs.NumberOfFailures(s.resetAfter) == 0 {
		rs.Reset()
	}
	rs.Fail()
	wait := s.policy.Delay(rs.FailureCount() - 1)
	name := actorName(child)
	s.metrics.restarts.WithLabelValues(name).Inc()
	s.metrics.crashed(name, reason, wait)
	s.log.Error("actor crashed; restarting", "actor", name, "reason", fmt.Sprint(reason), "failures", rs.FailureCount(), "restart_in", wait)
	time.AfterFunc(wait, func() { sup.RestartChildren(child) })
}

// actorName strips the supervisor's prefix from a child's id.
func actorName(pid *actor.PID) string {
	id := pid.GetId()
	if i := strings.LastIndexByte(id, '/'); i >= 0 {
		return id[i+1:]
	}
	return id
}

// RestartPolicy is the backoff between restarts of a crashed actor.
var RestartPolicy = backoff.Policy{Base: 200 * time.Millisecond, Max: 30 * time.Second}

// Pipeline is the running actor tree.
type Pipeline struct {
	system *actor.ActorSystem
	deps   *Deps
	root   *actor.PID
	log    *slog.Logger

	mu       sync.Mutex
	sources  map[string]*actor.PID
	srcs     []config.Source       // the configured sources; Apply replaces them
	limiters *sources.RateLimiters // the shared limiters they may name
}

// Start spawns the supervisor, the shared actors and one SourceActor per
// enabled source; limiters are the shared limiters sources may name.
func Start(system *actor.ActorSystem, deps *Deps, srcs []config.Source, limiters *sources.RateLimiters) (*Pipeline, error) {
	p := &Pipeline{system: system, deps: deps, sources: make(map[string]*actor.PID), srcs: srcs, limiters: limiters, log: deps.Logger}
	strategy := &restartStrategy{policy: RestartPolicy, resetAfter: time.Minute, log: deps.Logger, metrics: deps.Metrics}
	ready := make(chan error, 1)
	props := actor.PropsFromProducer(func() actor.Actor {
		return &supervisorActor{p: p, ready: ready}
	}, actor.WithSupervisor(strategy))
	pid, err := system.Root.SpawnNamed(props, "supervisor")
	if err != nil {
		return nil, fmt.Errorf("spawn supervisor: %w", err)
	}
	p.root = pid
	if err := <-ready; err != nil {
		return nil, errors.Join(err, system.Root.StopFuture(pid).Wait())
	}
	return p, nil
}

// supervisorActor owns every other actor as its child.
type supervisorActor struct {
	p     *Pipeline
	ready chan error
}

// safetyMailbox bounds shared actors' mailboxes. The in-flight windows keep
// them far below it; it exists only as a limit (a sender blocked on a full
// Bounded mailbox spins, so it must never be the backpressure).
const safetyMailbox = 1 << 14

// Receive implements actor.Actor.
func (s *supervisorActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		s.started(ctx)
	case *spawnSources:
		ctx.Respond(&spawnedSources{err: s.spawnSources(ctx, m.names)})
	}
}

// started spawns the shared actors and every enabled polled source.
func (s *supervisorActor) started(ctx actor.Context) {
	d := s.p.deps
	var err error
	if d.PersistRaw, err = spawnChild(ctx, "persist-raw", func() actor.Actor { return &PersistRaw{deps: d} }); err != nil {
		s.report(err)
		return
	}
	if d.Publisher, err = spawnChild(ctx, "publisher", func() actor.Actor { return &Publisher{deps: d} }); err != nil {
		s.report(err)
		return
	}
	s.p.mu.Lock()
	var names []string
	for _, src := range s.p.srcs {
		_, push := src.Spec.(sources.PushSpec)
		if !d.Placed || push { // push sources are served on every member
			names = append(names, src.Name)
		}
	}
	s.p.mu.Unlock()
	s.report(s.spawnSources(ctx, names))
}

// spawnSources spawns a SourceActor for each of names that is an enabled
// polled source of the pipeline's current config; a push source is served
// by the push listener, not polled: it only gets its counters at 0.
func (s *supervisorActor) spawnSources(ctx actor.Context, names []string) error {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	for _, src := range s.p.srcs {
		if !src.Enabled || !slices.Contains(names, src.Name) {
			continue
		}
		if _, push := src.Spec.(sources.PushSpec); push {
			s.p.deps.Metrics.initPushed(src.Name)
			continue
		}
		d, limiters := s.p.deps, s.p.limiters
		d.Metrics.initPolled(src.Name)
		pid, err := spawnChild(ctx, "source-"+src.Name, func() actor.Actor { return newSourceActor(src, d, limiters) })
		if err != nil {
			return err
		}
		s.p.sources[src.Name] = pid
	}
	return nil
}

// spawnChild spawns a child of the supervisor with a bounded mailbox.
func spawnChild(ctx actor.Context, name string, producer actor.Producer) (*actor.PID, error) {
	pid, err := ctx.SpawnNamed(actor.PropsFromProducer(producer, actor.WithMailbox(actor.Bounded(safetyMailbox))), name)
	if err != nil {
		return nil, fmt.Errorf("spawn %s: %w", name, err)
	}
	return pid, nil
}

// report tells Start how spawning went; only the first incarnation's
// report is awaited.
func (s *supervisorActor) report(err error) {
	select {
	case s.ready <- err:
	default:
		if err != nil {
			s.p.log.Error("supervisor restart", "err", err)
		}
	}
}

// Drain asks every source to stop fetching, cancelling a fetch in
// progress, and waits until each has committed what it fetched before, or
// ctx ends.
func (p *Pipeline) Drain(ctx context.Context) error {
	p.mu.Lock()
	pids := maps.Clone(p.sources)
	p.mu.Unlock()
	return p.drain(ctx, pids, false)
}

// drain is Drain of the source actors pids, by source name; with
// finishFetch a fetch in progress is not cancelled but finishes and
// commits.
func (p *Pipeline) drain(ctx context.Context, pids map[string]*actor.PID, finishFetch bool) error {
	timeout := time.Minute
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	var errs []error
	futures := make(map[string]*actor.Future, len(pids))
	for n, pid := range pids {
		futures[n] = p.system.Root.RequestFuture(pid, &drainRequest{finishFetch: finishFetch}, timeout)
	}
	for n, f := range futures {
		if _, err := f.Result(); err != nil {
			errs = append(errs, fmt.Errorf("drain source %q: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// Stop stops every actor, children first.
func (p *Pipeline) Stop() error {
	if err := p.system.Root.PoisonFuture(p.root).Wait(); err != nil {
		return fmt.Errorf("stop actors: %w", err)
	}
	return nil
}

// SourcePID returns the pid of a running source actor, for tests.
func (p *Pipeline) SourcePID(name string) *actor.PID {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sources[name]
}
