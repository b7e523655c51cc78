package malloctune

import (
	"os"
	"testing"
)

// TestTuneKeepsFreedMemory checks what Tune is for: a message-sized block
// of 1 MiB, which glibc maps on its own by default, comes from an arena
// after Tune, and stays there once freed for the next one.
func TestTuneKeepsFreedMemory(t *testing.T) {
	if os.Getenv("GLIBC_TUNABLES") != "" {
		t.Fatal("GLIBC_TUNABLES is set: this test checks glibc's defaults")
	}
	mapped, _, ok := probe(1 << 20)
	if !ok {
		if tune(TrimThreshold, MmapThreshold) {
			t.Fatal("Tune applied thresholds where the probe cannot see them")
		}
		return // no glibc: nothing to tune, nothing to check
	}
	if !mapped && !tuned.Load() { // a run before this one (-count) tuned already
		t.Fatal("before Tune, a 1 MiB block was not mapped on its own: not glibc's defaults")
	}
	if !Tune() {
		t.Fatal("Tune did not apply the thresholds")
	}
	mapped, kept, _ := probe(1 << 20)
	if mapped || !kept {
		t.Errorf("after Tune, a 1 MiB block: mapped %v (want false), kept after free %v (want true)", mapped, kept)
	}
}

// TestTuneLeavesGLIBCTunables checks that an operator's $GLIBC_TUNABLES
// stands.
func TestTuneLeavesGLIBCTunables(t *testing.T) {
	t.Setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072")
	if Tune() {
		t.Error("Tune changed the thresholds although $GLIBC_TUNABLES is set")
	}
}
