package processor_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"strconv"
	"strings"
	"testing"
)

// TestAPIStandsAlone checks that no exported identifier of the package
// refers to an internal package: an exported type, function, method,
// struct field, constant or variable that names an internal type (say,
// type Event = wire.Event) would send the client's documentation into a
// package its users cannot import.
func TestAPIStandsAlone(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		if name := e.Name(); strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
	}
	exportedType := make(map[string]bool) // for methods
	for _, f := range files {
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				for _, s := range g.Specs {
					exportedType[s.(*ast.TypeSpec).Name.Name] = s.(*ast.TypeSpec).Name.IsExported()
				}
			}
		}
	}
	checked := 0
	for _, f := range files {
		internal := make(map[string]string) // import name -> path
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains("/"+p+"/", "/internal/") {
				continue
			}
			name := path.Base(p)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			internal[name] = p
		}
		check := func(what string, nodes ...ast.Node) {
			checked++
			for _, n := range nodes {
				documented(n, func(sel *ast.SelectorExpr) {
					if x, ok := sel.X.(*ast.Ident); ok && internal[x.Name] != "" {
						t.Errorf("%s: exported %s refers to %s.%s of internal package %s",
							fset.Position(sel.Pos()), what, x.Name, sel.Sel.Name, internal[x.Name])
					}
				})
			}
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					check("func "+d.Name.Name, d.Type)
				} else if recv := receiverType(d.Recv.List[0].Type); exportedType[recv] {
					check("method "+recv+"."+d.Name.Name, d.Recv, d.Type)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							check("type "+s.Name.Name, s.Type)
						}
					case *ast.ValueSpec:
						for i, n := range s.Names {
							if !n.IsExported() {
								continue
							}
							var nodes []ast.Node
							if s.Type != nil {
								nodes = append(nodes, s.Type)
							}
							if i < len(s.Values) {
								nodes = append(nodes, s.Values[i])
							}
							check(n.Name, nodes...)
						}
					}
				}
			}
		}
	}
	// Client, Event, Options, Run, New and more: a walk that found fewer
	// did not see the package.
	if checked < 10 {
		t.Errorf("checked %d exported declarations, want the whole API", checked)
	}
}

// documented calls found for each selector expression in the parts of n
// that the documentation shows: not function literals' bodies, not the
// unexported fields of structs.
func documented(n ast.Node, found func(*ast.SelectorExpr)) {
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			documented(n.Type, found)
			return false
		case *ast.StructType:
			for _, field := range n.Fields.List {
				if len(field.Names) == 0 || field.Names[0].IsExported() {
					documented(field.Type, found)
				}
			}
			return false
		case *ast.SelectorExpr:
			found(n)
		}
		return true
	})
}

// receiverType returns the name of a method's receiver type.
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
