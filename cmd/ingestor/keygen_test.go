package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/curvekey"
)

func TestCurveKeygen(t *testing.T) {
	base := filepath.Join(t.TempDir(), "proc")
	var out, errb bytes.Buffer
	if code := run([]string{"curve-keygen", base}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	fi, err := os.Stat(base + ".key")
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("secret key mode %04o, want 0600", perm)
	}
	secret, err := curvekey.ReadSecret(base + ".key")
	if err != nil {
		t.Fatal(err)
	}
	public, err := curvekey.ReadKey(base + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if derived, err := curvekey.Public(secret); err != nil || derived != public {
		t.Fatalf("the .pub key is not the secret key's public key (%v)", err)
	}
	if !strings.Contains(out.String(), public) || strings.Contains(out.String(), secret) {
		t.Errorf("output should show the public key and not the secret one:\n%s", out.String())
	}

	out.Reset()
	if code := run([]string{"curve-keygen", base}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "file exists") {
		t.Errorf("a second run over the same files: exit %d, %s", code, errb.String())
	}
	if again, err := curvekey.ReadSecret(base + ".key"); err != nil || again != secret {
		t.Errorf("the secret key was overwritten (%v)", err)
	}
	if code := run([]string{"curve-keygen"}, &out, &errb); code != 2 {
		t.Errorf("no NAME: exit %d, want 2", code)
	}
}
