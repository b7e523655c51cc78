// Package rawstore makes raw payloads durable before anything else happens to
// them: a local directory (the default) or an S3 bucket.
package rawstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Store keeps raw payloads under keys. Put returns only once the payload is
// durable; putting the same key twice stores the same bytes again
// (overwrite), so a retry never duplicates.
type Store interface {
	// Put stores body under key durably.
	Put(ctx context.Context, key string, body []byte) error
	// Get returns the bytes stored under key. The error wraps
	// fs.ErrNotExist when nothing is stored under key, and is a
	// *CorruptError when key has Key's form and the bytes do not match
	// the SHA-256 in it.
	Get(ctx context.Context, key string) ([]byte, error)
	// List calls fn with every key that starts with prefix, in lexical
	// order (for the keys Key makes: fetch order within a source). It stops
	// at the first error fn returns and returns that error.
	List(ctx context.Context, prefix string, fn func(key string) error) error
	// String describes the store for logs, e.g. "file:///var/lib/ingestor/raw".
	String() string
}

// Options selects and configures a Store.
type Options struct {
	// URL is file://DIR or s3://bucket/prefix.
	URL string
	// Endpoint overrides the S3 endpoint, for S3-compatible servers.
	Endpoint string
	// Region is the S3 region.
	Region string
	// PathStyle selects path-style S3 addressing.
	PathStyle bool
	// SegmentMaxAge closes a file store's page segment once it was opened
	// this long ago, so that retention, which never deletes the segment
	// still open, can delete its pages in time; the next page starts a
	// new one. 0: only its size (PageSegmentMaxBytes) and the UTC day
	// close it.
	SegmentMaxAge time.Duration
}

// Key returns the deterministic key for a payload of source fetched at
// fetchedAt: <source>/<yyyy>/<mm>/<dd>/<unix-nanos>-<sha256 prefix>.json.
// The same payload fetched at the same instant maps to the same key, so a
// retried Put overwrites; the content hash keeps keys unique across restarts.
func Key(source string, fetchedAt time.Time, body []byte) string {
	return keyFor(source, fetchedAt, body)
}

// keyFor implements Key. The hash is over the body only, so two sources
// fetching identical bytes at the same instant still get distinct keys
// through the source component.
func keyFor(source string, fetchedAt time.Time, body []byte) string {
	sum := sha256.Sum256(body)
	t := fetchedAt.UTC()
	return fmt.Sprintf("%s/%04d/%02d/%02d/%d-%s.json",
		source, t.Year(), int(t.Month()), t.Day(), t.UnixNano(), hex.EncodeToString(sum[:16]))
}

// Open returns the Store that o.URL names: file://DIR (DIR may be relative,
// e.g. file://./data/raw, and is created if missing) or s3://bucket/prefix
// (the bucket must exist and be reachable; credentials come from the default
// AWS chain).
func Open(ctx context.Context, o Options) (Store, error) {
	scheme, rest, ok := strings.Cut(o.URL, "://")
	if !ok {
		return nil, fmt.Errorf("raw store %q: want file://DIR or s3://bucket/prefix", o.URL)
	}
	// A failed open returns a nil Store, not a nil *fileStore in one:
	// the caller's cleanup tests it against nil.
	switch scheme {
	case "file":
		s, err := openFile(rest)
		if err != nil {
			return nil, err
		}
		s.segMaxAge = o.SegmentMaxAge
		return s, nil
	case "s3":
		s, err := openS3(ctx, o)
		if err != nil {
			return nil, err
		}
		return s, nil
	default:
		return nil, fmt.Errorf("raw store %q: unsupported scheme %q (want file or s3)", o.URL, scheme)
	}
}

// validatePrefix checks a List prefix: empty, or a key or the start of
// one. Its directory part (up to the last slash) must be a valid key, so a
// listing never leaves the store.
func validatePrefix(prefix string) error {
	dir, _ := splitPrefix(prefix)
	if dir == "" {
		if strings.HasPrefix(prefix, "/") {
			return errors.New("invalid prefix: starts with /")
		}
		return nil
	}
	if err := validateKey(dir); err != nil {
		return fmt.Errorf("invalid prefix: %w", err)
	}
	return nil
}

// splitPrefix splits a List prefix at its last slash: "a/b/c" gives "a/b"
// and "c"; a prefix without a slash has an empty dir.
func splitPrefix(prefix string) (dir, rest string) {
	i := strings.LastIndexByte(prefix, '/')
	if i < 0 {
		return "", prefix
	}
	return prefix[:i], prefix[i+1:]
}

// validateKey rejects keys that could escape the store's root or that name
// the same object in more than one way. Both stores apply it, so a key that
// one accepts the other accepts too.
func validateKey(key string) error {
	switch {
	case key == "":
		return errors.New("invalid key: empty")
	case strings.HasPrefix(key, "/"):
		return errors.New("invalid key: starts with /")
	case strings.Contains(key, ".."):
		return errors.New("invalid key: contains ..")
	case path.Clean(key) != key:
		return errors.New("invalid key: not a clean path")
	case !filepath.IsLocal(filepath.FromSlash(key)):
		return errors.New("invalid key: not a local path")
	}
	return nil
}
