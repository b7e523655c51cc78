package daemon

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the metrics list of docs/operations.md from the registry")

const (
	metricsBegin = "<!-- metrics: generated from the registry by internal/daemon TestDocsMetricsList; rerun it with -update-docs -->\n"
	metricsEnd   = "<!-- /metrics -->\n"
)

// descPattern parses prometheus.Desc.String(), the only public view of a
// descriptor's name, help and labels.
var descPattern = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), unit: "(?:[^"\\]|\\.)*", constLabels: \{[^}]*\}, variableLabels: \{([^}]*)\}\}$`)

// metricsList renders every ingestor_* metric the registry describes as a
// Markdown list: name, labels and help, sorted by name.
func metricsList(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(ch)
		close(ch)
	}()
	var lines []string
	for d := range ch {
		m := descPattern.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot parse descriptor %s", d)
		}
		name, err := strconv.Unquote(m[1])
		if err != nil {
			t.Fatal(err)
		}
		help, err := strconv.Unquote(m[2])
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(name, "ingestor_") {
			continue // Go runtime and process metrics
		}
		labels := ""
		if m[3] != "" {
			labels = "{" + m[3] + "}"
		}
		lines = append(lines, fmt.Sprintf("- `%s%s`: %s\n", name, labels, help))
	}
	slices.Sort(lines)
	return strings.Join(slices.Compact(lines), "")
}

// TestDocsMetricsList keeps the list of metrics in docs/operations.md
// equal to what the daemon registers, so the two cannot drift apart.
func TestDocsMetricsList(t *testing.T) {
	h := startDaemon(t, "", "", `
[source.gen]
kind = "demo"
interval = "1h"
`)
	want := metricsList(t, h.d.Registry())
	if strings.Count(want, "\n") < 20 {
		t.Fatalf("only %d metrics described:\n%s", strings.Count(want, "\n"), want)
	}
	const path = "../../docs/operations.md"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := strings.Cut(string(doc), metricsBegin)
	if ok {
		_, rest, ok = strings.Cut(rest, metricsEnd)
	}
	if !ok {
		t.Fatalf("%s lacks the metrics markers %q ... %q", path, metricsBegin, metricsEnd)
	}
	got := strings.TrimPrefix(string(doc), before+metricsBegin)
	got = strings.TrimSuffix(got, metricsEnd+rest)
	if got == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(before+metricsBegin+want+metricsEnd+rest), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: metrics list rewritten", path)
		return
	}
	t.Fatalf("%s: the metrics list differs from the registry; rerun with -update-docs. Want:\n%s", path, want)
}
