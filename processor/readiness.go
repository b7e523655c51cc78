package processor

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// readiness waits for the receiving socket to have a message, in Go's
// network poller instead of a blocking call into libzmq.
//
// A goroutine blocked in a call into C keeps its P in a system call, and
// while one is, the runtime's sysmon thread cannot sleep: it wakes every
// 20 us, for 1 ms after each time it retakes the P, which it does after
// 10 ms in the call. Waiting in zmq_poll between frames kept it doing so
// all the time, ~10% of the example processor's CPU
// (docs/performance.md).
//
// The socket's ZMQ_FD becomes readable when its mailbox receives a
// command, which it does when a message arrives on a pipe that was empty,
// after a receive found nothing (EAGAIN). So: receive until EAGAIN, then
// wait for the FD, edge-triggered as Go's poller is, then receive again.
// The FD stays readable from a signal until libzmq reads it, which the
// receive after the signal does, so a signal that came between the EAGAIN
// and the wait is seen by looking at the FD before waiting (Go's poller
// forgets it when a wait starts); a wake with no message is harmless.
type readiness struct {
	f     *os.File // a duplicate of ZMQ_FD, ours to close
	rc    syscall.RawConn
	arm   chan struct{} // a wait is wanted (buffered: one at a time)
	ready chan struct{} // the FD was signalled (buffered)
	// armed: a wait was asked for and its end not yet taken from ready.
	armed bool
	done  chan struct{} // closed when the goroutine returns
	err   error         // why it returned early, read after done
}

// newReadiness starts waiting for fd, the socket's ZMQ_FD, which stays
// libzmq's: it is duplicated.
func newReadiness(fd int) (*readiness, error) {
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("duplicate ZMQ_FD: %w", err)
	}
	syscall.CloseOnExec(dup)
	// libzmq's FD is non-blocking already, which makes it pollable here.
	f := os.NewFile(uintptr(dup), "zmq-fd")
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("ZMQ_FD: %w", err), f.Close())
	}
	r := &readiness{f: f, rc: rc, arm: make(chan struct{}, 1), ready: make(chan struct{}, 1), done: make(chan struct{})}
	go r.run()
	return r, nil
}

func (r *readiness) run() {
	defer close(r.done)
	for range r.arm {
		waited := false
		err := r.rc.Read(func(fd uintptr) bool {
			if waited {
				return true
			}
			waited = true
			// Read forgets a signal the poller saw before it: look.
			return readable(int(fd))
		})
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				r.err = fmt.Errorf("wait for ZMQ_FD: %w", err)
			}
			return
		}
		r.ready <- struct{}{}
	}
}

// readable reports whether fd is readable now, without reading it.
func readable(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 0)
	return err != nil || n > 0 // an error: look at the socket
}

// wait returns the channel that receives when the FD is signalled,
// asking for a wait unless one is under way.
func (r *readiness) wait() <-chan struct{} {
	if !r.armed {
		r.armed = true
		r.arm <- struct{}{}
	}
	return r.ready
}

// took records that a value was taken from the channel wait returned.
func (r *readiness) took() { r.armed = false }

// close stops the goroutine and closes the duplicate FD.
func (r *readiness) close() error {
	close(r.arm)
	err := r.f.SetReadDeadline(time.Now()) // ends a wait under way
	<-r.done
	return errors.Join(err, r.f.Close())
}
