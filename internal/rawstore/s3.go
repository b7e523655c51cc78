package rawstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// s3Store keeps each payload as one object under prefix in bucket.
// Transient failures are retried by the SDK's standard retryer, within the
// caller's context.
type s3Store struct {
	client *s3.Client
	bucket string
	// prefix has no leading or trailing slash; empty means the bucket root.
	prefix string
}

// openS3 builds the client from the default AWS credential chain and checks
// that the bucket is reachable.
func openS3(ctx context.Context, o Options) (*s3Store, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("raw store %q: %w", o.URL, err)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("raw store %q: want s3://bucket/prefix", o.URL)
	}
	s := &s3Store{bucket: u.Host, prefix: strings.Trim(u.Path, "/")}
	if s.prefix != "" {
		if err := validateKey(s.prefix); err != nil {
			return nil, fmt.Errorf("raw store %q: prefix: %w", o.URL, err)
		}
	}

	var opts []func(*config.LoadOptions) error
	if o.Region != "" {
		opts = append(opts, config.WithRegion(o.Region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("raw store %s: load aws config: %w", s, err)
	}
	if cfg.Region == "" {
		return nil, fmt.Errorf("raw store %s: no region: set the region option or AWS_REGION", s)
	}
	s.client = s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		so.UsePathStyle = o.PathStyle
	})

	if _, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(s.bucket)}); err != nil {
		return nil, fmt.Errorf("raw store %s: head bucket: %w", s, err)
	}
	return s, nil
}

// String returns "s3://bucket/prefix", or "s3://bucket" without a prefix.
func (s *s3Store) String() string {
	if s.prefix == "" {
		return "s3://" + s.bucket
	}
	return "s3://" + s.bucket + "/" + s.prefix
}

// objectKey returns the full object key for key, after validating it.
func (s *s3Store) objectKey(key string) (string, error) {
	if err := validateKey(key); err != nil {
		return "", err
	}
	if s.prefix == "" {
		return key, nil
	}
	return s.prefix + "/" + key, nil
}

// Put uploads body as one object. S3 PUTs are atomic and durable once
// acknowledged, and a repeated Put of the same key overwrites.
func (s *s3Store) Put(ctx context.Context, key string, body []byte) error {
	k, err := s.objectKey(key)
	if err != nil {
		return fmt.Errorf("raw store %s: put %q: %w", s, key, err)
	}
	_, err = s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           aws.String(k),
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
		ContentType:   aws.String("application/json"),
	})
	if err != nil {
		return fmt.Errorf("raw store %s: put %q: %w", s, key, err)
	}
	return nil
}

// Get downloads the object stored under key and checks it against the
// hash in key, if key has one (Key).
func (s *s3Store) Get(ctx context.Context, key string) ([]byte, error) {
	b, err := s.get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("raw store %s: get %q: %w", s, key, err)
	}
	return b, nil
}

func (s *s3Store) get(ctx context.Context, key string) ([]byte, error) {
	k, err := s.objectKey(key)
	if err != nil {
		return nil, err
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(k),
	})
	if err != nil {
		if nsk := (*types.NoSuchKey)(nil); errors.As(err, &nsk) {
			return nil, notFoundError{err}
		}
		return nil, err
	}
	b, err := io.ReadAll(out.Body)
	if cerr := out.Body.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = checkObject(key, b)
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// List pages through ListObjectsV2 under the store's prefix; S3 returns
// keys in lexical (UTF-8 binary) order.
func (s *s3Store) List(ctx context.Context, prefix string, fn func(key string) error) error {
	if err := validatePrefix(prefix); err != nil {
		return fmt.Errorf("raw store %s: list %q: %w", s, prefix, err)
	}
	root := ""
	if s.prefix != "" {
		root = s.prefix + "/"
	}
	pages := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(s.bucket),
		Prefix: aws.String(root + prefix),
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("raw store %s: list %q: %w", s, prefix, err)
		}
		for _, o := range page.Contents {
			key, ok := strings.CutPrefix(aws.ToString(o.Key), root)
			if !ok || validateKey(key) != nil {
				continue // not an object Put could have written
			}
			if err := fn(key); err != nil {
				return err
			}
		}
	}
	return nil
}

// notFoundError marks a missing object as fs.ErrNotExist while keeping the
// S3 error's message and type reachable through errors.As.
type notFoundError struct{ err error }

func (e notFoundError) Error() string { return e.err.Error() }

func (e notFoundError) Unwrap() []error { return []error{fs.ErrNotExist, e.err} }
