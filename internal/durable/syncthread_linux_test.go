package durable_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/ingestorhq/ingestor/internal/durable"
	"github.com/ingestorhq/ingestor/internal/powercut"
)

// TestDatasyncParkedMakesDataDurable: what was written before
// DatasyncParked returned survives a power cut, and what was written after
// it (never synced) does not, which shows the cut takes what a missing
// sync would have left in memory.
func TestDatasyncParkedMakesDataDurable(t *testing.T) {
	disk := powercut.NewDisk(t)
	if err := durable.SyncDir(disk.Dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(disk.Dir, "segment")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := durable.SyncDir(disk.Dir); err != nil {
		t.Fatal(err)
	}
	synced := bytes.Repeat([]byte("durable "), 512)
	if _, err := f.Write(synced); err != nil {
		t.Fatal(err)
	}
	if err := durable.DatasyncParked(f); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("never synced")); err != nil {
		t.Fatal(err)
	}
	disk.PowerCut(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, synced) {
		t.Errorf("after the power cut the file holds %d bytes (%q...), want the %d synced ones alone",
			len(got), got[:min(len(got), 16)], len(synced))
	}
}

// TestDatasyncParkedReportsTheError: a descriptor fdatasync refuses (a
// pipe's) fails with fdatasync's errno, as a *os.PathError naming the
// file, as Datasync does.
func TestDatasyncParkedReportsTheError(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close(); _ = w.Close() }()
	for _, sync := range []func(*os.File) error{durable.Datasync, durable.DatasyncParked} {
		err := sync(w)
		var pe *os.PathError
		if !errors.As(err, &pe) || pe.Op != "fdatasync" || pe.Path != w.Name() || !errors.Is(err, syscall.EINVAL) {
			t.Errorf("sync of a pipe: %v, want fdatasync %s: EINVAL", err, w.Name())
		}
	}
}

// TestDatasyncParkedManyAtOnce: more goroutines than there are sync
// threads sync at once, each its own file, again and again; every sync
// succeeds (those that find no thread idle run in their goroutine) and
// every thread is idle again afterwards, none lost.
func TestDatasyncParkedManyAtOnce(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	for g := range 12 {
		f, err := os.Create(filepath.Join(dir, "f"+string(rune('a'+g))))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer func() { _ = f.Close() }()
			for i := range 30 {
				if _, err := f.Write([]byte{byte(i)}); err != nil {
					t.Error(err)
					return
				}
				if err := durable.DatasyncParked(f); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	started, idle := durable.SyncThreads()
	if started == 0 || idle != started {
		t.Errorf("%d sync threads started, %d idle after every sync returned; want some, all idle", started, idle)
	}
}
