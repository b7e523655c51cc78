package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/daemon"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestValidateCommand runs `ingestor validate` over every config in
// testdata/config: good files exit 0, bad files exit non-zero and print
// each problem with its file:line.
func TestValidateCommand(t *testing.T) {
	// env.good.toml interpolates these.
	t.Setenv("STATE_DIR", t.TempDir())
	t.Setenv("BUCKET", "acme-raw")
	t.Setenv("GITHUB_TOKEN", "tok")
	// admin.good.toml reads the admin token from the environment.
	t.Setenv("INGESTOR_ADMIN_TOKEN", "0123456789abcdef0123456789abcdef")
	// webhook.good.toml takes its secrets and token from the environment.
	t.Setenv("GITHUB_WEBHOOK_SECRET", "gh-secret")
	t.Setenv("STRIPE_WEBHOOK_SECRET", "whsec_x")
	t.Setenv("SVIX_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	t.Setenv("SHOPIFY_SECRET", "shpss_0123")
	t.Setenv("CUSTOM_SECRET", "custom-0123")
	t.Setenv("NEW_SECRET", "new-0123")
	t.Setenv("OLD_SECRET", "old-4567")
	t.Setenv("APP_TOKEN", "0123456789abcdef-app")
	t.Setenv("ETCD_PASSWORD", "etcd-s3cret") // cluster.good.toml
	// ws_ingress.good.toml takes its token and tokens file from there too.
	t.Setenv("DEVICES_TOKEN", "devices-0123456789abcdef")
	t.Setenv("DEVICE_TOKENS_FILE", "../../testdata/config/device-tokens")
	// push_guard.good.toml takes the push listener's certificate, key and
	// client CA from there too.
	pki := testsync.NewPKI(t)
	t.Setenv("PUSH_TLS_CERT", pki.ServerCertFile)
	t.Setenv("PUSH_TLS_KEY", pki.ServerKeyFile)
	t.Setenv("PUSH_CLIENT_CA", pki.CAFile)
	good, err := filepath.Glob("../../testdata/config/*.good.toml")
	if err != nil || len(good) == 0 {
		t.Fatalf("no good configs found: %v", err)
	}
	good = append(good, "../../ingestor.example.toml")
	for _, f := range good {
		var out, errb bytes.Buffer
		if code := run([]string{"validate", "-c", f}, &out, &errb); code != 0 {
			t.Errorf("validate %s: exit %d\n%s", f, code, errb.String())
		}
		if !strings.Contains(out.String(), ": ok (") {
			t.Errorf("validate %s printed %q", f, out.String())
		}
	}
	bad, err := filepath.Glob("../../testdata/config/*.bad.toml")
	if err != nil || len(bad) == 0 {
		t.Fatalf("no bad configs found: %v", err)
	}
	for _, f := range bad {
		var out, errb bytes.Buffer
		if code := run([]string{"validate", "-c", f}, &out, &errb); code != 1 {
			t.Errorf("validate %s: exit %d, want 1", f, code)
		}
		if !strings.Contains(errb.String(), filepath.Base(f)+":") {
			t.Errorf("validate %s: errors lack file:line:\n%s", f, errb.String())
		}
	}
	// The many-problems file reports all of them, each on its own line.
	var out, errb bytes.Buffer
	run([]string{"validate", "-c", "../../testdata/config/many.bad.toml"}, &out, &errb)
	if n := strings.Count(errb.String(), "many.bad.toml:"); n < 10 {
		t.Errorf("many.bad.toml: %d located errors reported, want every one:\n%s", n, errb.String())
	}
	if !strings.Contains(errb.String(), `source "demo": colour: unknown key`) {
		t.Errorf("unknown key not reported with its source:\n%s", errb.String())
	}
	// Admin endpoints on every interface without a token are refused with
	// the keys that fix it.
	out.Reset()
	errb.Reset()
	run([]string{"validate", "-c", "../../testdata/config/admin_public.bad.toml"}, &out, &errb)
	if !strings.Contains(errb.String(), "admin_public.bad.toml:3: daemon.http_addr: serves the admin endpoints") ||
		!strings.Contains(errb.String(), "daemon.admin_token_file") || !strings.Contains(errb.String(), "daemon.admin_addr") {
		t.Errorf("admin_public.bad.toml: the tokenless public admin listener is not reported with its keys:\n%s", errb.String())
	}
}

func TestUsageErrors(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(nil, &out, &errb); code != 2 {
		t.Errorf("no args: exit %d, want 2", code)
	}
	if code := run([]string{"frobnicate"}, &out, &errb); code != 2 {
		t.Errorf("unknown command: exit %d, want 2", code)
	}
	if code := run([]string{"validate"}, &out, &errb); code != 2 {
		t.Errorf("validate without -c: exit %d, want 2", code)
	}
	if code := run([]string{"doctor"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage: ingestor doctor -c FILE") {
		t.Errorf("doctor without -c: exit %d, want 2 and its usage\n%s", code, errb.String())
	}
}

// TestVersionCommand runs `ingestor version`, which the usage lists: it
// prints the build's version, the one /status reports.
func TestVersionCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"version"}, &out, &errOut); code != 0 || out.String() != "ingestor "+daemon.Version()+"\n" || errOut.Len() != 0 {
		t.Errorf("ingestor version = %d, %q, %q; want 0 and %q", code, out.String(), errOut.String(), "ingestor "+daemon.Version()+"\n")
	}
}
