package durable_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/durable"
)

// names lists the entries of dir.
func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestWriteFileCreatesDirectoriesAndReplaces(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	p := filepath.Join(dir, "f.json")
	for _, body := range []string{`[1]`, `[2,3]`} {
		if err := durable.WriteFile(p, []byte(body)); err != nil {
			t.Fatalf("write %s: %v", body, err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != body {
			t.Fatalf("read back %q (%v), want %q", got, err, body)
		}
		if got := names(t, dir); !slices.Equal(got, []string{"f.json"}) {
			t.Fatalf("directory holds %q, want only f.json: a temporary file was left", got)
		}
	}
}

// TestWriteFileFailureLeavesNoTempFile makes the rename fail (the
// destination is a directory that is not empty): the temporary file, which
// was written next to the destination, is removed.
func TestWriteFileFailureLeavesNoTempFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "taken")
	if err := os.MkdirAll(filepath.Join(p, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := durable.WriteFile(p, []byte("body")); err == nil {
		t.Fatal("writing over a non-empty directory succeeded")
	}
	if got := names(t, dir); !slices.Equal(got, []string{"taken"}) {
		t.Fatalf("directory holds %q after a failed write, want only taken", got)
	}
}

func TestMkdirAllOverAFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := durable.MkdirAll(filepath.Join(p, "sub"), 0o755)
	if err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("MkdirAll under a file: %v, want a not-a-directory error", err)
	}
}

func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".f.json.123456.tmp": true,
		"f.json":             false,
		".hidden":            false,
		"f.tmp":              false,
		"f.json.spill.json":  false,
	} {
		if got := durable.IsTemp(name); got != want {
			t.Errorf("IsTemp(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestWriteAtWritesEveryPart writes parts at an offset inside a file and
// past its end, and syncs it: the file holds them one after the other,
// the bytes around them unchanged.
func TestWriteAtWritesEveryPart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	if err := os.WriteFile(path, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := durable.WriteAt(f, [][]byte{[]byte("ab"), nil, []byte("cd")}, 3); err != nil {
		t.Fatal(err)
	}
	if err := durable.WriteAt(f, [][]byte{[]byte("head\n"), bytes.Repeat([]byte("x"), 70000), []byte("\n")}, 12); err != nil {
		t.Fatal(err)
	}
	if err := durable.WriteAt(f, [][]byte{[]byte("one")}, 70018); err != nil {
		t.Fatal(err)
	}
	if err := durable.Datasync(f); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "012abcd789\x00\x00head\n" + strings.Repeat("x", 70000) + "\n" + "one"
	if string(got) != want {
		t.Errorf("file holds %d bytes %.40q..., want %d bytes %.40q...", len(got), got, len(want), want)
	}
	f.Close()
	if err := durable.Datasync(f); err == nil {
		t.Error("Datasync of a closed file succeeded")
	}
}
