//go:build !linux

package durable

import "os"

// Datasync makes f's data durable: fsync(2) where fdatasync(2) is not
// known to exist.
func Datasync(f *os.File) error { return f.Sync() }

// DatasyncParked is Datasync.
func DatasyncParked(f *os.File) error { return f.Sync() }
