// Package buildinfo says which build of the ingestor is running: its
// version, the commit it was built from and the Go that built it, for
// `ingestor version`, /status, the cluster member key and the
// ingestor_build_info metric.
//
// A build from a git checkout gets the commit from the Go toolchain's VCS
// stamping. A build without .git (a container build copies the sources
// without it) passes them in:
//
//	go build -ldflags "-X github.com/ingestorhq/ingestor/internal/buildinfo.revision=$(git rev-parse HEAD)"
//
// as deploy/Dockerfile does with its VCS_REVISION and VERSION build args.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// version and revision are set with -ldflags -X by builds that have no
// VCS stamping; empty, the binary's build info is used.
var version, revision string

// Info is what a build says about itself.
type Info struct {
	// Version is the release version, or "devel" for a development build.
	Version string
	// Revision is the commit built ("" when unknown); Modified reports
	// that the work tree had uncommitted changes.
	Revision string
	Modified bool
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string
}

// Read returns the running binary's Info.
func Read() Info {
	in := Info{Version: "devel", Revision: revision, GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			in.Version = v
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && in.Revision == "":
				in.Revision = s.Value
			case s.Key == "vcs.modified" && s.Value == "true" && revision == "":
				in.Modified = true
			}
		}
	}
	if version != "" {
		in.Version = version
	}
	return in
}

// String returns the version, the commit's first 12 characters and
// "(modified)" when the work tree was: "devel 1a2b3c4d5e6f (modified)".
func (in Info) String() string {
	s := in.Version
	if in.Revision != "" {
		s += " " + in.Revision[:min(12, len(in.Revision))]
	}
	if in.Modified {
		s += " (modified)"
	}
	return s
}
