package replay_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoDaemon checks that replay reaches the data dir lock and the
// queue without importing the daemon, and with it the actors, the
// publisher and the ops server.
func TestImportsNoDaemon(t *testing.T) {
	const pkg = "github.com/ingestorhq/ingestor/internal/replay"
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 || deps[len(deps)-1] != pkg {
		t.Fatalf("go list -deps %s listed %q, want its dependencies then itself", pkg, deps)
	}
	for _, dep := range deps {
		if dep == "github.com/ingestorhq/ingestor/internal/daemon" || dep == "github.com/ingestorhq/ingestor/actors" {
			t.Errorf("%s depends on %s", pkg, dep)
		}
	}
}
