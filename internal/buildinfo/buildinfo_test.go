package buildinfo

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestRevisionFromLdflags builds `ingestor version` as a container build
// does, from sources without .git and with the commit passed in with
// -ldflags -X, and as a checkout build does, with VCS stamping: both name
// the commit; and Read names the Go that built the test.
func TestRevisionFromLdflags(t *testing.T) {
	if got := Read().GoVersion; got != runtime.Version() {
		t.Errorf("GoVersion %q, want %q", got, runtime.Version())
	}
	bin := filepath.Join(t.TempDir(), "ingestor")
	const rev = "0123456789abcdef0123456789abcdef01234567"
	build := exec.Command("go", "build", "-buildvcs=false", "-o", bin,
		"-ldflags", "-X github.com/ingestorhq/ingestor/internal/buildinfo.revision="+rev+
			" -X github.com/ingestorhq/ingestor/internal/buildinfo.version=v1.2.3", "../../cmd/ingestor")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ingestor v1.2.3 0123456789ab" {
		t.Errorf("ingestor version: %v %q, want \"ingestor v1.2.3 0123456789ab\"", err, out)
	}
}
