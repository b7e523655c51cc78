package treecheck

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestTrackedFilesAreOurOwn lists every file git tracks (the index, so a
// file staged but not committed counts too) and fails naming each one
// that is an ELF binary, over MaxFileBytes, a licence or notice file
// below the repository's root, or inside a vendor/ or third_party/
// directory.
func TestTrackedFilesAreOurOwn(t *testing.T) {
	root := repoRoot(t)
	files := trackedFiles(t, root)
	if len(files) < 10 {
		t.Fatalf("git ls-files listed %d files in %s: not the repository", len(files), root)
	}
	for _, name := range files {
		if problem := checkFile(t, root, name); problem != "" {
			t.Errorf("%s: %s", name, problem)
		}
	}
}

// TestCheckFileFindsEachKind runs the check on a file of each kind it
// refuses, and on an ordinary source file, which it must let through.
func TestCheckFileFindsEachKind(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 64)
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	write("tool", head) // the first bytes of this very test binary
	write("big.json", bytes.Repeat([]byte("x"), MaxFileBytes+1))
	write("internal/x/LICENSE", []byte("MIT"))
	write("internal/x/NOTICE.txt", []byte("notice"))
	write("third_party/lib/a.c", []byte("int a;"))
	write("internal/vendor/b.go", []byte("package b"))
	write("internal/ok/ok.go", []byte("package ok"))
	write("LICENSE", []byte("the project's own"))
	for name, want := range map[string]string{
		"tool":                  "ELF",
		"big.json":              "bytes",
		"internal/x/LICENSE":    "licence",
		"internal/x/NOTICE.txt": "licence",
		"third_party/lib/a.c":   "third_party",
		"internal/vendor/b.go":  "vendor",
		"internal/ok/ok.go":     "",
		"LICENSE":               "",
	} {
		got := checkFile(t, dir, name)
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("checkFile(%s) = %q, want a problem naming %q", name, got, want)
		}
	}
}

// checkFile returns what is wrong with the tracked file name (slash
// separated, relative to root), or "".
func checkFile(t *testing.T, root, name string) string {
	t.Helper()
	for _, dir := range strings.Split(path.Dir(name), "/") {
		if dir == "vendor" || dir == "third_party" {
			return "inside a " + dir + "/ directory: third-party code comes in as a module or package, not copied"
		}
	}
	base := strings.ToUpper(path.Base(name))
	if path.Dir(name) != "." {
		for _, prefix := range []string{"LICENSE", "LICENCE", "COPYING", "NOTICE"} {
			if strings.HasPrefix(base, prefix) {
				return "a licence or notice file below the root: copied third-party source"
			}
		}
	}
	p := filepath.Join(root, filepath.FromSlash(name))
	info, err := os.Lstat(p)
	if err != nil {
		if os.IsNotExist(err) {
			return "" // deleted in the work tree, not yet in the index
		}
		t.Fatal(err)
	}
	if !info.Mode().IsRegular() {
		return ""
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}()
	magic := make([]byte, 4)
	if n, err := io.ReadFull(f, magic); err != nil && n < len(magic) {
		return "" // shorter than the magic number: no ELF file
	}
	if bytes.Equal(magic, []byte("\x7fELF")) {
		return "an ELF binary: build it, never track it (ignore it in .gitignore)"
	}
	if info.Size() > MaxFileBytes {
		return strconv.FormatInt(info.Size(), 10) + " bytes, over the 2 MB a tracked file may have: a built or generated artefact"
	}
	return ""
}

// repoRoot returns the top of the git work tree holding this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse --show-toplevel: %v (the check needs the git checkout it runs in)", err)
	}
	return strings.TrimSpace(string(out))
}

// trackedFiles returns the files in git's index under root.
func trackedFiles(t *testing.T, root string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	return files
}
