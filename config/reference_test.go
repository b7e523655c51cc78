package config

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/edge/edgeconfig"
	"github.com/ingestorhq/ingestor/sources"
)

// referenceDoc is the configuration reference, relative to this package.
const referenceDoc = "../docs/configuration.md"

// referenceTables maps each table of the reference (the name in its
// "<!-- keys: NAME -->" marker) to the structs whose TOML keys it lists:
// the daemon's sections (topTables, as the JSON Schema has them), every
// source kind's Spec, and the edge forwarder's [edge].
func referenceTables() map[string][]reflect.Type {
	tables := map[string][]reflect.Type{
		"kind.webhook.secrets": {reflect.TypeFor[sources.WebhookSecret]()},
		"kind.oauth2":          {reflect.TypeFor[sources.OAuth2Spec]()},
		"edge":                 {reflect.TypeFor[edgeDurations](), reflect.TypeFor[edgeconfig.Config]()},
	}
	for _, t := range topTables {
		tables[t.name] = []reflect.Type{reflect.TypeOf(t.keys())}
	}
	for _, kind := range sources.Kinds() {
		spec, _ := sources.NewSpec(kind)
		tables["kind."+kind] = []reflect.Type{reflect.TypeOf(spec).Elem()}
	}
	return tables
}

// TestConfigurationReferenceMatchesCode keeps docs/configuration.md's
// reference in step with the decoder: every key of every table the
// decoder takes is a row of the reference, and every row is a key the
// decoder takes. A struct with TOML keys that no table of the reference
// covers (a new section, say) fails it too.
func TestConfigurationReferenceMatchesCode(t *testing.T) {
	doc, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	documented, problems := referenceKeys(string(doc))
	for _, p := range problems {
		t.Errorf("%s: %s", referenceDoc, p)
	}
	tables := referenceTables()
	covered := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(tables)) {
		want := map[string]string{} // key -> the struct that has it
		for _, rt := range tables[name] {
			covered[typeName(rt)] = true
			for _, f := range reflect.VisibleFields(rt) {
				if f.Anonymous {
					covered[typeName(f.Type)] = true
				}
				if key := tagName(f); key != "" {
					want[key] = typeName(rt)
				}
			}
		}
		got, ok := documented[name]
		if !ok {
			t.Errorf("%s has no table <!-- keys: %s --> for the keys of %v", referenceDoc, name, tables[name])
			continue
		}
		for _, key := range slices.Sorted(maps.Keys(want)) {
			if !got[key] {
				t.Errorf("%s: key %s of %s (%s) is not in the reference", referenceDoc, key, name, want[key])
			}
		}
		for _, key := range slices.Sorted(maps.Keys(got)) {
			if _, ok := want[key]; !ok {
				t.Errorf("%s: the reference lists %s in %s, which the decoder does not take", referenceDoc, key, name)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(documented)) {
		if _, ok := tables[name]; !ok {
			t.Errorf("%s: table <!-- keys: %s --> matches no section or kind of the decoder", referenceDoc, name)
		}
	}
	for _, name := range tomlStructs(t, ".", "../sources", "../internal/edge/edgeconfig") {
		if !covered[name] {
			t.Errorf("%s has TOML keys that no table of %s lists: add its table there and to referenceTables", name, referenceDoc)
		}
	}
}

// referenceKeys returns the keys of each table of the reference: the
// first cell of each row of the Markdown table after a
// "<!-- keys: NAME -->" marker. It also reports rows that are not a key
// with its type, default and description, and keys listed twice.
func referenceKeys(doc string) (map[string]map[string]bool, []string) {
	marker := regexp.MustCompile(`^<!-- keys: ([a-z0-9_.]+) -->$`)
	row := regexp.MustCompile("^\\| `([a-z0-9_]+)` \\|")
	tables := map[string]map[string]bool{}
	var problems []string
	table := "" // the table being read, "" between tables
	header := 0 // header and separator rows still to skip
	for i, line := range strings.Split(doc, "\n") {
		at := "line " + strconv.Itoa(i+1)
		if m := marker.FindStringSubmatch(line); m != nil {
			if tables[m[1]] != nil {
				problems = append(problems, at+": table "+m[1]+" appears twice")
			}
			table, header = m[1], 2
			tables[table] = map[string]bool{}
			continue
		}
		switch {
		case table == "":
		case !strings.HasPrefix(line, "|"):
			if header == 0 {
				table = "" // the end of the table
			}
		case header > 0:
			header--
		default:
			cells := strings.Split(strings.Trim(line, "|"), " | ")
			m := row.FindStringSubmatch(line)
			if m == nil || len(cells) != 4 || slices.ContainsFunc(cells, func(c string) bool { return strings.TrimSpace(c) == "" }) {
				problems = append(problems, at+": a row of "+table+" must be | `key` | type | default | description |")
				continue
			}
			if tables[table][m[1]] {
				problems = append(problems, at+": "+table+" lists "+m[1]+" twice")
			}
			tables[table][m[1]] = true
		}
	}
	return tables, problems
}

// tomlStructs returns the struct types declared in the non-test Go files
// of dirs that have a field with a toml tag, as "package.Type".
func tomlStructs(t *testing.T, dirs ...string) []string {
	t.Helper()
	var out []string
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				spec, ok := n.(*ast.TypeSpec)
				if !ok {
					return true
				}
				st, ok := spec.Type.(*ast.StructType)
				if ok && hasTOMLTag(st) {
					out = append(out, f.Name.Name+"."+spec.Name.Name)
				}
				return true
			})
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %v with TOML keys: the scan is broken", out)
	}
	return out
}

// hasTOMLTag reports whether a field of st has a toml tag naming a key.
func hasTOMLTag(st *ast.StructType) bool {
	for _, f := range st.Fields.List {
		if f.Tag == nil {
			continue
		}
		tag, err := strconv.Unquote(f.Tag.Value)
		if err != nil {
			continue
		}
		if name, _, _ := strings.Cut(reflect.StructTag(tag).Get("toml"), ","); name != "" && name != "-" {
			return true
		}
	}
	return false
}

// typeName names rt as tomlStructs does: "package.Type".
func typeName(rt reflect.Type) string {
	return path.Base(rt.PkgPath()) + "." + rt.Name()
}

// TestDocsTOMLBlocksDecode decodes every TOML block of README.md and
// docs/*.md as the daemon's file (or, for an [edge] table, as the edge
// forwarder's), with every ${NAME} set: a misspelt key, a value of the
// wrong type or an invalid setting fails it. The blocks name files of a
// production host (certificates, token files), so a file that does not
// exist here is the one problem let through.
func TestDocsTOMLBlocksDecode(t *testing.T) {
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	env := func(string) (string, bool) { return "an-environment-value-of-32-bytes", true }
	block := regexp.MustCompile("(?s)\n```toml\n(.*?)\n```\n")
	n := 0
	for _, doc := range append(docs, "../README.md") {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range block.FindAllStringSubmatch(string(text), -1) {
			n++
			name := filepath.Base(doc) + " block " + strconv.Itoa(n)
			parse := func() error { _, err := ParseWithEnv(name, []byte(m[1]), env); return err }
			if strings.HasPrefix(strings.TrimSpace(m[1]), "[edge]") {
				parse = func() error { _, err := ParseEdgeWithEnv(name, []byte(m[1]), env); return err }
			}
			var es Errors
			if err := parse(); errors.As(err, &es) {
				for _, e := range es {
					if !strings.Contains(e.Msg, "no such file or directory") {
						t.Errorf("%s:\n%s\n%v", doc, m[1], e)
					}
				}
			} else if err != nil {
				t.Errorf("%s:\n%s\n%v", doc, m[1], err)
			}
		}
	}
	if n < 10 {
		t.Fatalf("found only %d TOML blocks in README.md and docs/", n)
	}
}
