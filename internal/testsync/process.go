package testsync

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
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
