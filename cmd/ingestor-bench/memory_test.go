package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestMemoryModeShort runs -mode memory on 5,000 events per run: the
// table has a row for each default inflight_batches (2, 4, 8), in order,
// each with a prediction and a measurement of both processes and their
// ratio, every event received exactly once. The memory itself is not
// checked: 5,000 events do not reach the peaks the formula is about.
func TestMemoryModeShort(t *testing.T) {
	bin := buildBinaries(t)
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), filepath.Join(bin, "ingestor-bench"), "-mode", "memory",
		"-events", "5000", "-dir", filepath.Join(t.TempDir(), "m"))
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("ingestor-bench -mode memory: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	t.Logf("\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// A title, the heading and its separator, 3 runs, a blank line and the
	// parameters.
	if len(lines) != 8 {
		t.Fatalf("output has %d lines, want 8:\n%s", len(lines), out.String())
	}
	head := tableCells(lines[1])
	col := map[string]int{}
	for i, h := range head {
		col[h] = i
	}
	for _, h := range []string{"inflight_batches", "daemon predicted MiB", "daemon measured MiB", "daemon measured/predicted",
		"processor predicted MiB", "processor measured MiB", "processor measured/predicted", "exactly once"} {
		if _, ok := col[h]; !ok {
			t.Fatalf("no column %q in %q", h, head)
		}
	}
	for i, want := range []string{"2", "4", "8"} {
		row := tableCells(lines[3+i])
		if len(row) != len(head) {
			t.Fatalf("row %q has %d cells, want %d", lines[3+i], len(row), len(head))
		}
		if row[0] != want {
			t.Errorf("row %d is inflight_batches %q, want %s", i, row[0], want)
		}
		for _, who := range []string{"daemon", "processor"} {
			pred, err1 := strconv.ParseFloat(row[col[who+" predicted MiB"]], 64)
			meas, err2 := strconv.ParseFloat(row[col[who+" measured MiB"]], 64)
			ratio, err3 := strconv.ParseFloat(row[col[who+" measured/predicted"]], 64)
			if err1 != nil || err2 != nil || err3 != nil || pred <= 0 || meas <= 0 || ratio <= 0 {
				t.Errorf("row %s, %s: predicted %q, measured %q, ratio %q", want, who,
					row[col[who+" predicted MiB"]], row[col[who+" measured MiB"]], row[col[who+" measured/predicted"]])
			}
		}
		if once := row[col["exactly once"]]; once != "yes: 6250 keys" {
			t.Errorf("row %s: exactly once %q, want \"yes: 6250 keys\"", want, once)
		}
	}
}

func TestParseFlagsMemoryMode(t *testing.T) {
	o, err := parseFlags([]string{"-mode", "memory", "-events", "4000"}, &bytes.Buffer{})
	if err != nil || len(o.memoryBatches) != 3 || o.memoryBatches[0] != 2 || o.memoryBatches[2] != 8 || o.eventSize != realEventSize || o.halfEvents != 1000 {
		t.Errorf("memory defaults: batches %v, event size %d, half events %d, err %v; want [2 4 8], %d, 1000",
			o.memoryBatches, o.eventSize, o.halfEvents, err, realEventSize)
	}
	_, err = parseFlags([]string{"-mode", "memory", "-memory-batches", "1,x,65", "-source-extra", "inflight_batches = 3", "-json"}, &bytes.Buffer{})
	for _, want := range []string{`"x" is not an inflight_batches`, `"65" is not`, "-source-extra must not", "-json is not supported"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not contain %q", err, want)
		}
	}
}
