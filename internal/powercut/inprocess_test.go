package powercut

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestConcurrentWritersInProcess serves the FS from the test's own
// process, so that the race detector sees its code (NewDisk runs it in a
// process of its own, built without -race), and has eight goroutines
// write, fsync, rename and unlink files at once. Plain file operations
// only: serving and using FUSE in one process is safe for them (not for
// SQLite's mmap, see Disk). After the cut each file holds exactly its
// fsynced rounds, and the files whose directory entries were not fsynced
// are gone.
func TestConcurrentWritersInProcess(t *testing.T) {
	dir := t.TempDir()
	mnt, backing, state := filepath.Join(dir, "mnt"), filepath.Join(dir, "backing"), filepath.Join(dir, "state")
	for _, p := range []string{mnt, backing} {
		must(t, os.Mkdir(p, 0o755))
	}
	fsys, err := Mount(mnt, backing, state)
	if err != nil {
		t.Fatal(err)
	}
	unmounted := false
	t.Cleanup(func() {
		if !unmounted {
			if err := fsys.Unmount(); err != nil {
				t.Error(err)
			}
		}
	})
	const writers, rounds = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			sub := filepath.Join(mnt, fmt.Sprintf("w%d", w))
			if err := os.Mkdir(sub, 0o755); err != nil {
				errs <- err
				return
			}
			f, err := os.Create(filepath.Join(sub, "log"))
			if err != nil {
				errs <- err
				return
			}
			for r := range rounds {
				if _, err := fmt.Fprintf(f, "round %d\n", r); err != nil {
					errs <- err
					return
				}
				if r%2 == 0 { // even rounds are made durable, odd ones are not yet
					if err := f.Sync(); err != nil {
						errs <- err
						return
					}
				}
				tmp := filepath.Join(sub, fmt.Sprintf("tmp%d", r))
				if err := os.WriteFile(tmp, []byte("x"), 0o644); err != nil {
					errs <- err
					return
				}
				if err := os.Rename(tmp, filepath.Join(sub, "latest")); err != nil {
					errs <- err
					return
				}
			}
			if err := f.Close(); err != nil {
				errs <- err
				return
			}
			d, err := os.Open(sub)
			if err == nil {
				err = d.Sync() // log and latest become durable entries
				if cerr := d.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	syncDir(t, mnt)
	must(t, os.WriteFile(filepath.Join(mnt, "w0", "late"), []byte("late"), 0o644)) // its directory never fsynced again
	fsys.Cut()
	must(t, fsys.Unmount())
	unmounted = true

	want := ""
	for r := range rounds - 1 { // the last round, 19, is odd: not durable
		want += fmt.Sprintf("round %d\n", r)
	}
	for w := range writers {
		sub := filepath.Join(backing, fmt.Sprintf("w%d", w))
		if err := wantFile("log", want)(sub); err != nil {
			t.Errorf("writer %d: %v", w, err)
		}
		if err := wantFile("latest", "")(sub); err != nil { // renamed in, its data never fsynced
			t.Errorf("writer %d: %v", w, err)
		}
	}
	if err := wantAbsent("w0/late")(backing); err != nil {
		t.Error(err)
	}
}
