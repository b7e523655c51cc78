package rawstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/ingestorhq/ingestor/internal/durable"
)

// Object is a stored object as a listing sees it.
type Object struct {
	Key  string
	Size int64
	// Modified is when the object was last written: a page segment's last
	// append, an S3 object's LastModified.
	Modified time.Time
}

// Objects calls fn with every object of the store, in key order, with its
// size and modification time. Temporary files are left out.
func (s *fileStore) Objects(ctx context.Context, fn func(Object) error) error {
	return s.List(ctx, "", func(key string) error {
		p, err := s.path(key)
		if err != nil {
			return err
		}
		info, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed since the listing read its directory
		}
		if err != nil {
			return fmt.Errorf("raw store %s: %w", s, err)
		}
		return fn(Object{Key: key, Size: info.Size(), Modified: info.ModTime()})
	})
}

// Delete removes the files of keys, leaving any segment still open for
// appends (it is written to, so it is not done) and keys already gone,
// fsyncs each directory it removed a file from, and removes directories
// it left empty (fsyncing their parents), so a power cut never brings a
// pruned file back. It returns the keys it removed.
func (s *fileStore) Delete(ctx context.Context, keys []string) ([]string, error) {
	open := s.openSegmentKeys()
	dirs := map[string]bool{}
	var removed []string
	for _, key := range keys {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		if open[key] {
			continue
		}
		p, err := s.path(key)
		if err != nil {
			return removed, err
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("raw store %s: delete %s: %w", s, key, err)
		}
		removed = append(removed, key)
		dirs[filepath.Dir(p)] = true
	}
	for dir := range dirs {
		if err := s.syncOrRemoveDir(dir); err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// syncOrRemoveDir makes the removals in dir durable: if dir is now empty
// (and below the store's root) it is removed in turn and its parent
// synced; otherwise dir is synced.
func (s *fileStore) syncOrRemoveDir(dir string) error {
	for dir != s.dir {
		if err := os.Remove(dir); err != nil {
			// Not empty (or gone): sync it, so its removed entries stay removed.
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return durable.SyncDir(dir)
		}
		dir = filepath.Dir(dir)
	}
	return durable.SyncDir(dir)
}

// openSegmentKeys returns the keys of the segments open for appends.
func (s *fileStore) openSegmentKeys() map[string]bool {
	s.segs.mu.Lock()
	segs := make([]*segment, 0, len(s.segs.open))
	for _, seg := range s.segs.open {
		segs = append(segs, seg)
	}
	s.segs.mu.Unlock()
	open := make(map[string]bool, len(segs))
	for _, seg := range segs {
		seg.mu.Lock()
		if seg.f != nil {
			open[seg.key] = true
		}
		seg.mu.Unlock()
	}
	return open
}

// Objects lists the store's objects with ListObjectsV2: sizes and
// LastModified come with the listing.
func (s *s3Store) Objects(ctx context.Context, fn func(Object) error) error {
	root := s.root()
	pages := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(s.bucket),
		Prefix: aws.String(root),
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("raw store %s: list: %w", s, err)
		}
		for _, o := range page.Contents {
			key, ok := cutRoot(aws.ToString(o.Key), root)
			if !ok {
				continue // not an object Put could have written
			}
			if err := fn(Object{Key: key, Size: aws.ToInt64(o.Size), Modified: aws.ToTime(o.LastModified)}); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteBatch is the most keys one DeleteObjects request takes.
const deleteBatch = 1000

// Delete removes the objects of keys with DeleteObjects, up to 1,000 a
// request (a key already gone counts as removed, as S3 answers). It
// returns the keys removed; a key S3 refused is reported in the error.
func (s *s3Store) Delete(ctx context.Context, keys []string) ([]string, error) {
	var removed []string
	for len(keys) > 0 {
		batch := keys[:min(len(keys), deleteBatch)]
		keys = keys[len(batch):]
		ids := make([]types.ObjectIdentifier, 0, len(batch))
		for _, key := range batch {
			name, err := s.objectKey(key)
			if err != nil {
				return removed, err
			}
			ids = append(ids, types.ObjectIdentifier{Key: aws.String(name)})
		}
		out, err := s.client.DeleteObjects(ctx, &s3.DeleteObjectsInput{
			Bucket: aws.String(s.bucket),
			Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)},
		})
		if err != nil {
			return removed, fmt.Errorf("raw store %s: delete %d objects: %w", s, len(batch), err)
		}
		failed := map[string]string{}
		for _, e := range out.Errors {
			failed[aws.ToString(e.Key)] = aws.ToString(e.Code) + ": " + aws.ToString(e.Message)
		}
		for i, key := range batch {
			if _, bad := failed[aws.ToString(ids[i].Key)]; !bad {
				removed = append(removed, key)
			}
		}
		if len(failed) > 0 {
			for name, why := range failed {
				return removed, fmt.Errorf("raw store %s: delete %s (and %d more): %s", s, name, len(failed)-1, why)
			}
		}
	}
	return removed, nil
}

// root is the object name prefix of the store's keys: its prefix and a
// slash, or "" at the bucket's root.
func (s *s3Store) root() string {
	if s.prefix == "" {
		return ""
	}
	return s.prefix + "/"
}

// cutRoot returns the key of the object name, or false when the name is
// not under root or not a key Put could have written.
func cutRoot(name, root string) (string, bool) {
	if len(name) < len(root) || name[:len(root)] != root {
		return "", false
	}
	key := name[len(root):]
	if validateKey(key) != nil || path.Clean(key) != key {
		return "", false
	}
	return key, true
}
