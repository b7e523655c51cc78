package powercut

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// handle is an open regular file: a descriptor of the backing file, whose
// writes are marked changed in the record until an fsync. It offers no
// passthrough descriptor, so every write comes through the FS (with FUSE
// passthrough the kernel would write the backing file directly).
type handle struct {
	fsys  *FS
	rec   *record
	fd    int
	flags uint32
}

var (
	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileLseeker   = (*handle)(nil)
	_ fs.FileAllocater = (*handle)(nil)
)

func newHandle(fsys *FS, rec *record, fd int, flags uint32) *handle {
	return &handle{fsys: fsys, rec: rec, fd: fd, flags: flags}
}

// Read reads from the backing file.
func (h *handle) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := syscall.Pread(h.fd, buf, off)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return fuse.ReadResultData(buf[:n]), 0
}

// Write writes to the backing file and marks the bytes changed; through
// a descriptor opened O_SYNC or O_DSYNC it makes them durable too.
func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.rec.mu.Lock()
	n, err := syscall.Pwrite(h.fd, data, off)
	if n > 0 {
		h.rec.dirty.add(off, off+int64(n))
	}
	h.rec.mu.Unlock()
	if err != nil {
		return uint32(max(n, 0)), fs.ToErrno(err)
	}
	if h.flags&syscall.O_DSYNC != 0 { // O_SYNC includes the O_DSYNC bit
		if errno := h.sync(); errno != 0 {
			return 0, errno
		}
	}
	return uint32(n), 0
}

// sync makes the file's content durable.
func (h *handle) sync() syscall.Errno {
	writeOnly := h.flags&syscall.O_ACCMODE == syscall.O_WRONLY
	return fs.ToErrno(h.fsys.syncFile(h.rec, h.fd, writeOnly))
}

// Allocate runs fallocate on the backing file and marks what it changed:
// the range, or everything from its start when it moves data.
func (h *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	h.rec.mu.Lock()
	defer h.rec.mu.Unlock()
	if err := syscall.Fallocate(h.fd, mode, int64(off), int64(size)); err != nil {
		return fs.ToErrno(err)
	}
	end := int64(off + size)
	if mode&(unix.FALLOC_FL_COLLAPSE_RANGE|unix.FALLOC_FL_INSERT_RANGE) != 0 {
		end = toEnd
	}
	h.rec.dirty.add(int64(off), end)
	return 0
}

// Lseek finds data or holes in the backing file.
func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	n, err := unix.Seek(h.fd, int64(off), int(whence))
	return uint64(n), fs.ToErrno(err)
}

// Flush is a close of one of the descriptors the caller holds: closing a
// duplicate of the backing descriptor reports the errors a close would.
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	dup, err := syscall.Dup(h.fd)
	if err != nil {
		return fs.ToErrno(err)
	}
	return fs.ToErrno(syscall.Close(dup))
}

// Release closes the backing descriptor.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	return fs.ToErrno(syscall.Close(h.fd))
}
