package powercut

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FS is a mounted power-cut file system.
type FS struct {
	// backing is the live tree; shadow holds durable file contents.
	backing, shadow string
	server          *fuse.Server

	mu     sync.Mutex
	nextID uint64
	root   *record
	// live maps the backing file system's inode numbers of the inodes
	// linked in the live tree to their records.
	live map[uint64]*record
	// renames are the renames across directories not yet durable in both.
	renames []crossRename
	cut     bool
}

// cacheTimeout is how long the kernel may cache entries and attributes:
// every change comes through the FS, so the kernel's caches stay true.
const cacheTimeout = time.Second

// Mount serves the directory backing at mountpoint, taking what backing
// holds as durable. state is a directory the FS owns, on the same file
// system as backing (a cut hard-links its shadow copies into backing);
// what it held before is removed.
func Mount(mountpoint, backing, state string) (*FS, error) {
	f := &FS{backing: backing, shadow: filepath.Join(state, "shadow"), live: map[uint64]*record{}}
	if err := os.RemoveAll(state); err != nil {
		return nil, fmt.Errorf("powercut: %w", err)
	}
	if err := os.MkdirAll(f.shadow, 0o700); err != nil {
		return nil, fmt.Errorf("powercut: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		return nil, fmt.Errorf("powercut: backing directory: %w", err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, fmt.Errorf("powercut: backing %s is not a directory", backing)
	}
	f.mu.Lock()
	root, err := f.adopt(backing, &st)
	f.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("powercut: adopt %s: %w", backing, err)
	}
	f.root = root
	timeout := cacheTimeout
	f.server, err = fs.Mount(mountpoint, &node{fsys: f, rec: root}, &fs.Options{
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
		MountOptions: fuse.MountOptions{
			FsName:        "powercut:" + backing,
			Name:          "powercut",
			DisableXAttrs: true,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("powercut: mount %s: %w", mountpoint, err)
	}
	return f, nil
}

// Cut cuts the power: what is durable now is all that the next Unmount
// leaves in the backing directory. The FS goes on answering (the programs
// using it should be frozen first, and killed before Unmount), but
// nothing it is asked from now on becomes durable.
func (f *FS) Cut() {
	f.mu.Lock()
	f.cut = true
	f.mu.Unlock()
}

// Unmount unmounts the FS. After a Cut it then rebuilds the backing
// directory from what was durable at the cut; without one the backing
// directory keeps the live state, as a clean shutdown writes everything
// out. It fails while a process has a file open under the mount point.
func (f *FS) Unmount() error {
	if err := f.server.Unmount(); err != nil {
		return fmt.Errorf("powercut: unmount (does a process still have files open under it?): %w", err)
	}
	f.mu.Lock()
	cut := f.cut
	f.mu.Unlock()
	if cut {
		if err := f.restore(); err != nil {
			return err
		}
	}
	return os.RemoveAll(f.shadow)
}

// restore replaces the backing directory's contents with the durable
// tree: built beside the shadow copies, then moved in.
func (f *FS) restore() error {
	built := filepath.Join(filepath.Dir(f.shadow), "durable")
	if err := os.RemoveAll(built); err != nil {
		return err
	}
	if err := os.Mkdir(built, 0o700); err != nil {
		return err
	}
	placed := map[*record]string{f.root: built}
	if err := f.build(built, f.root, placed); err != nil {
		return fmt.Errorf("powercut: rebuild the durable tree: %w", err)
	}
	old, err := readNames(f.backing)
	if err != nil {
		return err
	}
	for _, name := range old {
		if err := os.RemoveAll(filepath.Join(f.backing, name)); err != nil {
			return err
		}
	}
	names, err := readNames(built)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := os.Rename(filepath.Join(built, name), filepath.Join(f.backing, name)); err != nil {
			return err
		}
	}
	return os.Remove(built)
}

// build makes the durable entries of the directory r under dir. A file
// with several durable names gets them as hard links; a directory durable
// under two names (possible only through renames across directories of
// which a cut kept a part) keeps the first, as fsck would.
func (f *FS) build(dir string, r *record, placed map[*record]string) error {
	names := make([]string, 0, len(r.entries))
	for name := range r.entries {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		c, p := r.entries[name], filepath.Join(dir, name)
		first, seen := placed[c]
		switch {
		case c.isDir():
			if seen {
				continue
			}
			placed[c] = p
			if err := os.Mkdir(p, 0o700); err != nil { // its own mode once it is filled
				return err
			}
			if err := f.build(p, c, placed); err != nil {
				return err
			}
			if err := os.Chmod(p, fileMode(c.mode)); err != nil {
				return err
			}
		case c.isRegular():
			if !seen {
				first = f.shadowPath(c)
				placed[c] = p
			}
			if err := os.Link(first, p); err != nil {
				return err
			}
		case c.mode&syscall.S_IFMT == syscall.S_IFLNK:
			if err := os.Symlink(c.target, p); err != nil {
				return err
			}
		default:
			if seen {
				if err := os.Link(first, p); err != nil {
					return err
				}
				continue
			}
			placed[c] = p
			if err := syscall.Mknod(p, c.mode, int(c.rdev)); err != nil {
				return fmt.Errorf("mknod %s: %w", p, err)
			}
		}
	}
	return nil
}

// fileMode converts st_mode permission bits, setuid, setgid and sticky
// included, to an os.FileMode.
func fileMode(mode uint32) os.FileMode {
	m := os.FileMode(mode & 0o777)
	if mode&syscall.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if mode&syscall.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if mode&syscall.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}
