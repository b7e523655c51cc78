// Package zmqpull is a ZeroMQ PULL socket, in a ZeroMQ context of its
// own, that receives each message into memory its caller provides: our
// own small wrapper over libzmq's C API, for the processor client.
//
// github.com/pebbe/zmq4 copies every message into a newly allocated Go
// slice inside one call into C. For the processor's frames (~75 KB each)
// that meant a fresh allocation, and garbage, per frame, and a call into C
// long enough (the copy, page faults included) for the Go runtime to hand
// the goroutine's P to another thread. Here the call into C only takes the
// message from libzmq; the copy is Go code, into a buffer the caller may
// reuse, and a second short call frees libzmq's copy.
//
// A Socket is used by one goroutine at a time, as libzmq sockets are.
package zmqpull

/*
#cgo !windows pkg-config: libzmq
#include <errno.h>
#include <stdlib.h>
#include <zmq.h>

// zmqpull_recv receives one message part without waiting into msg, which
// it initializes: the size of the part, its data and whether more parts
// follow; -errno when there is none (msg is then closed).
static int zmqpull_recv(void *sock, zmq_msg_t *msg, void **data, int *more) {
	int rc;
	zmq_msg_init(msg);
	do {
		rc = zmq_msg_recv(msg, sock, ZMQ_DONTWAIT);
	} while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		int e = errno;
		zmq_msg_close(msg);
		return -e;
	}
	*data = zmq_msg_data(msg);
	*more = zmq_msg_more(msg);
	return rc;
}

static int zmqpull_setsockopt_int(void *sock, int opt, int v) {
	return zmq_setsockopt(sock, opt, &v, sizeof v) == 0 ? 0 : -errno;
}

static int zmqpull_setsockopt_bytes(void *sock, int opt, const void *v, size_t n) {
	return zmq_setsockopt(sock, opt, v, n) == 0 ? 0 : -errno;
}

static int zmqpull_fd(void *sock) {
	int fd;
	size_t n = sizeof fd;
	return zmq_getsockopt(sock, ZMQ_FD, &fd, &n) == 0 ? fd : -errno;
}

static int zmqpull_connect(void *sock, const char *endpoint) {
	return zmq_connect(sock, endpoint) == 0 ? 0 : -errno;
}

static void *zmqpull_socket(void *ctx, int *err) {
	void *s = zmq_socket(ctx, ZMQ_PULL);
	*err = s ? 0 : errno;
	return s;
}

static int zmqpull_term(void *ctx) {
	int rc;
	do {
		rc = zmq_ctx_term(ctx);
	} while (rc < 0 && errno == EINTR);
	return rc == 0 ? 0 : -errno;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"
	"time"
	"unsafe"
)

// ErrAgain is Recv's error when no message is waiting.
var ErrAgain = syscall.EAGAIN

// Options configure a Socket.
type Options struct {
	// ReceiveHWM is ZMQ_RCVHWM, the most messages queued; 0 is libzmq's
	// default.
	ReceiveHWM int
	// Linger is ZMQ_LINGER; a PULL socket has nothing to send, so 0.
	Linger time.Duration
	// CurveServerKey, CurvePublicKey and CurveSecretKey, in Z85, make the
	// socket a CURVE client of that server; all empty for none.
	CurveServerKey, CurvePublicKey, CurveSecretKey string
}

// Socket is a connected PULL socket.
type Socket struct {
	ctx, sock unsafe.Pointer
	msg       *C.zmq_msg_t // in C memory: libzmq may keep pointers into it
}

// Dial opens a context and a PULL socket with o and connects it to
// endpoint. Its errors do not repeat the endpoint.
func Dial(endpoint string, o Options) (_ *Socket, err error) {
	zctx, errno := C.zmq_ctx_new()
	if zctx == nil {
		return nil, fmt.Errorf("zmq_ctx_new: %w", errno)
	}
	s := &Socket{ctx: zctx}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Close())
		}
	}()
	var e C.int
	if s.sock = C.zmqpull_socket(s.ctx, &e); s.sock == nil {
		return nil, fmt.Errorf("zmq_socket: %w", syscall.Errno(e))
	}
	s.msg = (*C.zmq_msg_t)(C.malloc(C.size_t(unsafe.Sizeof(C.zmq_msg_t{}))))
	if err := s.setInt(C.ZMQ_LINGER, int(o.Linger/time.Millisecond), "linger"); err != nil {
		return nil, err
	}
	if o.ReceiveHWM > 0 {
		if err := s.setInt(C.ZMQ_RCVHWM, o.ReceiveHWM, "receive HWM"); err != nil {
			return nil, err
		}
	}
	for _, k := range []struct {
		opt  C.int
		key  string
		name string
	}{{C.ZMQ_CURVE_SERVERKEY, o.CurveServerKey, "CURVE server key"},
		{C.ZMQ_CURVE_PUBLICKEY, o.CurvePublicKey, "CURVE public key"},
		{C.ZMQ_CURVE_SECRETKEY, o.CurveSecretKey, "CURVE secret key"}} {
		if k.key != "" {
			if err := s.setBytes(k.opt, []byte(k.key), k.name); err != nil {
				return nil, err
			}
		}
	}
	ep := C.CString(endpoint)
	defer C.free(unsafe.Pointer(ep))
	if rc := C.zmqpull_connect(s.sock, ep); rc < 0 {
		return nil, fmt.Errorf("connect: %w", syscall.Errno(-rc))
	}
	return s, nil
}

func (s *Socket) setInt(opt C.int, v int, name string) error {
	if rc := C.zmqpull_setsockopt_int(s.sock, opt, C.int(v)); rc < 0 {
		return fmt.Errorf("set %s %d: %w", name, v, syscall.Errno(-rc))
	}
	return nil
}

// setBytes sets a byte option; errors never show the value (a key).
func (s *Socket) setBytes(opt C.int, v []byte, name string) error {
	cv := C.CBytes(v)
	defer C.free(cv)
	if rc := C.zmqpull_setsockopt_bytes(s.sock, opt, cv, C.size_t(len(v))); rc < 0 {
		return fmt.Errorf("set %s: %w", name, syscall.Errno(-rc))
	}
	return nil
}

// FD returns the socket's ZMQ_FD, which becomes readable when a message
// may have arrived after a Recv returned ErrAgain (see libzmq's
// zmq_getsockopt). It stays the socket's: do not close it.
func (s *Socket) FD() (int, error) {
	fd := C.zmqpull_fd(s.sock)
	if fd < 0 {
		return -1, fmt.Errorf("get ZMQ_FD: %w", syscall.Errno(-fd))
	}
	return int(fd), nil
}

// Recv receives the next message without waiting: ErrAgain when there is
// none. Its first part is copied into buf's room, grown when it is too
// small, and returned; parts is its number of parts (the others are
// dropped).
func (s *Socket) Recv(buf []byte) (msg []byte, parts int, err error) {
	for more := true; more; {
		var data unsafe.Pointer
		var m C.int
		n := C.zmqpull_recv(s.sock, s.msg, &data, &m)
		if n < 0 {
			if parts > 0 { // libzmq delivers a message's parts together
				return msg, parts, fmt.Errorf("receive part %d: %w", parts+1, syscall.Errno(-n))
			}
			return nil, 0, syscall.Errno(-n)
		}
		if parts == 0 {
			msg = append(buf[:0], unsafe.Slice((*byte)(data), int(n))...)
		}
		parts++
		more = m != 0
		C.zmq_msg_close(s.msg)
	}
	return msg, parts, nil
}

// Close closes the socket and terminates its context.
func (s *Socket) Close() error {
	var errs []error
	if s.sock != nil {
		if rc, errno := C.zmq_close(s.sock); rc != 0 {
			errs = append(errs, fmt.Errorf("zmq_close: %w", errno))
		}
		s.sock = nil
	}
	if s.ctx != nil {
		if rc := C.zmqpull_term(s.ctx); rc < 0 {
			errs = append(errs, fmt.Errorf("zmq_ctx_term: %w", syscall.Errno(-rc)))
		}
		s.ctx = nil
	}
	if s.msg != nil {
		C.free(unsafe.Pointer(s.msg))
		s.msg = nil
	}
	return errors.Join(errs...)
}
