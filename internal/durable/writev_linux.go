package durable

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// WriteAt writes parts one after the other to f from offset off, in one
// pwritev(2) when the kernel takes them whole (a page record's header,
// body and newline: one system call instead of three). A short write is
// finished part by part.
func WriteAt(f *os.File, parts [][]byte, off int64) error {
	if len(parts) == 1 {
		_, err := f.WriteAt(parts[0], off)
		return err
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var n int
	var werr error
	err = sc.Control(func(fd uintptr) {
		for {
			n, werr = unix.Pwritev(int(fd), parts, off)
			if !errors.Is(werr, syscall.EINTR) {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	if werr != nil {
		return &os.PathError{Op: "pwritev", Path: f.Name(), Err: werr}
	}
	for _, p := range parts {
		if n >= len(p) {
			n -= len(p)
			off += int64(len(p))
			continue
		}
		if _, err := f.WriteAt(p[n:], off+int64(n)); err != nil {
			return err
		}
		off += int64(len(p))
		n = 0
	}
	return nil
}
