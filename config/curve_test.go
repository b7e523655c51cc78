package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/curvekey"
)

// TestCurveKeyFiles loads [publish] with key files written by
// curvekey.Generate: a private secret key loads, one readable by every user
// is refused, and no error repeats a key.
func TestCurveKeyFiles(t *testing.T) {
	dir := t.TempDir()
	if _, _, _, err := curvekey.Generate(filepath.Join(dir, "daemon")); err != nil {
		t.Fatal(err)
	}
	pub, _, procPub, err := curvekey.Generate(filepath.Join(dir, "processor"))
	if err != nil {
		t.Fatal(err)
	}
	secretFile := filepath.Join(dir, "daemon.key")
	text := fmt.Sprintf("[publish]\ncurve_secret_key_file = %q\ncurve_authorized_keys_file = %q\n", secretFile, procPub)
	cfg, err := Parse("curve.toml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Publish.CurveSecretKeyFile != secretFile || cfg.Publish.CurveAuthorizedKeysFile != procPub {
		t.Fatalf("publish %+v", cfg.Publish)
	}

	if err := os.Chmod(secretFile, 0o644); err != nil {
		t.Fatal(err)
	}
	_, loadErr := Parse("curve.toml", []byte(text))
	want := "curve.toml:2: publish.curve_secret_key_file: " + secretFile +
		": a secret key must not be readable by every user (mode 0644): chmod 600 it"
	if loadErr == nil || loadErr.Error() != want {
		t.Fatalf("world-readable secret key: %v, want %s", loadErr, want)
	}
	secret, err := os.ReadFile(secretFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(secret), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") && strings.Contains(loadErr.Error(), line) {
			t.Fatal("the error repeats the secret key")
		}
	}

	// The .pub file's comment line is skipped.
	keys, err := curvekey.ReadKeys(procPub)
	if err != nil || len(keys) != 1 || keys[0] != pub {
		t.Fatalf("ReadKeys(%s) = %v, %v; want the public key", procPub, keys, err)
	}
}
