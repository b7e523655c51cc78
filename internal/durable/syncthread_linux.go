package durable

/*
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

// A sync thread reads a descriptor from req, fdatasyncs it and writes the
// errno (0 for success) to resp, until req reaches its end.
struct ingestor_syncer { int req, resp; };

static void *ingestor_sync_loop(void *arg) {
	struct ingestor_syncer *s = arg;
	for (;;) {
		int32_t fd;
		ssize_t n = read(s->req, &fd, sizeof fd);
		if (n < 0 && errno == EINTR)
			continue;
		if (n != sizeof fd)
			break;
		int32_t rc = 0;
		while (fdatasync(fd) != 0) {
			if (errno != EINTR) {
				rc = errno;
				break;
			}
		}
		while (write(s->resp, &rc, sizeof rc) < 0 && errno == EINTR)
			;
	}
	close(s->req);
	close(s->resp);
	free(s);
	return NULL;
}

static int ingestor_start_syncer(int req, int resp) {
	struct ingestor_syncer *s = malloc(sizeof *s);
	if (s == NULL)
		return ENOMEM;
	s->req = req;
	s->resp = resp;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_t t;
	int rc = pthread_create(&t, &a, ingestor_sync_loop, s);
	pthread_attr_destroy(&a);
	if (rc != 0)
		free(s);
	return rc;
}
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// syncer is a sync thread: a thread of its own, outside Go's scheduler,
// that runs fdatasync(2) for the goroutine waiting on it. A goroutine in a
// system call keeps its P (its right to run Go code) until the runtime's
// monitor takes it back, 20 us to 10 ms later; on a machine with few cores
// the goroutines readied meanwhile (the queue writer that applies a push
// group's statements while the group's raw page syncs) wait that long
// while a core sits idle. A goroutine waiting for a sync thread's answer
// in Go's network poller gives its P up at once: on the webhook path that
// was +6-15% requests/s on two cores (docs/performance.md).
type syncer struct {
	req  int      // the write end of the thread's request pipe
	resp *os.File // the read end of its answer pipe, in the poller
}

// maxSyncers bounds the sync threads (and their four descriptors each),
// started as needed and kept for the process's life; a sync that finds
// none idle and none left to start runs in its goroutine, as Datasync.
const maxSyncers = 4

var (
	// idleSyncers holds the sync threads not in use.
	idleSyncers = make(chan *syncer, maxSyncers)
	// syncerSlots holds a token for each sync thread started.
	syncerSlots = make(chan struct{}, maxSyncers)
)

// getSyncer returns an idle sync thread, or starts one, or returns nil.
func getSyncer() *syncer {
	select {
	case s := <-idleSyncers:
		return s
	default:
	}
	select {
	case syncerSlots <- struct{}{}:
	default:
		return nil
	}
	s, err := startSyncer()
	if err != nil {
		<-syncerSlots
		return nil
	}
	return s
}

// closeFDs closes descriptors of a sync thread that did not start.
func closeFDs(fds ...int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// startSyncer starts a sync thread and its two pipes: the thread reads
// requests and writes answers blocking, and Go reads the answers through
// its poller.
func startSyncer() (*syncer, error) {
	var req, resp [2]int
	if err := unix.Pipe2(req[:], unix.O_CLOEXEC); err != nil {
		return nil, err
	}
	if err := unix.Pipe2(resp[:], unix.O_CLOEXEC); err != nil {
		closeFDs(req[:]...)
		return nil, err
	}
	if err := unix.SetNonblock(resp[0], true); err != nil {
		closeFDs(req[0], req[1], resp[0], resp[1])
		return nil, err
	}
	if rc := C.ingestor_start_syncer(C.int(req[0]), C.int(resp[1])); rc != 0 {
		closeFDs(req[0], req[1], resp[0], resp[1])
		return nil, fmt.Errorf("start a sync thread: %w", syscall.Errno(rc))
	}
	return &syncer{req: req[1], resp: os.NewFile(uintptr(resp[0]), "sync-thread-answers")}, nil
}

// datasyncParked runs fdatasync(2) of fd on a sync thread while the
// calling goroutine waits in the poller, or in the goroutine when no sync
// thread is to be had. The caller keeps fd open until it returns.
func datasyncParked(fd int) error {
	s := getSyncer()
	if s == nil {
		return syscall.Fdatasync(fd)
	}
	var buf [4]byte
	binary.NativeEndian.PutUint32(buf[:], uint32(int32(fd)))
	if _, err := unix.Write(s.req, buf[:]); err != nil {
		// Four bytes into an empty pipe: only a thread that is gone
		// fails them. The slot stays taken; the sync runs here.
		return syscall.Fdatasync(fd)
	}
	if _, err := io.ReadFull(s.resp, buf[:]); err != nil {
		return fmt.Errorf("read a sync thread's answer: %w", err)
	}
	idleSyncers <- s
	if rc := syscall.Errno(binary.NativeEndian.Uint32(buf[:])); rc != 0 {
		return rc
	}
	return nil
}
