package ingest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOnlyTheSeamKnowsTheRawStoreLayout keeps the raw store's layout
// behind this package: outside internal/ingest and internal/rawstore no Go
// file (tests included) names rawstore.PageAppender, calls rawstore.Key or
// declares a disk-guard interface (one with Failed(error) bool), so that
// the Publisher, the push inbox and replay, and whatever comes next, make
// batches durable through Ingest alone.
func TestOnlyTheSeamKnowsTheRawStoreLayout(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{"internal/ingest", "internal/rawstore"}
	var found []string
	scanned := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(path, root+string(filepath.Separator)))
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "bin" {
				return filepath.SkipDir
			}
			for _, a := range allowed {
				if rel == a {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		scanned++
		found = append(found, seamViolations(t, path, rel)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scanned < 100 {
		t.Fatalf("scanned %d Go files under %s: the walk missed the tree", scanned, root)
	}
	for _, f := range found {
		t.Error(f)
	}
}

// seamViolations returns where the file at path, named rel, reaches past
// the ingest seam.
func seamViolations(t *testing.T, path, rel string) []string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	rawName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"github.com/ingestorhq/ingestor/internal/rawstore"` {
			rawName = "rawstore"
			if imp.Name != nil {
				rawName = imp.Name.Name
			}
		}
	}
	var out []string
	at := func(n ast.Node, what string) {
		p := fset.Position(n.Pos())
		out = append(out, rel+":"+strconv.Itoa(p.Line)+": "+what)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok && rawName != "" && id.Name == rawName &&
				(n.Sel.Name == "PageAppender" || n.Sel.Name == "Key") {
				at(n, "uses rawstore."+n.Sel.Name+": write payloads through internal/ingest (or ingesttest in a test)")
			}
		case *ast.InterfaceType:
			for _, m := range n.Methods.List {
				if isFailedMethod(m) {
					at(n, "declares a disk-guard interface: take ingest.DiskGuard, or ask Ingest.DiskLow")
				}
			}
		}
		return true
	})
	return out
}

// isFailedMethod reports whether m is a method Failed(error) bool.
func isFailedMethod(m *ast.Field) bool {
	ft, ok := m.Type.(*ast.FuncType)
	if !ok || len(m.Names) != 1 || m.Names[0].Name != "Failed" {
		return false
	}
	return len(ft.Params.List) == 1 && ft.Results != nil && len(ft.Results.List) == 1 &&
		exprName(ft.Params.List[0].Type) == "error" && exprName(ft.Results.List[0].Type) == "bool"
}

func exprName(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
