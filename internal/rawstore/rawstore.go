// Package rawstore makes raw payloads durable before anything else happens to
// them: a local directory (the default) or an S3 bucket.
package rawstore

import (
	"context"
	"time"
)

// Store keeps raw payloads under keys. Put returns only once the payload is
// durable; putting the same key twice stores the same bytes again
// (overwrite), so a retry never duplicates.
type Store interface {
	// Put stores body under key durably.
	Put(ctx context.Context, key string, body []byte) error
	// Get returns the bytes stored under key.
	Get(ctx context.Context, key string) ([]byte, error)
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
}

// Key returns the deterministic key for a payload of source fetched at
// fetchedAt: <source>/<yyyy>/<mm>/<dd>/<unix-nanos>-<sha256 prefix>.json.
// The same payload fetched at the same instant maps to the same key, so a
// retried Put overwrites; the content hash keeps keys unique across restarts.
func Key(source string, fetchedAt time.Time, body []byte) string {
	return keyFor(source, fetchedAt, body)
}
