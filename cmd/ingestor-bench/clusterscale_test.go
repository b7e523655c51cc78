package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestClusterScaleShort runs -mode cluster-scale small (5 members, 500
// stub sources, 20 s, compaction every 2 s) against a real etcd from
// $PATH: every target of the full run (make bench: 20 members, 10,000
// sources, 10 minutes) must hold. The etcd writes target fails with one
// checkpoint transaction per source (420 a second here, against a
// target of 10), the spread with the unbounded rendezvous placement.
// etcd's data dir is a tmpfs: under make test the other packages' fsyncs
// share the disk, and etcd's (two on the way from a lease's expiry to
// its sources held again) could eat the re-own target's margin, ~1.5 s
// past the lease's expiry; what the test checks is the members.
func TestClusterScaleShort(t *testing.T) {
	dir := testsync.MountTmpfs(t, 256<<20).Dir
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"-mode", "cluster-scale", "-members", "5", "-sources", "500", "-duration", "20s",
		"-dir", dir, "-json"}, &out, &errOut)
	if err != nil {
		// The error and the result last: CI shows the end of the output.
		t.Logf("stderr:\n%s", errOut.String())
		t.Fatalf("stdout:\n%s\ningestor-bench -mode cluster-scale: %v", out.String(), err)
	}
	var r scaleResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if r.Members != 5 || r.Sources != 500 || r.WritesPerSec <= 0 || len(r.DBSizes) == 0 || r.Reowned <= 0 || r.SpreadMax == 0 {
		t.Fatalf("result %+v: not measured", r)
	}
	if f := r.failures(); len(f) > 0 {
		t.Fatalf("targets missed: %v", f)
	}
	var table bytes.Buffer
	if err := printClusterScale(&table, &r); err != nil || !strings.Contains(table.String(), "| sources per member |") {
		t.Fatalf("table: %v\n%s", err, table.String())
	}
	// A result off its targets is reported.
	bad := r
	bad.WritesPerSec, bad.SpreadMax, bad.Reowned = 500, r.Sources, 60
	if f := bad.failures(); len(f) != 3 {
		t.Fatalf("failures of %+v = %v, want the writes, the spread and the re-own time", bad, f)
	}
}
