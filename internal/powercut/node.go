package powercut

import (
	"context"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is an inode of the mounted FS: every operation is done on the
// backing path go-fuse's tree gives it, and reported under rec's inode
// number.
type node struct {
	fs.Inode
	fsys *FS
	rec  *record
}

var (
	_ fs.NodeLookuper   = (*node)(nil)
	_ fs.NodeGetattrer  = (*node)(nil)
	_ fs.NodeSetattrer  = (*node)(nil)
	_ fs.NodeOpener     = (*node)(nil)
	_ fs.NodeCreater    = (*node)(nil)
	_ fs.NodeMkdirer    = (*node)(nil)
	_ fs.NodeMknoder    = (*node)(nil)
	_ fs.NodeSymlinker  = (*node)(nil)
	_ fs.NodeLinker     = (*node)(nil)
	_ fs.NodeReadlinker = (*node)(nil)
	_ fs.NodeRenamer    = (*node)(nil)
	_ fs.NodeUnlinker   = (*node)(nil)
	_ fs.NodeRmdirer    = (*node)(nil)
	_ fs.NodeReaddirer  = (*node)(nil)
	_ fs.NodeFsyncer    = (*node)(nil)
	_ fs.NodeStatfser   = (*node)(nil)
)

// path is the node's path in the backing directory.
func (n *node) path() string { return filepath.Join(n.fsys.backing, n.Path(nil)) }

// child is the backing path of the entry name in this directory.
func (n *node) child(name string) string { return filepath.Join(n.path(), name) }

// newChild returns the inode for rec, whose live state st describes, and
// fills out.
func (n *node) newChild(ctx context.Context, rec *record, st *syscall.Stat_t, out *fuse.EntryOut) *fs.Inode {
	out.Attr.FromStat(st)
	out.Attr.Ino = rec.id
	return n.NewInode(ctx, &node{fsys: n.fsys, rec: rec}, fs.StableAttr{Mode: st.Mode & syscall.S_IFMT, Ino: rec.id})
}

// Lookup finds name in the backing directory.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p := n.child(name)
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return nil, fs.ToErrno(err)
	}
	n.fsys.mu.Lock()
	rec, err := n.fsys.recordOf(p, &st)
	n.fsys.mu.Unlock()
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.newChild(ctx, rec, &st, out), 0
}

// Getattr stats the open file, or the backing path.
func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var st syscall.Stat_t
	var err error
	if h, ok := f.(*handle); ok {
		err = syscall.Fstat(h.fd, &st)
	} else {
		err = syscall.Lstat(n.path(), &st)
	}
	if err != nil {
		return fs.ToErrno(err)
	}
	out.FromStat(&st)
	out.Ino = n.rec.id
	return 0
}

// Setattr changes mode, owner, size and times. A size change is a change
// of content (kept back until an fsync); a mode change applies to the
// durable copy too.
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	p := n.path()
	h, _ := f.(*handle)
	if mode, ok := in.GetMode(); ok {
		if err := syscall.Chmod(p, mode); err != nil {
			return fs.ToErrno(err)
		}
		n.fsys.mu.Lock()
		n.rec.mode = n.rec.mode&syscall.S_IFMT | mode&0o7777
		n.fsys.mu.Unlock()
		if n.rec.isRegular() {
			if err := syscall.Chmod(n.fsys.shadowPath(n.rec), mode); err != nil {
				return fs.ToErrno(err)
			}
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		suid, sgid := -1, -1
		if uok {
			suid = int(uid)
		}
		if gok {
			sgid = int(gid)
		}
		if err := unix.Fchownat(unix.AT_FDCWD, p, suid, sgid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fs.ToErrno(err)
		}
	}
	if size, ok := in.GetSize(); ok {
		if errno := n.truncate(p, h, int64(size)); errno != 0 {
			return errno
		}
	}
	mtime, mok := in.GetMTime()
	atime, aok := in.GetATime()
	if mok || aok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if aok {
			ts[0] = unix.NsecToTimespec(atime.UnixNano())
		}
		if mok {
			ts[1] = unix.NsecToTimespec(mtime.UnixNano())
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fs.ToErrno(err)
		}
	}
	return n.Getattr(ctx, f, out)
}

// truncate sets the size of the file at p (through h when open) and
// marks the bytes from the smaller of the old and new sizes changed.
func (n *node) truncate(p string, h *handle, size int64) syscall.Errno {
	n.rec.mu.Lock()
	defer n.rec.mu.Unlock()
	var st syscall.Stat_t
	var err error
	if h != nil {
		err = syscall.Fstat(h.fd, &st)
	} else {
		err = syscall.Stat(p, &st)
	}
	if err != nil {
		return fs.ToErrno(err)
	}
	if h != nil {
		err = syscall.Ftruncate(h.fd, size)
	} else {
		err = syscall.Truncate(p, size)
	}
	if err != nil {
		return fs.ToErrno(err)
	}
	n.rec.dirty.add(min(st.Size, size), toEnd)
	return 0
}

// Open opens the backing file. O_TRUNC changes the content.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	flags &^= syscall.O_APPEND | fuse.FMODE_EXEC // the kernel gives every write its offset
	fd, err := syscall.Open(n.path(), int(flags)|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fs.ToErrno(err)
	}
	if flags&syscall.O_TRUNC != 0 {
		n.rec.markDirty(0, toEnd)
	}
	return newHandle(n.fsys, n.rec, fd, flags), 0, 0
}

// Create creates (or opens, when it exists) the file name.
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	p := n.child(name)
	flags &^= syscall.O_APPEND
	n.fsys.mu.Lock()
	defer n.fsys.mu.Unlock()
	var before syscall.Stat_t
	existed := syscall.Lstat(p, &before) == nil
	fd, err := syscall.Open(p, int(flags)|syscall.O_CREAT|syscall.O_CLOEXEC, mode)
	if err != nil {
		return nil, nil, 0, fs.ToErrno(err)
	}
	preserveOwner(ctx, p)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, nil, 0, fs.ToErrno(closeAfter(err, fd))
	}
	var rec *record
	if existed {
		rec, err = n.fsys.recordOf(p, &st)
	} else {
		rec, err = n.fsys.newRecord(&st, "")
	}
	if err != nil {
		return nil, nil, 0, fs.ToErrno(closeAfter(err, fd))
	}
	if existed && flags&syscall.O_TRUNC != 0 {
		rec.markDirty(0, toEnd)
	}
	return n.newChild(ctx, rec, &st, out), newHandle(n.fsys, rec, fd, flags), 0, 0
}

// made finishes an operation that made the new inode p: it gives it the
// caller's ownership and a record with nothing durable.
func (n *node) made(ctx context.Context, p, target string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	preserveOwner(ctx, p)
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return nil, fs.ToErrno(err)
	}
	rec, err := n.fsys.newRecord(&st, target)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.newChild(ctx, rec, &st, out), 0
}

// Mkdir makes the directory name.
func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p := n.child(name)
	n.fsys.mu.Lock()
	defer n.fsys.mu.Unlock()
	if err := syscall.Mkdir(p, mode); err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.made(ctx, p, "", out)
}

// Mknod makes the special file (a fifo, a socket, a device) name.
func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p := n.child(name)
	n.fsys.mu.Lock()
	defer n.fsys.mu.Unlock()
	if err := syscall.Mknod(p, mode, int(rdev)); err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.made(ctx, p, "", out)
}

// Symlink makes the symbolic link name to target.
func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p := n.child(name)
	n.fsys.mu.Lock()
	defer n.fsys.mu.Unlock()
	if err := syscall.Symlink(target, p); err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.made(ctx, p, target, out)
}

// Link makes name another link to target's inode.
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, ok := target.(*node)
	if !ok || t.fsys != n.fsys {
		return nil, syscall.EXDEV
	}
	p := n.child(name)
	n.fsys.mu.Lock()
	defer n.fsys.mu.Unlock()
	if err := syscall.Link(t.path(), p); err != nil {
		return nil, fs.ToErrno(err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.newChild(ctx, t.rec, &st, out), 0
}

// Readlink reads a symbolic link.
func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	t, err := os.Readlink(n.path())
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return []byte(t), 0
}

// Unlink removes the entry name.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.remove(name, syscall.Unlink)
}

// Rmdir removes the empty directory name.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.remove(name, syscall.Rmdir)
}

// remove removes the entry name with rm; when that was the inode's last
// link, its backing inode number may come back for another file, so it
// no longer maps to the record (which the durable entries may still
// hold).
func (n *node) remove(name string, rm func(string) error) syscall.Errno {
	p := n.child(name)
	n.fsys.mu.Lock()
	defer n.fsys.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return fs.ToErrno(err)
	}
	if err := rm(p); err != nil {
		return fs.ToErrno(err)
	}
	n.fsys.unlinked(&st)
	return 0
}

// Rename renames name to newName in newParent, with renameat2's flags.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok || np.fsys != n.fsys {
		return syscall.EXDEV
	}
	p1, p2 := n.child(name), np.child(newName)
	n.fsys.mu.Lock()
	defer n.fsys.mu.Unlock()
	var src, dst syscall.Stat_t
	if err := syscall.Lstat(p1, &src); err != nil {
		return fs.ToErrno(err)
	}
	replaced := syscall.Lstat(p2, &dst) == nil
	if err := unix.Renameat2(unix.AT_FDCWD, p1, unix.AT_FDCWD, p2, uint(flags)); err != nil {
		return fs.ToErrno(err)
	}
	exchange := flags&unix.RENAME_EXCHANGE != 0
	if replaced && !exchange && dst.Ino != src.Ino {
		n.fsys.unlinked(&dst)
	}
	if np.rec != n.rec {
		mv := crossRename{from: n.rec, to: np.rec, fromName: name, toName: newName, moved: n.fsys.live[src.Ino]}
		if exchange {
			mv.exchanged = n.fsys.live[dst.Ino]
		}
		if mv.moved != nil && (!exchange || mv.exchanged != nil) {
			n.fsys.renames = append(n.fsys.renames, mv)
		}
	}
	return 0
}

// Readdir lists the backing directory.
func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	ds, errno := fs.NewLoopbackDirStream(n.path())
	if errno != 0 {
		return nil, errno
	}
	return &dirStream{DirStream: ds, fsys: n.fsys}, 0
}

// Fsync makes the file's content, or the directory's entries, durable.
// A directory's handle (go-fuse's own) has no Fsyncdir, so FSYNCDIR comes
// here too.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if n.rec.isDir() {
		return fs.ToErrno(n.fsys.syncDir(n.rec, n.path()))
	}
	h, ok := f.(*handle)
	if !ok {
		return syscall.EBADF
	}
	return h.sync()
}

// Statfs reports the backing file system's sizes.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var s syscall.Statfs_t
	if err := syscall.Statfs(n.fsys.backing, &s); err != nil {
		return fs.ToErrno(err)
	}
	out.FromStatfsT(&s)
	return 0
}

// dirStream reports each entry under its record's inode number.
type dirStream struct {
	fs.DirStream
	fsys *FS
}

func (d *dirStream) Next() (fuse.DirEntry, syscall.Errno) {
	e, errno := d.DirStream.Next()
	if errno == 0 {
		d.fsys.mu.Lock()
		if r := d.fsys.live[e.Ino]; r != nil {
			e.Ino = r.id
		}
		d.fsys.mu.Unlock()
	}
	return e, errno
}

// unlinked notes that a link to the backing inode st describes is gone:
// when it was the last, the inode number no longer names the record.
// f.mu must be held.
func (f *FS) unlinked(st *syscall.Stat_t) {
	if st.Nlink <= 1 || st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		delete(f.live, st.Ino)
	}
}

// preserveOwner gives the file at p the caller's uid and gid when the FS
// runs as root, as the caller would have made it on a disk of its own.
func preserveOwner(ctx context.Context, p string) {
	if os.Getuid() != 0 {
		return
	}
	if caller, ok := fuse.FromContext(ctx); ok {
		_ = syscall.Lchown(p, int(caller.Uid), int(caller.Gid)) // best effort, as go-fuse's loopback
	}
}

// closeAfter closes fd after err and returns err.
func closeAfter(err error, fd int) error {
	_ = syscall.Close(fd) // err says what went wrong
	return err
}
