package durable

import (
	"errors"
	"os"
	"syscall"
)

// onFD runs call with f's descriptor, again while it fails with EINTR, and
// returns its error as a *os.PathError of op.
func onFD(f *os.File, op string, call func(fd int) error) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	err = sc.Control(func(fd uintptr) {
		for {
			cerr = call(int(fd))
			if !errors.Is(cerr, syscall.EINTR) {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	if cerr != nil {
		return &os.PathError{Op: op, Path: f.Name(), Err: cerr}
	}
	return nil
}
