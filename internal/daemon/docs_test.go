package daemon

import (
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// repoRoot is the repository's root, relative to this package.
const repoRoot = "../.."

// frontDocs returns the README, PROTOCOL.md and every page of docs/,
// relative to the repository root.
func frontDocs(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md", "PROTOCOL.md"}
	for _, d := range docs {
		out = append(out, filepath.ToSlash(strings.TrimPrefix(d, repoRoot+string(filepath.Separator))))
	}
	if len(out) < 10 {
		t.Fatalf("found only %v: is docs/ there?", out)
	}
	return out
}

// linkedDocs returns the Markdown files whose links TestDocsLinksResolve
// checks: frontDocs, and the READMEs beside the code they describe.
func linkedDocs(t *testing.T) []string {
	t.Helper()
	return append(frontDocs(t), "deploy/README.md", "clients/python/README.md")
}

var (
	// mdLink matches an inline Markdown link or image, [text](target).
	mdLink = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	// codeSpan matches an inline code span, whose text is not a link.
	codeSpan = regexp.MustCompile("`[^`\n]*`")
	// htmlAnchor matches an explicit anchor, <a id="x"> or <a name="x">.
	htmlAnchor = regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)
	// headingLine matches an ATX heading.
	headingLine = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	// notInSlug is what GitHub drops from a heading's text to make its anchor.
	notInSlug = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
	// urlScheme starts a link that leaves the repository: http:, mailto:, ...
	urlScheme = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`)
)

// prose returns the lines of a Markdown document outside its fenced code
// blocks, with their numbers: what is rendered as text.
func prose(doc string) map[int]string {
	out := map[int]string{}
	fence := ""
	for i, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
		case strings.HasPrefix(trimmed, "```"), strings.HasPrefix(trimmed, "~~~"):
			fence = trimmed[:3]
		default:
			out[i+1] = line
		}
	}
	return out
}

// anchors returns the anchors GitHub gives a Markdown document: one per
// heading (its text lower-cased, without inline formatting and
// punctuation, spaces made hyphens; a repeated one numbered -1, -2, ...)
// and its explicit <a id> or <a name> anchors.
func anchors(doc string) map[string]bool {
	out := map[string]bool{}
	lines := prose(doc)
	for _, n := range slices.Sorted(maps.Keys(lines)) {
		line := lines[n]
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := headingLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		text := mdLink.ReplaceAllStringFunc(m[1], func(l string) string { return l[1:strings.Index(l, "](")] })
		slug := notInSlug.ReplaceAllString(strings.ToLower(text), "")
		slug = strings.ReplaceAll(slug, " ", "-")
		unique := slug
		for i := 1; out[unique]; i++ {
			unique = slug + "-" + strconv.Itoa(i)
		}
		out[unique] = true
	}
	return out
}

// TestDocsLinksResolve checks every relative link of the README,
// PROTOCOL.md and docs/: the file it names exists, and so does the
// heading or anchor after its #, as GitHub names headings.
func TestDocsLinksResolve(t *testing.T) {
	docs := linkedDocs(t)
	text := map[string]string{} // path from the root -> contents
	read := func(p string) (string, bool) {
		if s, ok := text[p]; ok {
			return s, true
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, p))
		if err != nil {
			return "", false
		}
		text[p] = string(b)
		return string(b), true
	}
	links := 0
	for _, doc := range docs {
		s, ok := read(doc)
		if !ok {
			t.Errorf("%s: cannot read it", doc)
			continue
		}
		lines := prose(s)
		for _, n := range slices.Sorted(maps.Keys(lines)) {
			line := codeSpan.ReplaceAllStringFunc(lines[n], func(c string) string {
				return strings.Repeat("x", len(c)) // keeps [`text`](target) a link
			})
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if urlScheme.MatchString(target) {
					continue
				}
				links++
				file, anchor, _ := strings.Cut(target, "#")
				at := doc + ":" + strconv.Itoa(n) + ": " + target
				p := doc
				if file != "" {
					p = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(doc), file)))
					if strings.HasPrefix(p, "../") {
						t.Errorf("%s: leaves the repository", at)
						continue
					}
					if _, err := os.Stat(filepath.Join(repoRoot, p)); err != nil {
						t.Errorf("%s: %s does not exist", at, p)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(p, ".md") {
					t.Errorf("%s: an anchor into %s, which has no headings", at, p)
					continue
				}
				body, ok := read(p)
				if !ok {
					t.Errorf("%s: cannot read %s", at, p)
					continue
				}
				if !anchors(body)[anchor] {
					t.Errorf("%s: %s has no heading or anchor #%s", at, p, anchor)
				}
			}
		}
	}
	if links < 50 {
		t.Fatalf("found only %d relative links: is the link pattern broken?", links)
	}
}

// TestDocsAnchorsAsGitHub pins anchors against GitHub's own, taken from
// its rendering of these headings.
func TestDocsAnchorsAsGitHub(t *testing.T) {
	doc := "# ingestor\n" +
		"## Months in minutes: `ingestor-bench -mode soak`\n" +
		"```\n# not a heading\n```\n" +
		"## Devices over WebSocket (`kind = \"ws_ingress\"`)\n" +
		"### `[rate_limiters.NAME]`\n" +
		"## Status\n## Status\n" +
		"## A [link](other.md) in a heading\n" +
		"<a id=\"kept\"></a>\n"
	got := anchors(doc)
	want := []string{"ingestor", "months-in-minutes-ingestor-bench--mode-soak", "devices-over-websocket-kind--ws_ingress",
		"rate_limitersname", "status", "status-1", "a-link-in-a-heading", "kept"}
	for _, a := range want {
		if !got[a] {
			t.Errorf("no anchor %q in %v", a, got)
		}
	}
	if got["not-a-heading"] || len(got) != len(want) {
		t.Errorf("anchors %v, want exactly %v", got, want)
	}
}

// TestDocsNameRealTests checks that every test, benchmark and fuzz target
// the README, PROTOCOL.md and docs/ name (as `TestSomething`) exists in
// the repository, so that a guarantee never points at a test that was renamed
// or removed.
func TestDocsNameRealTests(t *testing.T) {
	declared := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)\w+)\(`)
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != repoRoot && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") ||
			d.Name() == "testdata" || d.Name() == "bin" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			declared[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Z0-9]\\w*)`")
	count := 0
	for _, doc := range frontDocs(t) {
		b, err := os.ReadFile(filepath.Join(repoRoot, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range named.FindAllStringSubmatch(string(b), -1) {
			count++
			if !declared[m[1]] {
				t.Errorf("%s names %s, which no _test.go file declares", doc, m[1])
			}
		}
	}
	if count < 50 {
		t.Fatalf("found only %d test names in the docs: is the pattern broken?", count)
	}
}
