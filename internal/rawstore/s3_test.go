package rawstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/s3test"
)

// openS3 opens a store on srv under prefix with credentials from the
// environment, as the daemon does in production.
func openS3(t *testing.T, srv *s3test.Server, prefix string) rawstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := rawstore.Open(ctx, rawstore.Options{
		URL:       "s3://" + srv.Bucket + "/" + prefix,
		Endpoint:  srv.Endpoint,
		PathStyle: true,
	})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return s
}

func listKeys(t *testing.T, srv *s3test.Server, prefix string) []string {
	t.Helper()
	out, err := srv.Client().ListObjectsV2(t.Context(), &s3.ListObjectsV2Input{
		Bucket: aws.String(srv.Bucket),
		Prefix: aws.String(prefix),
	})
	if err != nil {
		t.Fatalf("list %s: %v", prefix, err)
	}
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	return keys
}

func TestS3PutGet(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t) // region and credentials come from the default chain
	s := openS3(t, srv, "raw/v1")
	if got, want := s.String(), "s3://"+srv.Bucket+"/raw/v1"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}

	body := []byte(`[{"id":1},{"id":2}]`)
	key := rawstore.Key("github", time.Date(2024, 3, 5, 10, 0, 0, 0, time.UTC), body)
	for i := range 2 { // the second Put is a retry and must overwrite
		if err := s.Put(t.Context(), key, body); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	got, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("get = %q, want %q", got, body)
	}

	// The object sits under prefix/key, once, as JSON.
	if keys := listKeys(t, srv, "raw/"); len(keys) != 1 || keys[0] != "raw/v1/"+key {
		t.Fatalf("objects under raw/ = %q, want [raw/v1/%s]", keys, key)
	}
	out, err := srv.Client().GetObject(t.Context(), &s3.GetObjectInput{
		Bucket: aws.String(srv.Bucket),
		Key:    aws.String("raw/v1/" + key),
	})
	if err != nil {
		t.Fatalf("raw get: %v", err)
	}
	raw, err := io.ReadAll(out.Body)
	if cerr := out.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil || !bytes.Equal(raw, body) {
		t.Fatalf("raw object = %q, %v", raw, err)
	}
	if ct := aws.ToString(out.ContentType); ct != "application/json" {
		t.Errorf("content type = %q, want application/json", ct)
	}
}

func TestS3NoPrefix(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	s := openS3(t, srv, "")
	if got, want := s.String(), "s3://"+srv.Bucket; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if err := s.Put(t.Context(), "src/k.json", []byte("{}")); err != nil {
		t.Fatalf("put: %v", err)
	}
	if keys := listKeys(t, srv, ""); len(keys) != 1 || keys[0] != "src/k.json" {
		t.Fatalf("objects = %q, want [src/k.json]", keys)
	}
}

func TestS3GetMissing(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	s := openS3(t, srv, "p")
	_, err := s.Get(t.Context(), "no/such.json")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("get missing: %v, want fs.ErrNotExist", err)
	}
	if !strings.Contains(err.Error(), `"no/such.json"`) || !strings.Contains(err.Error(), s.String()) {
		t.Errorf("error %q does not name the store and key", err)
	}
}

func TestS3RejectsEscapingKeys(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	s := openS3(t, srv, "p")
	for _, key := range []string{"", "/abs", "../up", "a/../../up"} {
		if err := s.Put(t.Context(), key, []byte("x")); err == nil || !strings.Contains(err.Error(), "invalid key") {
			t.Errorf("put %q: %v, want invalid key", key, err)
		}
	}
	if keys := listKeys(t, srv, ""); len(keys) != 0 {
		t.Fatalf("rejected puts wrote %q", keys)
	}
}

func TestS3OpenMissingBucket(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := rawstore.Open(ctx, rawstore.Options{
		URL:       "s3://no-such-bucket/raw",
		Endpoint:  srv.Endpoint,
		PathStyle: true,
	})
	if err == nil {
		t.Fatal("open on a missing bucket succeeded")
	}
	if want := "raw store s3://no-such-bucket/raw: head bucket: "; !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error = %q, want prefix %q", err, want)
	}
	if ctx.Err() != nil {
		t.Fatalf("open gave up only at the deadline: %v", err)
	}
}

func TestS3OpenBadCredentials(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := rawstore.Open(ctx, rawstore.Options{
		URL:       "s3://" + srv.Bucket + "/raw",
		Endpoint:  srv.Endpoint,
		PathStyle: true,
	})
	if err == nil || !strings.Contains(err.Error(), "head bucket: ") {
		t.Fatalf("open with a wrong secret: %v, want a head bucket error", err)
	}
}

func TestS3OpenNeedsRegion(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	_, err := rawstore.Open(t.Context(), rawstore.Options{URL: "s3://" + srv.Bucket, Endpoint: srv.Endpoint, PathStyle: true})
	if err == nil || !strings.Contains(err.Error(), "no region") {
		t.Fatalf("open without a region: %v", err)
	}
	// An explicit region is enough.
	s, err := rawstore.Open(t.Context(), rawstore.Options{URL: "s3://" + srv.Bucket, Endpoint: srv.Endpoint, PathStyle: true, Region: srv.Region})
	if err != nil {
		t.Fatalf("open with Options.Region: %v", err)
	}
	if err := s.Put(t.Context(), "k.json", []byte("{}")); err != nil {
		t.Fatalf("put: %v", err)
	}
}

func TestS3PutDuringOutage(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	s := openS3(t, srv, "raw")
	if err := s.Put(t.Context(), "before.json", []byte("1")); err != nil {
		t.Fatalf("put before outage: %v", err)
	}

	srv.Stop()
	const timeout = 2 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	start := time.Now()
	err := s.Put(ctx, "during.json", []byte("2"))
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("put with the server stopped succeeded")
	}
	if !strings.HasPrefix(err.Error(), `raw store `+s.String()+`: put "during.json": `) {
		t.Errorf("error %q does not name the store and key", err)
	}
	t.Logf("put during outage: %v after %v", err, elapsed)
	if elapsed > timeout+time.Second {
		t.Fatalf("put took %v, past its %v context", elapsed, timeout)
	}

	srv.Restart()
	if err := s.Put(t.Context(), "during.json", []byte("2")); err != nil {
		t.Fatalf("put after restart: %v", err)
	}
	for key, want := range map[string]string{"before.json": "1", "during.json": "2"} {
		if got, err := s.Get(t.Context(), key); err != nil || string(got) != want {
			t.Errorf("get %s after restart = %q, %v; want %q", key, got, err, want)
		}
	}
}

func TestS3PutCanceled(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	s := openS3(t, srv, "raw")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.Put(ctx, "k.json", []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("put with canceled ctx: %v, want context.Canceled", err)
	}
}

// TestS3GetFindsCorruptObject stores bytes under the key of other bytes
// (a truncated upload): Get reports a sha256 mismatch instead of them.
func TestS3GetFindsCorruptObject(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	s := openS3(t, srv, "raw")
	body := []byte(`[{"id":1},{"id":2}]`)
	key := rawstore.Key("github", time.Date(2024, 3, 5, 10, 0, 0, 0, time.UTC), body)
	if err := s.Put(t.Context(), key, body[:10]); err != nil {
		t.Fatal(err)
	}
	_, err := s.Get(t.Context(), key)
	var ce *rawstore.CorruptError
	if !errors.As(err, &ce) || ce.What != "sha256 mismatch" || ce.Key != key {
		t.Fatalf("get a truncated upload: %v, want a sha256 mismatch of %s", err, key)
	}
}
