package sources

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/devicewire"
)

// TestReadDeviceTokens reads a good tokens file and refuses each kind of
// bad one with the line at fault, never quoting a token.
func TestReadDeviceTokens(t *testing.T) {
	const a, b = "aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb"
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := ReadDeviceTokens(write("good", "# devices\n\n  dev-a   "+a+"  \ndev-b\t"+b+"\n"))
	if err != nil || len(got) != 2 || got[a] != "dev-a" || got[b] != "dev-b" {
		t.Fatalf("good file: %v, %v", got, err)
	}
	for _, tc := range []struct{ name, text, want string }{
		{"one field", "dev-a " + a + "\ndev-b\n", ":2: want \"DEVICE_ID TOKEN\", found 1 fields"},
		{"three fields", "dev-a " + a + " extra\n", ":1: want \"DEVICE_ID TOKEN\", found 3 fields"},
		{"short token", "dev-a tiny\n", `:1: the token of device "dev-a" must be at least 16 characters`},
		{"device twice", "dev-a " + a + "\ndev-a " + b + "\n", `:2: device "dev-a" already has a token on line 1`},
		{"token twice", "dev-a " + a + "\ndev-b " + a + "\n", `:2: device "dev-b" has the same token as device "dev-a"`},
		{"long device id", strings.Repeat("d", devicewire.MaxIDBytes+1) + " " + a + "\n", ":1: the device id is longer than 256 bytes"},
		{"no line", "# nothing yet\n", `holds no "DEVICE_ID TOKEN" line`},
	} {
		_, err := ReadDeviceTokens(write(tc.name, tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		} else if strings.Contains(err.Error(), a) || strings.Contains(err.Error(), b) {
			t.Errorf("%s: the error quotes a token: %v", tc.name, err)
		}
	}
	if _, err := ReadDeviceTokens(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "read the device tokens") {
		t.Errorf("missing file: err = %v", err)
	}
}

// TestWSIngressAuthenticated: a ws_ingress source authenticates once it
// has a token or a tokens file.
func TestWSIngressAuthenticated(t *testing.T) {
	s := newWSIngressSpec()
	if s.Authenticated() {
		t.Error("no token: Authenticated")
	}
	s.Token = "0123456789abcdef"
	if !s.Authenticated() {
		t.Error("token: not Authenticated")
	}
	s.Token, s.TokensFile = "", "tokens"
	if !s.Authenticated() {
		t.Error("tokens_file: not Authenticated")
	}
}
