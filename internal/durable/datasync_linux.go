package durable

import (
	"errors"
	"os"
	"syscall"
)

// Datasync makes f's data durable, with what of its metadata reading the
// data needs (its size, its blocks), but not its times: fdatasync(2).
// Writing over bytes a file already holds and then calling Datasync
// commits no file system journal, where fsync would for the new
// modification time.
func Datasync(f *os.File) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = sc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if !errors.Is(serr, syscall.EINTR) {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}
