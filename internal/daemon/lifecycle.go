package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// stops holds how to stop what Start started. Each component registers its
// stop right after it starts, so stopping (run) is derived from starting:
// it runs the stops in reverse order, last started first stopped, and
// cannot drift from Start as a hand-written mirror of it could. A
// component that depends on another started after it, so it stops before
// it: the sources stop before the sender they feed, the sender before the
// ZeroMQ context its socket lives in, the queue after everything that
// writes to it, and the data dir lock last.
type stops struct {
	mu   sync.Mutex
	list []namedStop
}

type namedStop struct {
	name string
	fn   func() error
}

// add registers fn to stop the component named name.
func (s *stops) add(name string, fn func() error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, namedStop{name: name, fn: fn})
}

// addFunc registers fn, which cannot fail, to stop name.
func (s *stops) addFunc(name string, fn func()) {
	s.add(name, func() error { fn(); return nil })
}

// spawn runs run in a goroutine of its own until stopping cancels its
// context, and registers that stop: cancel, then wait for run to return.
// run must not use the Daemon's fields that Start's error returns clear.
func (s *stops) spawn(name string, run func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx)
	}()
	s.addFunc(name, func() {
		cancel()
		<-done
	})
}

// run stops every registered component in reverse order, each once, and
// returns their errors, each named by its component. A second run stops
// nothing more.
func (s *stops) run() error {
	var errs []error
	for {
		s.mu.Lock()
		if len(s.list) == 0 {
			s.mu.Unlock()
			return errors.Join(errs...)
		}
		last := s.list[len(s.list)-1]
		s.list = s.list[:len(s.list)-1]
		s.mu.Unlock()
		if err := last.fn(); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", last.name, err))
		}
	}
}
