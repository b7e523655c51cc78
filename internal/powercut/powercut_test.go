package powercut

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// scenario is a program's steps on the FS and what must hold after a
// power cut.
type scenario struct {
	name string
	// run does the steps in dir (the mount point).
	run func(t *testing.T, dir string)
	// check returns what is wrong with dir after the cut.
	check func(dir string) error
	// keptBack is set where the check holds only if the FS kept
	// something back: on a file system that writes everything through
	// (a clean unmount instead of a cut) it must fail.
	keptBack bool
}

// scenarios are the file system's promises, one a case.
var scenarios = []scenario{{
	name: "data written and not fsynced is gone",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "f", "durable", true)
		syncDir(t, dir)
		appendFile(t, filepath.Join(dir, "f"), " and lost", false)
	},
	check:    wantFile("f", "durable"),
	keptBack: true,
}, {
	name: "fsynced data survives",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "f", "one", true)
		syncDir(t, dir)
		appendFile(t, filepath.Join(dir, "f"), " two", true)
	},
	check: wantFile("f", "one two"),
}, {
	name: "a truncate not fsynced is undone",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "f", "0123456789", true)
		syncDir(t, dir)
		if err := os.Truncate(filepath.Join(dir, "f"), 3); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(filepath.Join(dir, "f"), 5); err != nil {
			t.Fatal(err)
		}
	},
	check:    wantFile("f", "0123456789"),
	keptBack: true,
}, {
	name: "a truncate and a rewrite fsynced survive",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "f", "0123456789", true)
		syncDir(t, dir)
		f := openFile(t, filepath.Join(dir, "f"), os.O_RDWR)
		must(t, f.Truncate(2))
		_, err := f.WriteAt([]byte("ab"), 4)
		must(t, err)
		must(t, f.Sync())
		must(t, f.Close())
	},
	check: wantFile("f", "01\x00\x00ab"),
}, {
	name: "a file fsynced in a directory not fsynced is gone",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "new", "synced data", true)
	},
	check:    wantAbsent("new"),
	keptBack: true,
}, {
	name: "fsyncing the directory makes a created file durable, with what was fsynced",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "synced", "data", true)
		writeFile(t, dir, "unsynced", "data", false)
		syncDir(t, dir)
	},
	check: all(wantFile("synced", "data"), wantFile("unsynced", "")),
}, {
	name: "a rename whose directory was not fsynced is undone",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "a", "A", true)
		writeFile(t, dir, "b", "B", true)
		syncDir(t, dir)
		must(t, os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")))
	},
	check:    all(wantFile("a", "A"), wantFile("b", "B")),
	keptBack: true,
}, {
	name: "fsyncing the directory makes a rename durable",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "a", "A", true)
		writeFile(t, dir, "b", "B", true)
		syncDir(t, dir)
		must(t, os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")))
		syncDir(t, dir)
	},
	check: all(wantAbsent("a"), wantFile("b", "A")),
}, {
	name: "a rename across directories not fsynced is undone",
	run: func(t *testing.T, dir string) {
		mkdirs(t, dir, "x", "y")
		writeFile(t, filepath.Join(dir, "x"), "f", "F", true)
		syncDir(t, filepath.Join(dir, "x"))
		must(t, os.Rename(filepath.Join(dir, "x", "f"), filepath.Join(dir, "y", "g")))
	},
	check:    all(wantFile("x/f", "F"), wantAbsent("y/g")),
	keptBack: true,
}, {
	name: "a rename across directories is durable in both when either is fsynced",
	run: func(t *testing.T, dir string) {
		mkdirs(t, dir, "x", "y", "z")
		writeFile(t, filepath.Join(dir, "x"), "f", "F", true)
		writeFile(t, filepath.Join(dir, "z"), "h", "H", true)
		syncDir(t, filepath.Join(dir, "x"))
		syncDir(t, filepath.Join(dir, "z"))
		must(t, os.Rename(filepath.Join(dir, "x", "f"), filepath.Join(dir, "y", "g")))
		must(t, os.Rename(filepath.Join(dir, "z", "h"), filepath.Join(dir, "x", "h")))
		syncDir(t, filepath.Join(dir, "y")) // the destination of the first only
	},
	check: all(wantAbsent("x/f"), wantFile("y/g", "F"), wantFile("z/h", "H"), wantAbsent("x/h")),
}, {
	name: "an unlink not made durable comes back",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "f", "back", true)
		syncDir(t, dir)
		appendFile(t, filepath.Join(dir, "f"), " again", false)
		must(t, os.Remove(filepath.Join(dir, "f")))
	},
	check:    wantFile("f", "back"),
	keptBack: true,
}, {
	name: "fsyncing the directory makes an unlink durable",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "f", "gone", true)
		syncDir(t, dir)
		must(t, os.Remove(filepath.Join(dir, "f")))
		syncDir(t, dir)
	},
	check: wantAbsent("f"),
}, {
	name: "a directory and its entries need their own fsyncs",
	run: func(t *testing.T, dir string) {
		mkdirs(t, dir, "kept", "lost", "empty")
		writeFile(t, filepath.Join(dir, "kept"), "f", "K", true)
		syncDir(t, filepath.Join(dir, "kept"))
		writeFile(t, filepath.Join(dir, "lost"), "f", "L", true)
		syncDir(t, dir)
		must(t, os.Mkdir(filepath.Join(dir, "late"), 0o755)) // its parent never fsynced since
		writeFile(t, filepath.Join(dir, "late"), "f", "late", true)
		syncDir(t, filepath.Join(dir, "late"))
		must(t, os.Remove(filepath.Join(dir, "empty")))
	},
	check:    all(wantFile("kept/f", "K"), wantAbsent("lost/f"), wantDir("lost"), wantDir("empty"), wantAbsent("late")),
	keptBack: true,
}, {
	name: "hard links and symbolic links follow their directories",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "f", "shared", true)
		must(t, os.Link(filepath.Join(dir, "f"), filepath.Join(dir, "g")))
		must(t, os.Symlink("f", filepath.Join(dir, "s")))
		syncDir(t, dir)
		must(t, os.Link(filepath.Join(dir, "f"), filepath.Join(dir, "h")))
		must(t, os.Symlink("g", filepath.Join(dir, "t")))
	},
	check: all(wantFile("f", "shared"), wantFile("g", "shared"), wantLink("s", "f"), wantAbsent("h"), wantAbsent("t"),
		func(dir string) error { // f and g are still one inode
			var a, b syscall.Stat_t
			if err := errors.Join(syscall.Stat(filepath.Join(dir, "f"), &a), syscall.Stat(filepath.Join(dir, "g"), &b)); err != nil {
				return err
			}
			if a.Ino != b.Ino || a.Nlink != 2 {
				return fmt.Errorf("f and g: inodes %d and %d, %d links, want one inode with 2", a.Ino, b.Ino, a.Nlink)
			}
			return nil
		}),
	keptBack: true,
}, {
	name: "a write through O_SYNC is durable when it returns",
	run: func(t *testing.T, dir string) {
		writeFile(t, dir, "f", "", true)
		syncDir(t, dir)
		f := openFile(t, filepath.Join(dir, "f"), os.O_WRONLY|os.O_APPEND|os.O_SYNC)
		_, err := f.WriteString("sync")
		must(t, err)
		must(t, f.Close())
		appendFile(t, filepath.Join(dir, "f"), " lost", false)
	},
	check:    wantFile("f", "sync"),
	keptBack: true,
}}

// TestPowerCut runs every scenario on the FS, cuts the power and checks
// what the backing directory holds, through a new mount; a second cut
// with nothing done in between changes nothing.
func TestPowerCut(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			d := NewDisk(t)
			sc.run(t, d.Dir)
			d.PowerCut(func() {})
			if err := sc.check(d.Dir); err != nil {
				t.Fatalf("after the cut: %v", err)
			}
			d.PowerCut(func() {})
			if err := sc.check(d.Dir); err != nil {
				t.Fatalf("after a second cut: %v", err)
			}
		})
	}
}

// TestScenariosNeedTheCut runs each scenario whose promise is a loss on a
// file system that keeps nothing back (a clean unmount instead of a cut)
// and checks that the check fails there: each test of TestPowerCut that
// claims a loss can see one.
func TestScenariosNeedTheCut(t *testing.T) {
	for _, sc := range scenarios {
		if !sc.keptBack {
			continue
		}
		t.Run(sc.name, func(t *testing.T) {
			d := NewDisk(t)
			sc.run(t, d.Dir)
			d.Reboot()
			if err := sc.check(d.Dir); err == nil {
				t.Fatal("the check passed with everything written through: it cannot see what the cut drops")
			}
		})
	}
}

// TestDurableStateIsWhatTheBackingHolds: after a cut, the backing
// directory itself (not only the mount) holds exactly the durable files.
func TestDurableStateIsWhatTheBackingHolds(t *testing.T) {
	d := NewDisk(t)
	mkdirs(t, d.Dir, "sub")
	writeFile(t, filepath.Join(d.Dir, "sub"), "kept", "yes", true)
	writeFile(t, filepath.Join(d.Dir, "sub"), "dropped", "no", true)
	syncDir(t, d.Dir)
	must(t, os.Remove(filepath.Join(d.Dir, "sub", "dropped")))
	syncDir(t, filepath.Join(d.Dir, "sub"))
	writeFile(t, filepath.Join(d.Dir, "sub"), "late", "no", true)
	d.PowerCut(func() {})
	var got []string
	must(t, filepath.WalkDir(d.Backing(), func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(d.Backing(), p)
		got = append(got, rel)
		return err
	}))
	if want := []string{".", "sub", "sub/kept"}; !slices.Equal(got, want) {
		t.Errorf("the backing directory holds %q, want %q", got, want)
	}
	if err := wantFile("sub/kept", "yes")(d.Backing()); err != nil {
		t.Error(err)
	}
}

// TestInodeNumbersAreNeverReused: the backing file system gives a new
// file the inode number of one just unlinked; the FS must not take the
// two for one file, or the unlinked file's durable entry would name the
// new file's content.
func TestInodeNumbersAreNeverReused(t *testing.T) {
	d := NewDisk(t)
	writeFile(t, d.Dir, "old", "old content", true)
	syncDir(t, d.Dir)
	var first syscall.Stat_t
	must(t, syscall.Stat(filepath.Join(d.Dir, "old"), &first))
	must(t, os.Remove(filepath.Join(d.Dir, "old")))
	for i := range 20 {
		name := fmt.Sprintf("new%d", i)
		writeFile(t, d.Dir, name, "new content", true)
		var st syscall.Stat_t
		must(t, syscall.Stat(filepath.Join(d.Dir, name), &st))
		if st.Ino == first.Ino {
			t.Fatalf("%s has the unlinked file's inode number %d", name, st.Ino)
		}
	}
	d.PowerCut(func() {})
	if err := wantFile("old", "old content")(d.Dir); err != nil {
		t.Fatal(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func openFile(t *testing.T, p string, flag int) *os.File {
	t.Helper()
	f, err := os.OpenFile(p, flag, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// writeFile creates dir/name holding data, fsynced when sync is set.
func writeFile(t *testing.T, dir, name, data string, sync bool) {
	t.Helper()
	f := openFile(t, filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	_, err := f.WriteString(data)
	must(t, err)
	if sync {
		must(t, f.Sync())
	}
	must(t, f.Close())
}

// appendFile appends data to p, fsynced when sync is set.
func appendFile(t *testing.T, p, data string, sync bool) {
	t.Helper()
	f := openFile(t, p, os.O_WRONLY|os.O_APPEND)
	_, err := f.WriteString(data)
	must(t, err)
	if sync {
		must(t, f.Sync())
	}
	must(t, f.Close())
}

// syncDir fsyncs the directory dir.
func syncDir(t *testing.T, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	must(t, err)
	must(t, d.Sync())
	must(t, d.Close())
}

// mkdirs makes the directories names in dir and fsyncs dir.
func mkdirs(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		must(t, os.Mkdir(filepath.Join(dir, n), 0o755))
	}
	syncDir(t, dir)
}

func wantFile(name, want string) func(string) error {
	return func(dir string) error {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if !bytes.Equal(got, []byte(want)) {
			return fmt.Errorf("%s holds %q, want %q", name, got, want)
		}
		return nil
	}
}

func wantAbsent(name string) func(string) error {
	return func(dir string) error {
		if _, err := os.Lstat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %v, want it gone", name, err)
		}
		return nil
	}
}

func wantDir(name string) func(string) error {
	return func(dir string) error {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s is %v, want a directory", name, fi.Mode())
		}
		return nil
	}
}

func wantLink(name, target string) func(string) error {
	return func(dir string) error {
		got, err := os.Readlink(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if got != target {
			return fmt.Errorf("%s points to %q, want %q", name, got, target)
		}
		return nil
	}
}

func all(checks ...func(string) error) func(string) error {
	return func(dir string) error {
		var errs []error
		for _, c := range checks {
			errs = append(errs, c(dir))
		}
		return errors.Join(errs...)
	}
}
