package rawstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ingestorhq/ingestor/internal/durable"
)

// fileStore keeps each payload in its own file under dir. Keys map to
// relative paths, so a key's slashes become subdirectories.
type fileStore struct {
	// dir is the absolute root directory.
	dir string
	// segs are the open segments of Append (segment.go).
	segs segments
	// segMaxAge is Options.SegmentMaxAge.
	segMaxAge time.Duration
}

// openFile opens (creating if needed) the directory of a file:// URL; dir is
// the part after "file://".
func openFile(dir string) (*fileStore, error) {
	if dir == "" {
		return nil, errors.New(`raw store "file://": empty directory`)
	}
	abs, err := filepath.Abs(filepath.FromSlash(dir))
	if err != nil {
		return nil, fmt.Errorf("raw store file://%s: %w", dir, err)
	}
	s := &fileStore{dir: abs}
	if err := durable.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("raw store %s: create directory: %w", s, err)
	}
	return s, nil
}

// String returns "file://" and the absolute directory.
func (s *fileStore) String() string { return "file://" + s.dir }

// path returns the file that holds key, after checking that key stays
// inside the store.
func (s *fileStore) path(key string) (string, error) {
	if err := validateKey(key); err != nil {
		return "", err
	}
	return filepath.Join(s.dir, filepath.FromSlash(key)), nil
}

// Put writes body with durable.WriteFile: a temporary file next to the
// final one, synced, renamed into place, and the directory synced, so after
// Put returns the file is complete, and across a crash it is either absent
// or complete.
func (s *fileStore) Put(ctx context.Context, key string, body []byte) error {
	if err := s.put(ctx, key, body); err != nil {
		return fmt.Errorf("raw store %s: put %q: %w", s, key, err)
	}
	return nil
}

func (s *fileStore) put(ctx context.Context, key string, body []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	final, err := s.path(key)
	if err != nil {
		return err
	}
	return durable.WriteFile(final, body)
}

// Get reads the file that holds key and checks it against the hash in
// key, if key has one (Key).
func (s *fileStore) Get(ctx context.Context, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("raw store %s: get %q: %w", s, key, err)
	}
	p, err := s.path(key)
	if err != nil {
		return nil, fmt.Errorf("raw store %s: get %q: %w", s, key, err)
	}
	b, err := os.ReadFile(p)
	if err == nil {
		err = checkObject(key, b)
	}
	if err != nil {
		return nil, fmt.Errorf("raw store %s: get %q: %w", s, key, err)
	}
	return b, nil
}

// List walks the directories under prefix in key order. Temporary files of
// a Put in progress (or of one cut short by a crash) are not listed.
func (s *fileStore) List(ctx context.Context, prefix string, fn func(key string) error) error {
	if err := validatePrefix(prefix); err != nil {
		return fmt.Errorf("raw store %s: list %q: %w", s, prefix, err)
	}
	dir, _ := splitPrefix(prefix)
	err := s.walk(ctx, dir, prefix, func(key string) error {
		if err := fn(key); err != nil {
			return stopError{err}
		}
		return nil
	})
	if stop := (stopError{}); errors.As(err, &stop) {
		return stop.err
	}
	if err != nil {
		return fmt.Errorf("raw store %s: list %q: %w", s, prefix, err)
	}
	return nil
}

// stopError carries the error of a List callback through the walk, so
// that List returns it as it is, not wrapped as a store error.
type stopError struct{ err error }

func (e stopError) Error() string { return e.err.Error() }

// walk calls fn with the keys under the directory rel (a key prefix
// without its trailing slash, "" for the root) that start with prefix. A
// directory sorts as its name plus "/", so keys come out in lexical order
// even when a file name is a directory name plus a character below '/'.
func (s *fileStore) walk(ctx context.Context, rel, prefix string, fn func(key string) error) error {
	entries, err := os.ReadDir(filepath.Join(s.dir, filepath.FromSlash(rel)))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil // nothing is stored under it
	}
	if err != nil {
		return err
	}
	type entry struct {
		key string // the key, or the directory's key prefix with its "/"
		dir bool
	}
	list := make([]entry, 0, len(entries))
	for _, e := range entries {
		key := path.Join(rel, e.Name())
		switch {
		case e.IsDir():
			list = append(list, entry{key: key + "/", dir: true})
		case e.Type().IsRegular() && !durable.IsTemp(e.Name()):
			list = append(list, entry{key: key})
		}
	}
	slices.SortFunc(list, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	for _, e := range list {
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.dir {
			if !strings.HasPrefix(e.key, prefix) && !strings.HasPrefix(prefix, e.key) {
				continue
			}
			if err := s.walk(ctx, strings.TrimSuffix(e.key, "/"), prefix, fn); err != nil {
				return err
			}
			continue
		}
		if strings.HasPrefix(e.key, prefix) {
			if err := fn(e.key); err != nil {
				return err
			}
		}
	}
	return nil
}
