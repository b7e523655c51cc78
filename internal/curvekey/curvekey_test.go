package curvekey

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	zmq "github.com/pebbe/zmq4"
)

func TestCheck(t *testing.T) {
	pub, sec, err := zmq.NewCurveKeypair()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{pub, sec} {
		if err := Check(k); err != nil {
			t.Errorf("a generated key: %v", err)
		}
	}
	for key, want := range map[string]string{
		"":                           "want 40 characters, got 0",
		pub[:39]:                     "want 40 characters, got 39",
		pub[:10] + "~" + pub[11:]:    "character 11 is outside the Z85 alphabet",
		pub[:35] + "#####":           "characters 36 to 40 encode more than 32 bits",
		pub[:5] + " " + pub[6:]:      "character 6 is outside",
		pub[:39] + "\"":              "character 40 is outside",
		strings.Repeat("0", 40):      "",
		strings.Repeat("%nSc0", 8):   "", // 0xFFFFFFFF, the largest group
		strings.Repeat("%nSc1", 8):   "characters 1 to 5 encode more than 32 bits",
		strings.Repeat("0", 35) + "": "want 40 characters, got 35",
	} {
		err := Check(key)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("Check(%q) = %v, want %q", key, err, want)
		}
	}
}

func TestReadKeys(t *testing.T) {
	pub, sec, err := zmq.NewCurveKeypair()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, content string, perm os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, perm); err != nil { // whatever the umask
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "# two keys\n\n  "+pub+"  \n"+sec+"\n", 0o600)
	if keys, err := ReadKeys(good); err != nil || len(keys) != 2 || keys[0] != pub || keys[1] != sec {
		t.Errorf("ReadKeys = %v, %v", keys, err)
	}
	if _, err := ReadKey(good); err == nil || !strings.Contains(err.Error(), "holds 2 keys, want one") {
		t.Errorf("ReadKey of two keys: %v", err)
	}
	bad := write("bad", pub+"\n# fine\n"+sec[:30]+"\n", 0o600)
	if _, err := ReadKeys(bad); err == nil || err.Error() != bad+":3: not a Z85 CURVE key: want 40 characters, got 30" {
		t.Errorf("ReadKeys of a short key: %v", err)
	}
	empty := write("empty", "# nothing\n", 0o600)
	if _, err := ReadKeys(empty); err == nil || !strings.Contains(err.Error(), "holds no key") {
		t.Errorf("ReadKeys of no key: %v", err)
	}
	open := write("open.key", sec+"\n", 0o644)
	if _, err := ReadSecret(open); err == nil || !strings.Contains(err.Error(), "must not be readable by every user (mode 0644)") ||
		strings.Contains(err.Error(), sec) {
		t.Errorf("ReadSecret of a world-readable file: %v", err)
	}
	group := write("group.key", sec+"\n", 0o640)
	if got, err := ReadSecret(group); err != nil || got != sec {
		t.Errorf("ReadSecret of a group-readable file: %v", err)
	}
}
