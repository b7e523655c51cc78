package testsync

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a server binary a test runs (an S3 server, etcd): its
// combined output is kept for failure messages, and it dies with the test
// binary even when the test's cleanups never run.
type Process struct {
	// Out is the process's stdout and stderr.
	Out  *LockedBuffer
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // the Wait result, valid once done is closed
}

// StartProcess starts cmd with its output in the Process's Out.
func StartProcess(cmd *exec.Cmd) (*Process, error) {
	p := &Process{Out: &LockedBuffer{}, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Out, p.Out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Done is closed once the process has exited; Err then returns how.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err returns the process's exit error once Done is closed.
func (p *Process) Err() error { return p.err }

// Signal sends sig to the process; a process that has exited is not an
// error.
func (p *Process) Signal(sig os.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// Stop sends SIGTERM and waits up to grace for the process to exit, then
// kills it. It returns an error when the signal failed or the process had
// to be killed.
func (p *Process) Stop(grace time.Duration) error {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	err := p.Signal(syscall.SIGKILL)
	<-p.done
	return errors.Join(fmt.Errorf("did not exit %v after SIGTERM; killed", grace), err)
}

// Timings of a Service.
const (
	// ServiceReadyTimeout bounds how long Start waits for the server to
	// answer its probe.
	ServiceReadyTimeout = 30 * time.Second
	// serviceStopGrace bounds how long Stop waits after SIGTERM before
	// SIGKILL.
	serviceStopGrace = 10 * time.Second
	// serviceProbeInterval is how often Start probes the server.
	serviceProbeInterval = 20 * time.Millisecond
)

// Service is a server a test starts, stops and restarts in place (same
// ports, same data): launch starts its process, probe reports whether it
// answers yet. The S3 and etcd test harnesses are Services.
type Service struct {
	t      testing.TB
	name   string
	launch func() (*Process, error)
	probe  func() error

	mu   sync.Mutex
	proc *Process // nil while stopped
}

// NewService returns a stopped Service; name prefixes its failures.
func NewService(t testing.TB, name string, launch func() (*Process, error), probe func() error) *Service {
	return &Service{t: t, name: name, launch: launch, probe: probe}
}

// Start launches the process and probes it until it answers, it exits, or
// ServiceReadyTimeout passes; a process that does not answer is stopped,
// and the error ends with its output.
func (s *Service) Start() error {
	p, err := s.launch()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	if err := s.waitReady(p); err != nil {
		s.Stop()
		return fmt.Errorf("%s: %w\n%s", s.name, err, p.Out)
	}
	return nil
}

func (s *Service) waitReady(p *Process) error {
	deadline := time.NewTimer(ServiceReadyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(serviceProbeInterval)
	defer tick.Stop()
	for {
		err := s.probe()
		if err == nil {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("exited during startup: %v", p.Err())
		case <-deadline.C:
			return fmt.Errorf("not ready after %v: %w", ServiceReadyTimeout, err)
		case <-tick.C:
		}
	}
}

// Stop terminates the process with SIGTERM, killing it after a grace
// period, and reports a failure to the test. Stop on a stopped Service
// does nothing.
func (s *Service) Stop() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	if err := p.Stop(serviceStopGrace); err != nil {
		s.t.Errorf("%s: stop: %v\n%s", s.name, err, p.Out)
	}
}

// Restart stops the process if it runs and starts it again, failing the
// test if it does not get ready.
func (s *Service) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.Start(); err != nil {
		s.t.Fatalf("%s: restart: %v", s.name, err)
	}
}
