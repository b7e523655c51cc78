package edge

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDocsListEdgeMetrics keeps the list of the forwarder's metrics in
// docs/edge.md equal to what it registers.
func TestDocsListEdgeMetrics(t *testing.T) {
	ob := openTestOutbox(t, filepath.Join(t.TempDir(), "outbox.db"), 1<<20)
	defer func() {
		if err := ob.close(); err != nil {
			t.Error(err)
		}
	}()
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg, ob); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var registered []string
	for _, f := range families {
		registered = append(registered, f.GetName())
	}
	doc, err := os.ReadFile("../../docs/edge.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "<!-- edge metrics:")
	section, _, ok2 := strings.Cut(section, "<!-- /edge metrics -->")
	if !ok || !ok2 {
		t.Fatal("docs/edge.md lacks the edge metrics markers")
	}
	listed := regexp.MustCompile(`ingestor_edge_[a-z_]+`).FindAllString(section, -1)
	slices.Sort(listed)
	listed = slices.Compact(listed)
	slices.Sort(registered)
	if !slices.Equal(listed, registered) {
		t.Errorf("docs/edge.md lists %v\nregistered        %v", listed, registered)
	}
}
