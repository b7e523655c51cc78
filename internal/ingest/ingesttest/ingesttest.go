// Package ingesttest writes raw payloads for tests the way the daemon
// lays them out, so that tests outside the ingest seam (the sender, replay,
// doctor, raw retention) need not know the raw store's keys or page
// segments either.
package ingesttest

import (
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/rawstore"
)

// WritePage makes body, a page of source fetched at, durable in raw as
// the daemon does (appended to the source's page segment on the file
// store, an object of its own on S3) and returns where it is.
func WritePage(t testing.TB, raw rawstore.Store, source string, at time.Time, body []byte) ingest.Ref {
	t.Helper()
	in := ingest.New(ingest.Options{Raw: raw})
	p := in.Page(source, at, body)
	if err := in.Write(t.Context(), &p); err != nil {
		t.Fatalf("write a page of %s: %v", source, err)
	}
	return p.Ref()
}

// WriteObject writes body, a page of source fetched at, to raw as an
// object of its own under its content key, whatever the store (as the S3
// store keeps every page, and as daemons before page segments kept them
// on disk too), and returns the key.
func WriteObject(t testing.TB, raw rawstore.Store, source string, at time.Time, body []byte) string {
	t.Helper()
	key := rawstore.Key(source, at, body)
	if err := raw.Put(t.Context(), key, body); err != nil {
		t.Fatalf("write %s: %v", key, err)
	}
	return key
}
