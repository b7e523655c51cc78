package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// tableCells splits a markdown table row into its trimmed cells.
func tableCells(line string) []string {
	f := strings.Split(strings.Trim(line, "|"), "|")
	for i := range f {
		f[i] = strings.TrimSpace(f[i])
	}
	return f
}

// TestCompareModeShort runs -mode compare with this build on both sides
// (so no baseline needs building here), 2 runs each of 5,000 events: the
// table has a row per run in the interleaved order, each exactly once,
// the medians of each build and a row of ratios; each run's queue and raw
// store are removed and its logs kept. Timings are not checked.
func TestCompareModeShort(t *testing.T) {
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "c")
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), filepath.Join(bin, "ingestor-bench"), "-mode", "compare", "-baseline", bin,
		"-events", "5000", "-runs", "2", "-dir", dir)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("ingestor-bench -mode compare: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	t.Logf("\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// A title, the heading and its separator, 4 runs, 2 medians, ratios.
	if len(lines) != 10 {
		t.Fatalf("output has %d lines, want 10:\n%s", len(lines), out.String())
	}
	head := tableCells(lines[1])
	if want := 2 + len(compareColumns) + 1; len(head) != want {
		t.Fatalf("heading has %d columns, want %d: %q", len(head), want, head)
	}
	wantRows := [][2]string{{"1", "new"}, {"1", "baseline"}, {"2", "new"}, {"2", "baseline"}, {"median", "new"}, {"median", "baseline"}, {"ratio", "new/baseline"}}
	for i, want := range wantRows {
		row := tableCells(lines[3+i])
		if len(row) != len(head) {
			t.Fatalf("row %q has %d cells, want %d", lines[3+i], len(row), len(head))
		}
		if row[0] != want[0] || row[1] != want[1] {
			t.Errorf("row %d starts %q %q, want %q %q", i, row[0], row[1], want[0], want[1])
		}
		for j, c := range row[2 : len(row)-1] {
			// A ratio over a baseline median of 0 is n/a: the processor's
			// CPU over 5,000 events can round to 0 clock ticks.
			if c == "n/a" && want[0] == "ratio" && tableCells(lines[3+5])[2+j] == "0.00" {
				continue
			}
			if c == "" || strings.Contains(c, "NaN") || strings.Contains(c, "n/a") {
				t.Errorf("row %d, column %q: %q", i, head[2+j], c)
			}
		}
		once := row[len(row)-1]
		switch want[0] {
		case "median":
			if once != "2 of 2 runs" {
				t.Errorf("row %d: exactly once %q, want \"2 of 2 runs\"", i, once)
			}
		case "ratio":
			if once != "" {
				t.Errorf("ratio row: exactly once %q, want empty", once)
			}
		default:
			if once != "yes: 6250 keys" {
				t.Errorf("row %d: exactly once %q, want \"yes: 6250 keys\"", i, once)
			}
		}
	}
	for _, run := range []string{"1-new", "1-baseline", "2-new", "2-baseline"} {
		if _, err := os.Stat(filepath.Join(dir, run, "ingestor.log")); err != nil {
			t.Errorf("run %s: its log: %v", run, err)
		}
		if _, err := os.Stat(filepath.Join(dir, run, "data")); !os.IsNotExist(err) {
			t.Errorf("run %s: its data directory is still there (%v)", run, err)
		}
	}
}

// TestCompareTableMediansAndRatios checks the summary rows on made-up
// runs: the median of an even number of runs is the mean of the middle
// two, ratios are new/baseline, and a zero median gives "n/a".
func TestCompareTableMediansAndRatios(t *testing.T) {
	res := func(rate, p99 float64) *realResult {
		return &realResult{Events: 10, HalfEvents: 2, EventsPerSec: rate, FullP99Ms: p99, HalfP99Ms: 1, Received: counts{Events: 12, DistinctKeys: 12}}
	}
	runs := []compareRun{
		{1, "new", res(100, 10)}, {1, "baseline", res(50, 0)},
		{2, "new", res(300, 30)}, {2, "baseline", res(70, 0)},
		{3, "new", res(200, 20)}, {3, "baseline", res(60, 0)},
		{4, "new", res(400, 40)}, {4, "baseline", res(90, 0)},
	}
	var out bytes.Buffer
	o := options{runs: 4, events: 10, halfEvents: 2}
	if err := printCompare(&out, o, []build{{"new", "a"}, {"baseline", "b"}}, runs); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	med, ratio := tableCells(lines[len(lines)-3]), tableCells(lines[len(lines)-1])
	if med[2] != "250" || med[6] != "0.0 / 25.0" || med[len(med)-1] != "4 of 4 runs" {
		t.Errorf("medians of new: %q", med)
	}
	if ratio[2] != "3.85" || ratio[6] != "n/a / n/a" || ratio[7] != "1.00" {
		t.Errorf("ratios: %q", ratio)
	}
}

func TestParseFlagsCompareMode(t *testing.T) {
	o, err := parseFlags([]string{"-mode", "compare", "-baseline", "old", "-events", "4000"}, &bytes.Buffer{})
	if err != nil || o.runs != compareRuns || o.eventSize != realEventSize || o.halfEvents != 1000 {
		t.Errorf("compare defaults: runs %d, event size %d, half events %d, err %v; want %d, %d, 1000",
			o.runs, o.eventSize, o.halfEvents, err, compareRuns, realEventSize)
	}
	_, err = parseFlags([]string{"-mode", "compare", "-runs", "0", "-json", "-cpuprofile", "x"}, &bytes.Buffer{})
	for _, want := range []string{"needs -baseline DIR", "-runs must be at least 1", "-json is not supported", "-cpuprofile is not supported"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not contain %q", err, want)
		}
	}
}
