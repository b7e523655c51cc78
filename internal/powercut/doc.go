// Package powercut is a FUSE file system (on go-fuse) for tests that cut
// the power under a program: it passes every operation through to a
// backing directory, remembers what the program has made durable, and on
// a cut puts back into the backing directory exactly that, as a machine
// that lost power and booted again would find its disk.
//
// # What it keeps back until an fsync
//
// The semantics are those of a strict POSIX file system: nothing that
// POSIX does not promise survives a cut, and nothing that it does is
// lost.
//
//   - File data and size. A write, a truncate (ftruncate, O_TRUNC) and a
//     fallocate change the file at once for every reader, and become
//     durable at the file's next fsync or fdatasync (the two are the
//     same here). A cut drops every change since, whole: no torn page
//     survives, which a real disk might also do.
//   - Directory entries. A create, mkdir, mknod, symlink, link, rename,
//     unlink and rmdir change the directory at once, and become durable
//     when the directory itself is fsynced: then every entry the
//     directory holds at that moment is durable, each naming the file
//     (inode) it names then. A file created, written and fsynced, in a
//     directory never fsynced, is gone after a cut; an unlinked file
//     whose directory was not fsynced comes back, with the data it had at
//     its last fsync; a rename whose directory was not fsynced is undone.
//     A new directory's own entries need its own fsync, and the new
//     directory its parent's. This is where the FS is stricter than
//     ext4, XFS or btrfs, whose fsync of a new file in practice also
//     commits its entry: POSIX does not promise that, so a program that
//     counts on it is caught here rather than on the next file system.
//   - A rename across two directories is atomic, as in a journaling file
//     system: when either directory is fsynced, the rename becomes
//     durable in both (and so does every earlier rename across
//     directories not yet durable, as a journal commits in order), so a
//     cut never leaves the file in both directories or in neither.
//   - O_SYNC and O_DSYNC: a write through a descriptor opened with either
//     is durable when it returns, as if fsync followed it (the kernel also
//     sends an fsync after such a write, and after a pwritev2 with
//     RWF_SYNC or RWF_DSYNC).
//   - mmap: a shared writable mapping (SQLite's -shm) reaches the file
//     system when the kernel writes its pages back (msync, fsync, munmap
//     or its own writeback), as ordinary writes, kept back like any
//     other. SQLite never fsyncs -shm and rebuilds it from the WAL, so
//     after a cut it is empty or gone. Pages the kernel writes back after
//     the cut (the frozen program's dirty pages) do not count.
//
// # What it does not keep back
//
// Permissions (chmod) apply at once and survive a cut; ownership and
// times are those the file had when it was last fsynced or, for a
// directory, when it was made again after the cut. Extended attributes
// are not supported (ENOSYS). File locks are the kernel's own (FUSE
// forwards none), as are reads, which see every change at once.
//
// # How it works
//
// The backing directory is the live file system: every operation is done
// there and answered from there. Beside it the FS keeps, for every inode
// it has seen, a record: for a regular file a shadow copy of its durable
// content, plus the byte ranges changed since its last fsync (an fsync
// copies those ranges into the shadow); for a directory its durable
// entries, a name to record map replaced by the directory's listing at
// each fsync. Records carry their own inode numbers, so an inode number
// the backing file system reuses never mixes two files up. A Cut freezes
// that state; the Unmount after it rebuilds the backing directory from
// the durable entries down from the root, each file a hard link to its
// shadow copy. Mounting again adopts the backing directory as durable.
//
// Mounting copies every file under the backing directory into the shadow
// once (the cost of a mount grows with the data), and each fsync copies
// the ranges written since the last. What the FS holds lasts one mount
// (in the tests, one power-cut cycle): a record per inode it saw, a
// shadow file per regular file (those of files unlinked since are kept
// until the unmount, as their directory may not have been fsynced), and
// the renames across directories not yet durable. The FS is for tests: one process
// serves it, and it needs /dev/fuse and fusermount3 (Debian's fuse3) or
// root.
package powercut
