package config

import (
	"testing"

	"github.com/BurntSushi/toml"
)

func TestLineIndex(t *testing.T) {
	const src = `# comment with [fake.header] and fake = "x"
top = 1
[a]
s = """
not_a_key = 1
[not.a.header] \"""
"""
lit = '''
x = 2 '''
arr = [
  1, # comment ]
  "]",
  { inner = 1 },
]
date = 1979-05-27 07:32:00Z
after_date = true
"quoted key" = 1
dotted.key . parts = 2
inline = { A = "x}", B = { C = 1 } }
multi = {
  M = "y",
}
[source."my feed"]
kind = "demo"
[ source . "my feed" . headers ]
Authorization = "x"
[[arr_tables]]
k = 1
`
	var v map[string]any
	if _, err := toml.Decode(src, &v); err != nil {
		t.Fatalf("test input is not valid TOML: %v", err)
	}
	ix := indexLines(src)
	for _, tc := range []struct {
		path []string
		line int
	}{
		{[]string{"top"}, 2},
		{[]string{"a"}, 3},
		{[]string{"a", "s"}, 4},
		{[]string{"a", "lit"}, 8},
		{[]string{"a", "arr"}, 10},
		{[]string{"a", "date"}, 15},
		{[]string{"a", "after_date"}, 16},
		{[]string{"a", "quoted key"}, 17},
		{[]string{"a", "dotted"}, 18},
		{[]string{"a", "dotted", "key", "parts"}, 18},
		{[]string{"a", "inline"}, 19},
		{[]string{"a", "inline", "A"}, 19},
		{[]string{"a", "inline", "B", "C"}, 19},
		{[]string{"a", "multi"}, 20},
		{[]string{"a", "multi", "M"}, 21},
		{[]string{"source"}, 23},
		{[]string{"source", "my feed"}, 23},
		{[]string{"source", "my feed", "kind"}, 24},
		{[]string{"source", "my feed", "headers"}, 25},
		{[]string{"source", "my feed", "headers", "Authorization"}, 26},
		{[]string{"arr_tables", "k"}, 28},
		// Keys of an inline table inside an array are recorded under the array.
		{[]string{"a", "arr", "inner"}, 13},
		// Absent keys fall back to their nearest parent.
		{[]string{"a", "not_a_key"}, 3},
		{[]string{"source", "my feed", "poll_url"}, 23},
		{[]string{"not", "a", "header"}, 0},
		{[]string{"fake"}, 0},
	} {
		if got := ix.lookup(tc.path); got != tc.line {
			t.Errorf("lookup(%q) = %d, want %d", tc.path, got, tc.line)
		}
	}
}

// TestLineIndexTerminates feeds the scanner text that is not valid TOML; it
// must still return.
func TestLineIndexTerminates(t *testing.T) {
	for _, src := range []string{"", "[", "[[", "a = [", "a = {", `a = """`, "a = '", "= = =", "\"", "x.\n.y", "a = 1979-05-27 "} {
		indexLines(src)
	}
}

// FuzzIndexLines checks that the scanner returns, without panicking, on any
// input, and that on valid TOML every key the toml package reports is
// indexed at its exact path.
func FuzzIndexLines(f *testing.F) {
	f.Add("[a]\nb = 1\n")
	f.Add("x = \"\"\"\na = 1\n\"\"\"\n[t]\ny = { z = [1, {w = 2}] }\n")
	f.Add("'q k' . \"r\" = '''\n'''\nd = 1979-05-27 07:32:00Z\n")
	f.Fuzz(func(t *testing.T, src string) {
		ix := indexLines(src)
		var v map[string]any
		md, err := toml.Decode(src, &v)
		if err != nil {
			return
		}
		for _, k := range md.Keys() {
			if _, ok := ix[pathKey(k)]; !ok {
				t.Errorf("key %q not indexed in %q", k, src)
			}
		}
	})
}
