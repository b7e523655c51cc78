package sources

import (
	"os"
	"strings"
	"testing"
)

// TestFileLayout checks the layout the package documentation describes:
// every file belongs to a kind (KIND.go or KIND_PART.go, the kind's name
// without underscores) or is one of the shared files, and every kind has
// its KIND.go.
func TestFileLayout(t *testing.T) {
	shared := map[string]bool{"source": true, "cursor": true, "push": true, "ratelimit": true, "tls": true, "oauth2": true, "stream": true}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	prefixes := make(map[string]bool)
	for _, k := range Kinds() {
		prefixes[strings.ReplaceAll(k, "_", "")] = false
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".go")
		if !ok {
			continue
		}
		name = strings.TrimSuffix(name, "_test")
		base, _, _ := strings.Cut(name, "_")
		if _, isKind := prefixes[base]; isKind {
			prefixes[base] = prefixes[base] || base == name
			continue
		}
		if !shared[name] {
			t.Errorf("%s belongs to no kind (%v) and is not a shared file: name it KIND_PART.go or list it in the package documentation", e.Name(), Kinds())
		}
	}
	for p, hasMain := range prefixes {
		if !hasMain {
			t.Errorf("kind file %s.go is missing", p)
		}
	}
}
