package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	system  *actor.ActorSystem
	deps    *Deps
	root    *actor.PID
	mu      sync.Mutex
	sources map[string]*actor.PID
	log     *slog.Logger
}

// Start spawns the supervisor, the shared actors and one SourceActor per
// enabled source.
func Start(system *actor.ActorSystem, deps *Deps, srcs []config.Source) (*Pipeline, error) {
	p := &Pipeline{system: system, deps: deps, sources: make(map[string]*actor.PID), log: deps.Logger}
	strategy := &restartStrategy{policy: RestartPolicy, resetAfter: time.Minute, log: deps.Logger, metrics: deps.Metrics}
	ready := make(chan error, 1)
	props := actor.PropsFromProducer(func() actor.Actor {
		return &supervisorActor{p: p, srcs: srcs, ready: ready}
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
	srcs  []config.Source
	ready chan error
}

// safetyMailbox bounds shared actors' mailboxes. The in-flight windows keep
// them far below it; it exists only as a limit (a sender blocked on a full
// Bounded mailbox spins, so it must never be the backpressure).
const safetyMailbox = 1 << 14

// Receive implements actor.Actor.
func (s *supervisorActor) Receive(ctx actor.Context) {
	if _, ok := ctx.Message().(*actor.Started); !ok {
		return
	}
	d := s.p.deps
	spawn := func(name string, producer actor.Producer) (*actor.PID, error) {
		pid, err := ctx.SpawnNamed(actor.PropsFromProducer(producer, actor.WithMailbox(actor.Bounded(safetyMailbox))), name)
		if err != nil {
			return nil, fmt.Errorf("spawn %s: %w", name, err)
		}
		return pid, nil
	}
	var err error
	if d.PersistRaw, err = spawn("persist-raw", func() actor.Actor { return &PersistRaw{deps: d} }); err != nil {
		s.report(err)
		return
	}
	if d.Publisher, err = spawn("publisher", func() actor.Actor { return &Publisher{deps: d} }); err != nil {
		s.report(err)
		return
	}
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	for _, src := range s.srcs {
		if _, push := src.Spec.(sources.PushSpec); !src.Enabled || push {
			continue // a push source is served by the push listener, not polled
		}
		pid, err := spawn("source-"+src.Name, func() actor.Actor { return newSourceActor(src, d) })
		if err != nil {
			s.report(err)
			return
		}
		s.p.sources[src.Name] = pid
	}
	s.report(nil)
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
	pids := make(map[string]*actor.PID, len(p.sources))
	for n, pid := range p.sources {
		pids[n] = pid
	}
	p.mu.Unlock()
	timeout := time.Minute
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	var errs []error
	futures := make(map[string]*actor.Future, len(pids))
	for n, pid := range pids {
		futures[n] = p.system.Root.RequestFuture(pid, &drainRequest{}, timeout)
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
