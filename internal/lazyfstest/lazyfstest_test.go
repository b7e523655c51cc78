package lazyfstest

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPowerCutKeepsOnlyWhatWasSynced writes one file fsynced, one fsynced
// and then extended, and one never fsynced; after PowerCut each holds
// exactly its fsynced bytes, and a second cut of the remounted FS changes
// nothing.
func TestPowerCutKeepsOnlyWhatWasSynced(t *testing.T) {
	fs := Mount(t)
	write := func(name string, parts ...string) {
		t.Helper()
		f, err := os.Create(filepath.Join(fs.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range parts {
			if _, err := f.WriteString(p); err != nil {
				t.Fatal(err)
			}
			if i < len(parts)-1 {
				if err := f.Sync(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write("synced", "all of it", "")
	write("partly", "kept", " lost")
	write("unsynced", "lost")
	want := map[string]string{"synced": "all of it", "partly": "kept", "unsynced": ""}
	check := func(when string) {
		t.Helper()
		for name, w := range want {
			got, err := os.ReadFile(filepath.Join(fs.Dir, name))
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			if string(got) != w {
				t.Errorf("%s: %s holds %q, want %q", when, name, got, w)
			}
		}
	}
	if got, err := os.ReadFile(filepath.Join(fs.Dir, "partly")); err != nil || string(got) != "kept lost" {
		t.Fatalf("before the cut, partly holds %q (%v), want everything written", got, err)
	}
	fs.PowerCut(func() {})
	check("after the power cut")
	fs.PowerCut(func() {})
	check("after a second power cut")
}
