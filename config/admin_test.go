package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminTokenFile reads the token from a file, trimming the final
// newline, and reports an empty file without quoting what it holds.
func TestAdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	good, empty := filepath.Join(dir, "token"), filepath.Join(dir, "empty")
	if err := os.WriteFile(good, []byte("  0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseWithEnv("t.toml", []byte("[daemon]\nhttp_addr = \":9464\"\nadmin_token_file = \""+good+"\"\n"), envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Daemon.AdminToken != "0123456789abcdef0123456789abcdef" {
		t.Errorf("token %q, want the file's trimmed", cfg.Daemon.AdminToken)
	}
	_, err = ParseWithEnv("t.toml", []byte("[daemon]\nadmin_token_file = \""+empty+"\"\n"), envOf(nil))
	if err == nil || !strings.Contains(err.Error(), "t.toml:2: daemon.admin_token_file: the file \""+empty+"\" is empty") {
		t.Errorf("empty token file: %v", err)
	}
}

// TestAdminProblem lists which admin listeners need a token.
func TestAdminProblem(t *testing.T) {
	for _, c := range []struct {
		d         Daemon
		needToken bool
	}{
		{Daemon{HTTPAddr: "127.0.0.1:9464"}, false},
		{Daemon{HTTPAddr: "[::1]:9464"}, false},
		{Daemon{HTTPAddr: "localhost:9464"}, false},
		{Daemon{HTTPAddr: ":9464"}, true},
		{Daemon{HTTPAddr: "0.0.0.0:9464"}, true},
		{Daemon{HTTPAddr: "10.0.0.5:9464"}, true},
		{Daemon{HTTPAddr: "ingest.internal:9464"}, true},
		{Daemon{HTTPAddr: ":9464", AdminAddr: "127.0.0.1:9465"}, false},
		{Daemon{HTTPAddr: ":9464", AdminAddr: "unix:/run/ingestor/admin.sock"}, false},
		{Daemon{HTTPAddr: "127.0.0.1:9464", AdminAddr: ":9465"}, true},
		{Daemon{HTTPAddr: ":9464", AdminToken: "0123456789abcdef"}, false},
	} {
		if got := c.d.AdminProblem() != ""; got != c.needToken {
			t.Errorf("%+v: needs a token = %v, want %v", c.d, got, c.needToken)
		}
	}
}
