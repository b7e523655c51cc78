// Package durable writes files that survive a crash whole or not at all.
//
// WriteFile writes to a temporary file in the destination's directory,
// fsyncs it, renames it over the destination and fsyncs the directory, so
// after it returns the file is complete, and after a crash at any moment
// the destination is either absent (or its old content) or complete. The
// raw store's file backend and the daemon's spill dir both write this way.
package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// WriteFile writes data to path atomically and durably, creating missing
// directories (durably too). A temporary file a crash leaves behind is
// named as IsTemp recognises.
func WriteFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*"+tempSuffix)
	if err != nil {
		return err
	}
	tmp := f.Name()
	if err := writeSync(f, data); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return syncDir(dir)
}

// tempSuffix ends the name of a temporary file of WriteFile.
const tempSuffix = ".tmp"

// IsTemp reports whether name (a base name) is a temporary file of
// WriteFile: "." + the destination's name + "." + random + ".tmp". Such a
// file is incomplete; listings skip it and cleanups may remove it.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.HasSuffix(name, tempSuffix)
}

// writeSync writes data to f, fsyncs and closes it.
func writeSync(f *os.File, data []byte) error {
	if _, err := f.Write(data); err != nil {
		return errors.Join(err, f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(err, f.Close())
	}
	return f.Close()
}

// MkdirAll creates dir and any missing parents with perm (before the
// umask), fsyncing the parent of every directory it creates so that the
// new entries survive a power cut: os.MkdirAll makes them only in the
// page cache, and a cut can take a new directory with everything
// fsynced inside it.
func MkdirAll(dir string, perm fs.FileMode) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: not a directory", dir)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := MkdirAll(parent, perm); err != nil {
			return err
		}
	}
	// A concurrent writer may create dir first; syncing the parent anyway
	// keeps this call from returning before the entry is durable.
	if err := os.Mkdir(dir, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(parent)
}

// syncDir fsyncs a directory, making renames and creations in it durable.
// SyncDir fsyncs the directory dir, making the entries created, renamed or
// removed in it durable.
func SyncDir(dir string) error { return syncDir(dir) }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		return errors.Join(fmt.Errorf("sync %s: %w", dir, err), d.Close())
	}
	return d.Close()
}
