package durable

import (
	"os"
	"syscall"
)

// Datasync makes f's data durable, with what of its metadata reading the
// data needs (its size, its blocks), but not its times: fdatasync(2).
// Writing over bytes a file already holds and then calling Datasync
// commits no file system journal, where fsync would for the new
// modification time.
func Datasync(f *os.File) error {
	return onFD(f, "fdatasync", syscall.Fdatasync)
}
