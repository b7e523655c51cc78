package s3test_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ingestorhq/ingestor/internal/s3test"
)

func put(t *testing.T, c *s3.Client, bucket, key string, body []byte) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := c.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(body),
	})
	return err
}

func get(t *testing.T, c *s3.Client, bucket, key string) []byte {
	t.Helper()
	out, err := c.GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	defer func() {
		if err := out.Body.Close(); err != nil {
			t.Errorf("close body: %v", err)
		}
	}()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return b
}

func TestStartServesBucket(t *testing.T) {
	srv := s3test.Start(t)
	if srv.Endpoint == "" || srv.Bucket == "" || srv.Region != "us-east-1" {
		t.Fatalf("incomplete server: %+v", srv)
	}
	c := srv.Client()
	if _, err := c.HeadBucket(t.Context(), &s3.HeadBucketInput{Bucket: aws.String(srv.Bucket)}); err != nil {
		t.Fatalf("head bucket: %v", err)
	}
	if err := put(t, c, srv.Bucket, "a/b.json", []byte(`{"x":1}`)); err != nil {
		t.Fatalf("put: %v", err)
	}
	if got := get(t, c, srv.Bucket, "a/b.json"); string(got) != `{"x":1}` {
		t.Fatalf("get = %q", got)
	}
}

func TestStopRestartKeepsPortAndData(t *testing.T) {
	srv := s3test.Start(t)
	c := srv.Client()
	endpoint := srv.Endpoint
	if err := put(t, c, srv.Bucket, "before", []byte("1")); err != nil {
		t.Fatalf("put: %v", err)
	}

	srv.Stop()
	srv.Stop() // a second Stop is a no-op
	if err := put(t, c, srv.Bucket, "during", []byte("2")); err == nil {
		t.Fatal("put to a stopped server succeeded")
	}

	srv.Restart()
	if srv.Endpoint != endpoint {
		t.Fatalf("endpoint changed across restart: %s -> %s", endpoint, srv.Endpoint)
	}
	if got := get(t, c, srv.Bucket, "before"); string(got) != "1" {
		t.Fatalf("object written before the outage: %q", got)
	}
	if err := put(t, c, srv.Bucket, "after", []byte("3")); err != nil {
		t.Fatalf("put after restart: %v", err)
	}
}

func TestSetEnvFeedsDefaultChain(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	cfg, err := config.LoadDefaultConfig(t.Context())
	if err != nil {
		t.Fatalf("load default config: %v", err)
	}
	if cfg.Region != srv.Region {
		t.Fatalf("region = %q, want %q", cfg.Region, srv.Region)
	}
	c := s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(srv.Endpoint)
		o.UsePathStyle = true
	})
	if _, err := c.HeadBucket(t.Context(), &s3.HeadBucketInput{Bucket: aws.String(srv.Bucket)}); err != nil {
		t.Fatalf("head bucket with default-chain credentials: %v", err)
	}
}

func TestTwoServersAreIndependent(t *testing.T) {
	a, b := s3test.Start(t), s3test.Start(t)
	if a.Endpoint == b.Endpoint {
		t.Fatalf("both servers on %s", a.Endpoint)
	}
	if err := put(t, a.Client(), a.Bucket, "only-a", []byte("a")); err != nil {
		t.Fatalf("put: %v", err)
	}
	_, err := b.Client().HeadObject(t.Context(), &s3.HeadObjectInput{Bucket: aws.String(b.Bucket), Key: aws.String("only-a")})
	if err == nil {
		t.Fatal("object written to one server is visible on the other")
	}
}

func TestMissingBinary(t *testing.T) {
	// The test fails, never skips, with or without CI: a skipped S3 test
	// would hide the S3 path.
	for _, tc := range []struct {
		ci   string
		want string
	}{
		{ci: "", want: "fatal"},
		{ci: "true", want: "fatal"},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			t.Setenv("VERSITYGW", filepath.Join(t.TempDir(), "no-such-versitygw"))
			ft := &fakeTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				s3test.Start(ft)
			}()
			<-done
			if ft.ended != tc.want {
				t.Fatalf("Start ended with %q, want %q", ft.ended, tc.want)
			}
			if !strings.Contains(ft.msg, "go install github.com/versity/versitygw/cmd/versitygw@") {
				t.Errorf("message does not say how to install: %s", ft.msg)
			}
		})
	}
}

// fakeTB records how Start ends the test instead of ending the real one.
type fakeTB struct {
	testing.TB
	ended string
	msg   string
}

func (f *fakeTB) Skipf(format string, args ...any) { f.end("skip", format, args) }

func (f *fakeTB) Fatalf(format string, args ...any) { f.end("fatal", format, args) }

func (f *fakeTB) end(how, format string, args []any) {
	f.ended, f.msg = how, fmt.Sprintf(format, args...)
	runtime.Goexit()
}
