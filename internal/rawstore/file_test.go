package rawstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/rawstore"
)

func openFile(t *testing.T, dir string) rawstore.Store {
	t.Helper()
	s, err := rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + dir})
	if err != nil {
		t.Fatalf("open file://%s: %v", dir, err)
	}
	return s
}

// files lists every regular file under dir, relative and slash-separated.
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		out = append(out, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return out
}

func TestFilePutGet(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "raw", "nested")
	s := openFile(t, dir)
	if got, want := s.String(), "file://"+dir; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	body := []byte(`[{"id":1},{"id":2}]`)
	key := rawstore.Key("github", time.Date(2024, 3, 5, 10, 0, 0, 0, time.UTC), body)
	if err := s.Put(t.Context(), key, body); err != nil {
		t.Fatalf("put: %v", err)
	}
	got, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("get = %q, want %q", got, body)
	}
	onDisk, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(key)))
	if err != nil || !bytes.Equal(onDisk, body) {
		t.Fatalf("file at key path = %q, %v", onDisk, err)
	}
}

func TestFileRelativeDir(t *testing.T) {
	wd := t.TempDir()
	t.Chdir(wd)
	s := openFile(t, "./data/raw")
	abs := filepath.Join(wd, "data", "raw")
	if got := s.String(); got != "file://"+abs {
		t.Errorf("String() = %q, want file://%s", got, abs)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		t.Fatalf("Open did not create %s: %v", abs, err)
	}
	if err := s.Put(t.Context(), "k.json", []byte("{}")); err != nil {
		t.Fatalf("put: %v", err)
	}
	// The store keeps its absolute directory when the process changes
	// directory afterwards.
	t.Chdir(t.TempDir())
	if got, err := s.Get(t.Context(), "k.json"); err != nil || string(got) != "{}" {
		t.Fatalf("get after chdir = %q, %v", got, err)
	}
}

func TestFilePutSameKeyOverwrites(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir)
	body := []byte(`{"n":1}`)
	key := rawstore.Key("src", time.Unix(1700000000, 5), body)
	for i := range 3 {
		if err := s.Put(t.Context(), key, body); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if got := files(t, dir); !slices.Equal(got, []string{key}) {
		t.Fatalf("files after three puts = %q, want just %q", got, key)
	}
	if got, err := s.Get(t.Context(), key); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("get = %q, %v", got, err)
	}

	// Put replaces whatever the key held (a key without Key's hash: Get
	// checks the bytes of one with it against it).
	for _, b := range []string{"first", "other"} {
		if err := s.Put(t.Context(), "src/plain.json", []byte(b)); err != nil {
			t.Fatalf("put %s: %v", b, err)
		}
	}
	if got, err := s.Get(t.Context(), "src/plain.json"); err != nil || string(got) != "other" {
		t.Fatalf("get after overwrite = %q, %v", got, err)
	}
}

func TestFileLeavesNoTempFiles(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir)
	var want []string
	for i := range 20 {
		body := fmt.Appendf(nil, `{"i":%d}`, i)
		key := rawstore.Key(fmt.Sprintf("s%d", i%3), time.Unix(1700000000+int64(i)*86400, 0), body)
		if err := s.Put(t.Context(), key, body); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
		want = append(want, key)
	}
	got := files(t, dir)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("files = %q\nwant %q", got, want)
	}
}

func TestFileRejectsEscapingKeys(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "store")
	s := openFile(t, dir)
	for _, key := range []string{
		"",
		"/etc/passwd",
		"../outside.json",
		"a/../../outside.json",
		"a/..",
		"..",
		"a/b/..hidden",
		"./a.json",
		"a//b.json",
		"a/",
	} {
		if err := s.Put(t.Context(), key, []byte("x")); err == nil {
			t.Errorf("put %q succeeded", key)
		} else if !strings.Contains(err.Error(), "invalid key") || !strings.Contains(err.Error(), s.String()) {
			t.Errorf("put %q: error %q does not name the store and the reason", key, err)
		}
		if _, err := s.Get(t.Context(), key); err == nil || !strings.Contains(err.Error(), "invalid key") {
			t.Errorf("get %q: error = %v, want invalid key", key, err)
		}
	}
	if got := files(t, root); len(got) != 0 {
		t.Fatalf("rejected puts wrote files: %q", got)
	}
}

func TestFileGetMissing(t *testing.T) {
	s := openFile(t, t.TempDir())
	_, err := s.Get(t.Context(), "no/such.json")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("get missing: %v, want fs.ErrNotExist", err)
	}
	if !strings.Contains(err.Error(), `"no/such.json"`) {
		t.Errorf("error %q does not name the key", err)
	}
}

func TestFilePutCanceled(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.Put(ctx, "k.json", []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("put with canceled ctx: %v", err)
	}
	if got := files(t, dir); len(got) != 0 {
		t.Fatalf("canceled put wrote %q", got)
	}
}

func TestFileOpenOnRegularFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := rawstore.Open(t.Context(), rawstore.Options{URL: "file://" + p})
	if err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("open on a file: %v", err)
	}
	// A nil *fileStore in a non-nil Store made the daemon's cleanup of a
	// failed start panic (TestForeignDataDirReadOnlyRefusesToStart).
	if s != nil {
		t.Fatalf("a failed open returned the store %#v, want nil", s)
	}
}

func TestOpenRejectsBadURLs(t *testing.T) {
	for _, u := range []string{"", "/var/lib/raw", "file://", "gs://bucket/p", "s3://", "s3:///prefix", "s3://b/p?x=1"} {
		if _, err := rawstore.Open(t.Context(), rawstore.Options{URL: u}); err == nil {
			t.Errorf("Open(%q) succeeded", u)
		} else if !strings.HasPrefix(err.Error(), "raw store ") {
			t.Errorf("Open(%q): error %q does not name the raw store", u, err)
		}
	}
}

var keyRE = regexp.MustCompile(`^([^/]+)/(\d{4})/(\d{2})/(\d{2})/(\d+)-([0-9a-f]{32})\.json$`)

func TestKey(t *testing.T) {
	body := []byte(`{"id":42}`)
	// 23:30 on 31 Dec in UTC-5 is already 1 Jan in UTC.
	at := time.Date(2023, 12, 31, 23, 30, 0, 123, time.FixedZone("EST", -5*3600))
	k := rawstore.Key("github", at, body)

	m := keyRE.FindStringSubmatch(k)
	if m == nil {
		t.Fatalf("key %q does not match %s", k, keyRE)
	}
	if got := m[1] + "/" + m[2] + "/" + m[3] + "/" + m[4]; got != "github/2024/01/01" {
		t.Errorf("key date part = %q, want github/2024/01/01 (UTC)", got)
	}
	if want := fmt.Sprint(at.UnixNano()); m[5] != want {
		t.Errorf("key nanos = %s, want %s", m[5], want)
	}
	if want := "17b4db064e17f4878e391177e6ca623b"; m[6] != want {
		t.Errorf("key hash = %s, want %s (first 32 hex of sha256)", m[6], want)
	}

	if again := rawstore.Key("github", at.UTC(), slices.Clone(body)); again != k {
		t.Errorf("same payload and instant, different key: %q vs %q", again, k)
	}
	for name, other := range map[string]string{
		"body":    rawstore.Key("github", at, []byte(`{"id":43}`)),
		"instant": rawstore.Key("github", at.Add(time.Nanosecond), body),
		"source":  rawstore.Key("gitlab", at, body),
	} {
		if other == k {
			t.Errorf("a different %s gives the same key %q", name, k)
		}
	}
}

func ExampleKey() {
	body := []byte(`[{"id":1}]`)
	fmt.Println(rawstore.Key("github", time.Date(2024, 3, 5, 10, 0, 0, 0, time.UTC), body))
	// Output: github/2024/03/05/1709632800000000000-bb41eeeedb7789a3482cc74a1ac8d84e.json
}
