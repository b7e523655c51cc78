package rawstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/s3test"
)

// pruner is what raw retention needs of a store.
type pruner interface {
	rawstore.Store
	Objects(ctx context.Context, fn func(rawstore.Object) error) error
	Delete(ctx context.Context, keys []string) ([]string, error)
}

// objectKeys lists s's objects, checking each has a size and a time.
func objectKeys(t *testing.T, s pruner) []string {
	t.Helper()
	var keys []string
	if err := s.Objects(t.Context(), func(o rawstore.Object) error {
		if o.Size <= 0 || o.Modified.IsZero() || time.Since(o.Modified) > time.Hour {
			return fmt.Errorf("object %+v: want its size and a recent write time", o)
		}
		keys = append(keys, o.Key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestS3ObjectsAndDelete lists and deletes objects on a real versitygw,
// in more than one DeleteObjects request (batches of 1,000), under a
// prefix that holds a neighbour's object, which neither sees.
func TestS3ObjectsAndDelete(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t) // region and credentials come from the default chain
	s := openS3(t, srv, "raw").(pruner)
	other := openS3(t, srv, "rawx")
	if err := other.Put(t.Context(), "s/neighbour.json", []byte("x")); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := range 1005 {
		key := rawstore.Key("s", time.Unix(0, int64(i+1)), []byte(fmt.Sprint(i)))
		if err := s.Put(t.Context(), key, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	slices.Sort(keys)
	if got := objectKeys(t, s); !slices.Equal(got, keys) {
		t.Fatalf("Objects listed %d keys, want the %d put", len(got), len(keys))
	}
	removed, err := s.Delete(t.Context(), append(keys[:1003:1003], "s/gone-already.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1004 {
		t.Errorf("Delete removed %d keys, want 1004 (a missing key counts as removed, as S3 says)", len(removed))
	}
	if got := objectKeys(t, s); !slices.Equal(got, keys[1003:]) {
		t.Errorf("after Delete: %q, want %q", got, keys[1003:])
	}
	if got := listKeys(t, srv, "rawx/"); len(got) != 1 {
		t.Errorf("the neighbouring prefix holds %q, want its one object", got)
	}
}

// TestFileObjectsAndDelete: the file store lists its files with sizes and
// times, deletes them, leaves the open segment, and removes the day
// directories it emptied.
func TestFileObjectsAndDelete(t *testing.T) {
	dir := t.TempDir()
	st, err := rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + dir})
	if err != nil {
		t.Fatal(err)
	}
	s := st.(pruner)
	t.Cleanup(func() {
		if err := st.(interface{ Close() error }).Close(); err != nil {
			t.Error(err)
		}
	})
	a := rawstore.Key("s", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), []byte("a"))
	b := rawstore.Key("s", time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC), []byte("b"))
	for _, k := range []string{a, b} {
		if err := s.Put(t.Context(), k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	seg, _, err := st.(rawstore.PageAppender).AppendPage(t.Context(), "s", time.Now(), []byte(`[]`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{a, b, seg}
	slices.Sort(want)
	if got := objectKeys(t, s); !slices.Equal(got, want) {
		t.Fatalf("Objects: %q, want %q", got, want)
	}
	removed, err := s.Delete(t.Context(), []string{a, seg})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{a}) {
		t.Errorf("Delete removed %q, want only %s (the segment is open)", removed, a)
	}
	if _, err := os.Stat(filepath.Join(dir, "s", "2026", "01", "01")); !os.IsNotExist(err) {
		t.Errorf("the emptied day directory of %s is still there: %v", a, err)
	}
	if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(b))); err != nil {
		t.Errorf("%s, not asked for, is gone: %v", b, err)
	}
}
