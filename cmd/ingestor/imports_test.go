package main

import (
	"go/parser"
	"go/token"
	"strconv"
	"testing"
)

// TestOfflineToolsImportNoDaemon checks that the subcommands that work on
// a data dir without a daemon reach the queue, the lock and the raw store
// directly, not through the daemon package, which only `run` needs.
func TestOfflineToolsImportNoDaemon(t *testing.T) {
	for _, file := range []string{"dlq.go", "replay.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Imports) == 0 {
			t.Fatalf("%s: no imports found", file)
		}
		for _, imp := range f.Imports {
			if p, err := strconv.Unquote(imp.Path.Value); err != nil || p == "github.com/ingestorhq/ingestor/internal/daemon" {
				t.Errorf("%s imports %s", file, imp.Path.Value)
			}
		}
	}
}
