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

// DatasyncParked is Datasync run by a thread outside Go's scheduler while
// the calling goroutine waits in Go's poller, its P free for other
// goroutines (see syncer): for a sync on the path other goroutines wait
// on, such as a push group's raw page. It runs in the calling goroutine
// when the sync threads are all busy.
func DatasyncParked(f *os.File) error {
	return onFD(f, "fdatasync", datasyncParked)
}
