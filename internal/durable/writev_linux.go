package durable

import (
	"os"

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
	var n int
	err := onFD(f, "pwritev", func(fd int) (err error) {
		n, err = unix.Pwritev(fd, parts, off)
		return err
	})
	if err != nil {
		return err
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
