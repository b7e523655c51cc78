package powercut

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// record is what the FS knows of one inode: its identity and, for the
// kinds that have one, its durable state.
type record struct {
	// id is the inode number the FS reports; it is never reused.
	id uint64
	// mode is the file type and permission bits (st_mode).
	mode uint32
	// rdev is a device or special file's device number.
	rdev uint64
	// target is a symbolic link's target.
	target string

	// entries are a directory's durable entries, guarded by FS.mu: what
	// its last fsync listed (what it held at mount for a directory
	// adopted then, nothing for one made since).
	entries map[string]*record

	// mu guards dirty and the shadow copy of a regular file.
	mu sync.Mutex
	// dirty are the byte ranges of a regular file changed since its last
	// fsync; the shadow copy holds everything else.
	dirty ranges
}

func (r *record) isDir() bool     { return r.mode&syscall.S_IFMT == syscall.S_IFDIR }
func (r *record) isRegular() bool { return r.mode&syscall.S_IFMT == syscall.S_IFREG }

// markDirty records that bytes [from, to) of r changed; to may be
// math.MaxInt64 for "to the end, whatever the size".
func (r *record) markDirty(from, to int64) {
	r.mu.Lock()
	r.dirty.add(from, to)
	r.mu.Unlock()
}

// ranges is a sorted list of disjoint, non-adjacent half-open byte
// ranges.
type ranges [][2]int64

// add merges [from, to) into rs.
func (rs *ranges) add(from, to int64) {
	if to <= from {
		return
	}
	all := append(*rs, [2]int64{from, to})
	slices.SortFunc(all, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	out := all[:1]
	for _, r := range all[1:] {
		if last := &out[len(out)-1]; r[0] <= last[1] {
			last[1] = max(last[1], r[1])
		} else {
			out = append(out, r)
		}
	}
	*rs = out
}

// toEnd marks "to the end of the file" in a range.
const toEnd = math.MaxInt64

// shadowPath is where r's durable content is kept.
func (f *FS) shadowPath(r *record) string {
	return filepath.Join(f.shadow, strconv.FormatUint(r.id, 10))
}

// newRecord makes a record for the inode st describes, with no durable
// content (an empty shadow file for a regular file, no entries for a
// directory), and maps the backing inode to it. f.mu must be held.
func (f *FS) newRecord(st *syscall.Stat_t, target string) (*record, error) {
	f.nextID++
	r := &record{id: f.nextID, mode: st.Mode, rdev: st.Rdev, target: target}
	switch {
	case r.isDir():
		r.entries = map[string]*record{}
	case r.isRegular():
		sh, err := os.OpenFile(f.shadowPath(r), os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(st.Mode&0o7777))
		if err != nil {
			return nil, fmt.Errorf("powercut: shadow of a new file: %w", err)
		}
		if err := sh.Close(); err != nil {
			return nil, err
		}
	}
	f.live[st.Ino] = r
	return r, nil
}

// adopt makes records for the inode at path and, for a directory,
// everything below it, taking what is there as durable: the state the FS
// finds at mount, or an inode made behind its back. f.mu must be held.
func (f *FS) adopt(path string, st *syscall.Stat_t) (*record, error) {
	if r := f.live[st.Ino]; r != nil {
		return r, nil // another link of an inode adopted already
	}
	var target string
	if st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
		t, err := os.Readlink(path)
		if err != nil {
			return nil, err
		}
		target = t
	}
	r, err := f.newRecord(st, target)
	if err != nil {
		return nil, err
	}
	switch {
	case r.isRegular():
		return r, copyFile(path, f.shadowPath(r), st)
	case r.isDir():
		names, err := readNames(path)
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			var cst syscall.Stat_t
			p := filepath.Join(path, name)
			if err := syscall.Lstat(p, &cst); err != nil {
				return nil, fmt.Errorf("powercut: adopt %s: %w", p, err)
			}
			c, err := f.adopt(p, &cst)
			if err != nil {
				return nil, err
			}
			r.entries[name] = c
		}
	}
	return r, nil
}

// recordOf returns the record of the live inode at path, which st
// describes, adopting it if the FS has not seen it. f.mu must be held.
func (f *FS) recordOf(path string, st *syscall.Stat_t) (*record, error) {
	if r := f.live[st.Ino]; r != nil {
		return r, nil
	}
	return f.adopt(path, st)
}

// syncFile makes r's content durable: the ranges changed since its last
// sync are copied from the live file, read through fd (or a descriptor
// opened again from it when fd is write-only), into its shadow copy,
// which then takes the live file's size and modification time. After a
// cut it does nothing.
func (f *FS) syncFile(r *record, fd int, writeOnly bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.dirty) == 0 {
		return nil
	}
	src := fd
	if writeOnly {
		// /proc/self/fd opens the same inode again, even an unlinked one.
		again, err := syscall.Open("/proc/self/fd/"+strconv.Itoa(fd), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("powercut: read back a write-only file: %w", err)
		}
		defer func() { _ = syscall.Close(again) }() // read-only: nothing to lose
		src = again
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(src, &st); err != nil {
		return err
	}
	dst, err := syscall.Open(f.shadowPath(r), syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = copyRanges(src, dst, r.dirty, st.Size)
	if err == nil {
		err = syscall.Ftruncate(dst, st.Size)
	}
	if cerr := syscall.Close(dst); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("powercut: sync: %w", err)
	}
	r.dirty = nil
	mtime := time.Unix(st.Mtim.Unix())
	return os.Chtimes(f.shadowPath(r), mtime, mtime)
}

// syncDir makes the entries of the directory r, live at path, durable:
// first every rename across directories up to the last one involving r,
// then r's listing. After a cut it does nothing.
func (f *FS) syncDir(r *record, path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return nil
	}
	last := -1
	for i, mv := range f.renames {
		if mv.from == r || mv.to == r {
			last = i
		}
	}
	for _, mv := range f.renames[:last+1] {
		mv.apply()
	}
	f.renames = f.renames[last+1:]
	names, err := readNames(path)
	if err != nil {
		return err
	}
	entries := make(map[string]*record, len(names))
	for _, name := range names {
		var st syscall.Stat_t
		p := filepath.Join(path, name)
		if err := syscall.Lstat(p, &st); err != nil {
			return fmt.Errorf("powercut: sync dir: %w", err)
		}
		c, err := f.recordOf(p, &st)
		if err != nil {
			return err
		}
		entries[name] = c
	}
	r.entries = entries
	return nil
}

// crossRename is a rename across directories not yet durable in both.
type crossRename struct {
	from, to         *record
	fromName, toName string
	moved            *record
	// exchanged is the record a RENAME_EXCHANGE moved the other way, or
	// nil.
	exchanged *record
}

// apply makes the rename durable in both directories.
func (mv crossRename) apply() {
	mv.to.entries[mv.toName] = mv.moved
	switch {
	case mv.exchanged != nil:
		mv.from.entries[mv.fromName] = mv.exchanged
	case mv.from.entries[mv.fromName] == mv.moved:
		delete(mv.from.entries, mv.fromName)
	}
}

// copyRanges copies the byte ranges rs, cut at size, from the file src
// to the file dst, at the same offsets.
func copyRanges(src, dst int, rs ranges, size int64) error {
	buf := make([]byte, 256<<10)
	for _, rg := range rs {
		for off, end := rg[0], min(rg[1], size); off < end; {
			n, err := syscall.Pread(src, buf[:min(int64(len(buf)), end-off)], off)
			if err != nil {
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
			w, err := syscall.Pwrite(dst, buf[:n], off)
			if err != nil {
				return err
			}
			off += int64(w) // a short write copies the rest on the next turn
		}
	}
	return nil
}

// readNames lists the names in the directory at path.
func readNames(path string) ([]string, error) {
	d, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return names, err
}

// copyFile copies the regular file src into the existing file dst and
// gives it src's modification time.
func copyFile(src, dst string, st *syscall.Stat_t) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }() // read-only: nothing to lose
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		return errors.Join(err, out.Close())
	}
	if err := out.Close(); err != nil {
		return err
	}
	mtime := time.Unix(st.Mtim.Unix())
	return os.Chtimes(dst, mtime, mtime)
}
