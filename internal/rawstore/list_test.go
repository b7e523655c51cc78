package rawstore_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/s3test"
)

// listAll returns every key s lists under prefix, in the order listed.
func listAll(t *testing.T, s rawstore.Store, prefix string) []string {
	t.Helper()
	var keys []string
	if err := s.List(t.Context(), prefix, func(key string) error {
		keys = append(keys, key)
		return nil
	}); err != nil {
		t.Fatalf("list %q: %v", prefix, err)
	}
	return keys
}

// putListFixture stores payloads of two sources over two days, a
// dead-lettered one, and two keys whose order tells a directory walk from
// a lexical listing. It returns every key, sorted.
func putListFixture(t *testing.T, s rawstore.Store) []string {
	t.Helper()
	day := time.Date(2024, 3, 5, 23, 59, 0, 0, time.UTC)
	var keys []string
	for i := range 6 {
		src := []string{"github", "gitlab"}[i%2]
		body := fmt.Appendf(nil, `[{"id":%d}]`, i)
		keys = append(keys, rawstore.Key(src, day.Add(time.Duration(i)*30*time.Second), body))
	}
	keys = append(keys,
		"deadletter/"+rawstore.Key("github", day, []byte("not json")),
		"a/b.json", // "a/" sorts after "a-c.json": '/' > '-'
		"a-c.json",
	)
	for _, k := range keys {
		if err := s.Put(t.Context(), k, []byte("x")); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	slices.Sort(keys)
	return keys
}

// testList checks List on a store holding putListFixture's keys.
func testList(t *testing.T, s rawstore.Store, all []string) {
	if got := listAll(t, s, ""); !slices.Equal(got, all) {
		t.Errorf("list all = %q\nwant %q", got, all)
	}
	var github []string
	for _, k := range all {
		if strings.HasPrefix(k, "github/") {
			github = append(github, k)
		}
	}
	if len(github) != 3 {
		t.Fatalf("fixture has %d github keys, want 3", len(github))
	}
	if got := listAll(t, s, "github/"); !slices.Equal(got, github) {
		t.Errorf("list github/ = %q\nwant %q", got, github)
	}
	// A prefix may end inside a path component.
	if got := listAll(t, s, "github/2024/03/06/17"); !slices.Equal(got, github[1:]) {
		t.Errorf("list github/2024/03/06/17 = %q\nwant the two keys of 6 March %q", got, github[1:])
	}
	if got := listAll(t, s, "deadletter/github/"); len(got) != 1 || !strings.HasPrefix(got[0], "deadletter/github/2024/03/05/") {
		t.Errorf("list deadletter/github/ = %q", got)
	}
	if got := listAll(t, s, "nosuch/"); len(got) != 0 {
		t.Errorf("list nosuch/ = %q, want nothing", got)
	}
	if got := listAll(t, s, "a"); !slices.Equal(got, []string{"a-c.json", "a/b.json"}) {
		t.Errorf("list a = %q, want lexical order [a-c.json a/b.json]", got)
	}

	// The callback's error stops the listing and comes back as it is.
	stop := errors.New("enough")
	var seen []string
	err := s.List(t.Context(), "", func(key string) error {
		seen = append(seen, key)
		if len(seen) == 2 {
			return stop
		}
		return nil
	})
	if err != stop { //nolint:errorlint // List returns the callback's error itself
		t.Errorf("list stopped by the callback: error %v, want %v", err, stop)
	}
	if !slices.Equal(seen, all[:2]) {
		t.Errorf("list stopped after %q, want %q", seen, all[:2])
	}

	for _, bad := range []string{"../", "/abs", "a/../../x"} {
		err := s.List(t.Context(), bad, func(string) error { return nil })
		if err == nil || !strings.Contains(err.Error(), "invalid prefix") {
			t.Errorf("list %q: %v, want invalid prefix", bad, err)
		}
	}
}

func TestFileList(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir)
	all := putListFixture(t, s)
	// The temporary file of a Put cut short by a crash is not a key.
	tmp := filepath.Join(dir, "github", "2024", "03", "05", ".1709683140000000000-0123.json.42.tmp")
	if err := os.WriteFile(tmp, []byte("[{"), 0o644); err != nil {
		t.Fatal(err)
	}
	testList(t, s, all)
}

func TestS3List(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	s := openS3(t, srv, "raw/v1")
	// An object beside the store's prefix, which shares its first characters.
	if _, err := srv.Client().PutObject(t.Context(), &s3.PutObjectInput{
		Bucket: aws.String(srv.Bucket),
		Key:    aws.String("raw/v10/github/x.json"),
		Body:   strings.NewReader("x"),
	}); err != nil {
		t.Fatalf("put beside the prefix: %v", err)
	}
	testList(t, s, putListFixture(t, s))
}

func TestS3ListPages(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	s := openS3(t, srv, "p")
	// More keys than one ListObjectsV2 page (1000) holds.
	const n = 1100
	want := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range want {
		want[i] = rawstore.Key("src", time.Unix(1_700_000_000, int64(i)), []byte("x"))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = s.Put(t.Context(), want[i], []byte("x"))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("put: %v", err)
	}
	slices.Sort(want)
	if got := listAll(t, s, "src/"); !slices.Equal(got, want) {
		t.Fatalf("list src/: %d keys, want %d in order", len(got), len(want))
	}
}
