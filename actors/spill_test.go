package actors

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSpillLoadRemovesWhatACrashLeft spills a batch, then adds what a
// crash in the middle of a spill leaves: a temporary file of the durable
// write and a sidecar whose payload was already removed. load lists only
// the batch and removes the rest.
func TestSpillLoadRemovesWhatACrashLeft(t *testing.T) {
	s := &spillDir{dir: filepath.Join(t.TempDir(), "spill")}
	const key = "src/2024/03/05/1-abc.json"
	if err := s.write(key, []byte(`[{"id":1}]`), spillInfo{Key: key, Source: "src", Attempts: 3}); err != nil {
		t.Fatal(err)
	}
	day := filepath.Dir(s.path(key))
	temp := filepath.Join(day, ".2-def.json.12345.tmp")
	orphan := filepath.Join(day, "3-fed.json"+spillMetaSuffix)
	for _, p := range []string{temp, orphan} {
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	left, err := s.load()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].key != key || left[0].info.Source != "src" || left[0].info.Attempts != 3 {
		t.Fatalf("load = %+v, want only %s with its sidecar", left, key)
	}
	for _, p := range []string{temp, orphan} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after load (%v)", filepath.Base(p), err)
		}
	}
}
