package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// modeCompare runs -mode real alternately with this build's binaries and
// a baseline's, and prints every run and the ratio of their medians.
const modeCompare = "compare"

// compareRuns is the default -runs: runs of each build.
const compareRuns = 3

// build is one side of a comparison: its label and the directory of its
// ingestor and processor binaries.
type build struct {
	name, bin string
}

// compareRun is one -mode real run of a comparison.
type compareRun struct {
	n     int // 1-based, per build
	build string
	res   *realResult
}

// compareFlags checks the flags of -mode compare.
func compareFlags(o *options, set map[string]bool) []error {
	if o.mode != modeCompare {
		return nil
	}
	var errs []error
	if o.baseline == "" {
		errs = append(errs, errors.New("-mode compare needs -baseline DIR, the baseline's ingestor and processor (make bench-baseline builds them)"))
	}
	if o.runs < 1 {
		errs = append(errs, fmt.Errorf("-runs must be at least 1, not %d", o.runs))
	}
	// Each run would overwrite the profiles, and the JSON line of one run
	// does not say which build it measured.
	for _, f := range []string{"cpuprofile", "processor-cpuprofile", "json"} {
		if set[f] {
			errs = append(errs, fmt.Errorf("-%s is not supported by -mode compare: use -mode real -bin DIR", f))
		}
	}
	return errs
}

// runCompare runs -mode real o.runs times with each build, interleaved
// (this build, the baseline, this build, ...), each run in its own
// directory under dir, and prints the table. The baselines this mode is
// used with (86fa679 and later) take every flag -mode real passes to
// bin/processor; an older processor ignores the environment variable of
// -processor-cpuprofile, which this mode does not set anyway.
func runCompare(ctx context.Context, o options, dir string, stdout, stderr io.Writer) error {
	self, err := binDir(o.bin)
	if err != nil {
		return err
	}
	builds := []build{{"new", self}, {"baseline", o.baseline}}
	if _, _, err := realBinaries(self); err != nil {
		return err
	}
	for _, name := range []string{"ingestor", "processor"} {
		if _, err := os.Stat(filepath.Join(o.baseline, name)); err != nil {
			return fmt.Errorf("-baseline: %w (make bench-baseline builds the baseline's binaries)", err)
		}
	}
	var runs []compareRun
	for i := 1; i <= o.runs; i++ {
		for _, b := range builds {
			res, err := compareOnce(ctx, o, b, filepath.Join(dir, fmt.Sprintf("%d-%s", i, b.name)), stderr)
			if err != nil {
				return fmt.Errorf("run %d of %s (%s): %w", i, b.name, b.bin, err)
			}
			fmt.Fprintf(stderr, "ingestor-bench: run %d of %d, %s: %.0f events/s\n", i, o.runs, b.name, res.EventsPerSec)
			runs = append(runs, compareRun{n: i, build: b.name, res: res})
		}
	}
	if err := printCompare(stdout, o, builds, runs); err != nil {
		return err
	}
	var errs []error
	for _, r := range runs {
		if !r.res.exactlyOnce() {
			errs = append(errs, fmt.Errorf("exactly-once check failed in run %d of %s: the processor received %d events with %d distinct keys, want %d of each",
				r.n, r.build, r.res.Received.Events, r.res.Received.DistinctKeys, r.res.Events+r.res.HalfEvents))
		}
	}
	return errors.Join(errs...)
}

// compareOnce runs -mode real with b's binaries in dir, then removes the
// run's queue and raw store (a run of 1M events leaves ~0.6 GB), keeping
// its config and logs.
func compareOnce(ctx context.Context, o options, b build, dir string, stderr io.Writer) (*realResult, error) {
	if err := os.Mkdir(dir, 0o750); err != nil {
		return nil, err
	}
	ro := o
	ro.mode, ro.bin = modeReal, b.bin
	res, err := benchReal(ctx, ro, dir, stderr)
	if err != nil {
		return nil, err
	}
	return res, os.RemoveAll(filepath.Join(dir, "data"))
}

// compareColumn is a column of the comparison: its heading and the
// values of its cell (one, or two joined by " / "), printed with prec
// decimals.
type compareColumn struct {
	head   string
	prec   int
	values func(*realResult) []float64
}

var compareColumns = []compareColumn{
	{"events/s", 0, func(r *realResult) []float64 { return []float64{r.EventsPerSec} }},
	{"daemon CPU-s/1M", 2, func(r *realResult) []float64 { return []float64{r.DaemonCPUPerMillion} }},
	{"processor CPU-s/1M", 2, func(r *realResult) []float64 { return []float64{r.ProcessorCPUPerMillion} }},
	{"daemon peak RSS MiB", 1, func(r *realResult) []float64 { return []float64{r.DaemonPeakRSSMiB} }},
	{"full load p50/p99 ms", 1, func(r *realResult) []float64 { return []float64{r.FullP50Ms, r.FullP99Ms} }},
	{"half load p99 ms", 1, func(r *realResult) []float64 { return []float64{r.HalfP99Ms} }},
}

// formatValues formats the values of a cell.
func formatValues(vs []float64, prec int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprintf("%.*f", prec, v)
	}
	return strings.Join(s, " / ")
}

// medians returns the median of each value of column c over the runs of
// build name.
func medians(c compareColumn, runs []compareRun, name string) []float64 {
	var per [][]float64 // per value, over the runs
	for _, r := range runs {
		if r.build != name {
			continue
		}
		for i, v := range c.values(r.res) {
			if i == len(per) {
				per = append(per, nil)
			}
			per[i] = append(per[i], v)
		}
	}
	out := make([]float64, len(per))
	for i, vs := range per {
		out[i] = median(vs)
	}
	return out
}

// median returns the median of vs (sorting it), 0 for none.
func median(vs []float64) float64 {
	n := len(vs)
	if n == 0 {
		return 0
	}
	slices.Sort(vs)
	return (vs[(n-1)/2] + vs[n/2]) / 2
}

// ratios formats num[i]/den[i] for each value, "n/a" where den is 0.
func ratios(num, den []float64) string {
	s := make([]string, len(num))
	for i := range num {
		s[i] = "n/a"
		if den[i] != 0 {
			s[i] = fmt.Sprintf("%.2f", num[i]/den[i])
		}
	}
	return strings.Join(s, " / ")
}

// printCompare prints one row per run, the medians of each build and the
// ratio of this build's medians to the baseline's.
func printCompare(w io.Writer, o options, builds []build, runs []compareRun) error {
	var b strings.Builder
	fmt.Fprintf(&b, "ingestor-bench -mode compare: %d runs of each build, interleaved; new: %s, baseline: %s%s; "+
		"each run is -mode real: %d events of ~%d B in pages of %d, then %d more paced at half of that run's rate\n",
		o.runs, builds[0].bin, builds[1].bin, revisionNote(builds[1].bin), o.events, o.eventSize, o.pageSize, o.halfEvents)
	b.WriteString("| run | build |")
	for _, c := range compareColumns {
		fmt.Fprintf(&b, " %s |", c.head)
	}
	b.WriteString(" exactly once |\n|---|---|" + strings.Repeat("---|", len(compareColumns)+1) + "\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %d | %s |", r.n, r.build)
		for _, c := range compareColumns {
			fmt.Fprintf(&b, " %s |", formatValues(c.values(r.res), c.prec))
		}
		cols := r.res.columns()
		fmt.Fprintf(&b, " %s |\n", cols[len(cols)-1][1])
	}
	for _, bd := range builds {
		fmt.Fprintf(&b, "| median | %s |", bd.name)
		for _, c := range compareColumns {
			fmt.Fprintf(&b, " %s |", formatValues(medians(c, runs, bd.name), c.prec))
		}
		once, n := 0, 0
		for _, r := range runs {
			if r.build == bd.name {
				n++
				if r.res.exactlyOnce() {
					once++
				}
			}
		}
		fmt.Fprintf(&b, " %d of %d runs |\n", once, n)
	}
	fmt.Fprintf(&b, "| ratio | %s/%s |", builds[0].name, builds[1].name)
	for _, c := range compareColumns {
		fmt.Fprintf(&b, " %s |", ratios(medians(c, runs, builds[0].name), medians(c, runs, builds[1].name)))
	}
	b.WriteString("  |\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// revisionNote returns " (commit C)" when dir holds a REVISION file, as
// make bench-baseline writes, and "" otherwise.
func revisionNote(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "REVISION"))
	if rev := strings.TrimSpace(string(b)); err == nil && rev != "" {
		return fmt.Sprintf(" (commit %.12s)", rev)
	}
	return ""
}
