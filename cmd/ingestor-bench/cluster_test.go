package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestClusterModeShort builds the binaries and runs -mode cluster on one
// and two members (three sources of 10,000 events each, a real etcd from
// $PATH): one result per cluster size, every event received exactly once.
// Timings are not checked.
func TestClusterModeShort(t *testing.T) {
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "c")
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), filepath.Join(bin, "ingestor-bench"), "-mode", "cluster", "-members", "2",
		"-sources", "3", "-events", "10000", "-dir", dir, "-json")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("ingestor-bench -mode cluster: %v\nstdout:\n%s\nstderr:\n%s\nlogs in %s", err, out.String(), errOut.String(), dir)
	}
	var runs []clusterResult
	if err := json.Unmarshal(out.Bytes(), &runs); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(runs) != 2 {
		t.Fatalf("%d runs, want one on 1 member and one on 2: %s", len(runs), out.String())
	}
	for i, r := range runs {
		if r.Members != i+1 || r.Events != 30000 || !r.exactlyOnce() || r.EventsPerSec <= 0 || r.DaemonsCPUPerMillion <= 0 {
			t.Errorf("run %d: %+v; want %d members, 30000 events received exactly once, measured", i, r, i+1)
		}
	}
	var table bytes.Buffer
	if err := printCluster(&table, options{members: 2, sources: 3, events: 10000, pageSize: 1000, eventSize: realEventSize},
		[]*clusterResult{&runs[0], &runs[1]}); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
}
