package daemon

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docRef is a mention of a page of docs/ in code or config, with the
// quoted heading that may follow it: docs/performance.md, "Memory".
var docRef = regexp.MustCompile(`docs/([a-z0-9-]+\.md)(?:,\s*(?://\s*|#\s*)?"([^"]+)")?`)

// readmeSection is a mention of a section of the README by name, which
// the move of the README's sections to docs/ left stale in places.
var readmeSection = regexp.MustCompile(`README(?:'s)?,? "([^"]+)"`)

// TestCodeNamesDocsThatExist reads every source, build and deploy file
// for the pages of docs/ it sends its reader to: each page exists, and so
// does the heading named after it. A README section named by its title
// must be a heading of README.md. Comments, help texts and error messages
// then follow the docs when they move.
func TestCodeNamesDocsThatExist(t *testing.T) {
	headings := map[string][]string{}
	headingsOf := func(p string) []string {
		if h, ok := headings[p]; ok {
			return h
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, p))
		if err != nil {
			return nil
		}
		var hs []string
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(line, "#") {
				hs = append(hs, strings.ToLower(strings.ReplaceAll(strings.TrimLeft(line, "# "), "`", "")))
			}
		}
		headings[p] = hs
		return hs
	}
	hasHeading := func(p, title string) bool {
		title = strings.ToLower(title)
		for _, h := range headingsOf(p) {
			if strings.HasPrefix(h, title) {
				return true
			}
		}
		return false
	}
	refs := 0
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", ".tools", "bin", "docs":
				return filepath.SkipDir
			}
			return nil
		}
		if !codeFile(d.Name()) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, path)
		for n, line := range strings.Split(string(b), "\n") {
			at := rel + ":" + strconv.Itoa(n+1)
			for _, m := range docRef.FindAllStringSubmatch(line, -1) {
				refs++
				page := "docs/" + m[1]
				if headingsOf(page) == nil {
					t.Errorf("%s: names %s, which does not exist", at, page)
				} else if m[2] != "" && !hasHeading(page, m[2]) {
					t.Errorf("%s: names the section %q of %s, which has no such heading", at, m[2], page)
				}
			}
			for _, m := range readmeSection.FindAllStringSubmatch(line, -1) {
				if !hasHeading("README.md", m[1]) {
					t.Errorf("%s: names README's section %q, which it no longer has: name the page of docs/ instead", at, m[1])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if refs < 10 {
		t.Fatalf("found only %d mentions of docs/ pages: is the pattern broken?", refs)
	}
}

// codeFile reports whether a file named name is source, build or deploy
// text that may send its reader to the docs.
func codeFile(name string) bool {
	switch filepath.Ext(name) {
	case ".go", ".py", ".sh", ".toml", ".yaml", ".yml", ".service", ".html", ".js":
		return true
	}
	return name == "Makefile" || name == "Dockerfile"
}
