package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// unsetEnv unsets the variables names for the test, restoring them after.
func unsetEnv(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		t.Setenv(n, "") // restores the old value at the end
		if err := os.Unsetenv(n); err != nil {
			t.Fatal(err)
		}
	}
}

// configMapTOML extracts the config from a Kubernetes manifest of
// deploy/kubernetes: the ingestor.toml entry of a ConfigMap's data, or
// the value of a JSON patch replacing /data/ingestor.toml. It writes it
// to a file and returns its path.
func configMapTOML(t *testing.T, manifest string) string {
	t.Helper()
	raw, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var text string
	var cm struct {
		Kind string            `yaml:"kind"`
		Data map[string]string `yaml:"data"`
	}
	var patch []struct {
		Op    string `yaml:"op"`
		Path  string `yaml:"path"`
		Value string `yaml:"value"`
	}
	if yaml.Unmarshal(raw, &cm) == nil && cm.Kind == "ConfigMap" {
		text = cm.Data["ingestor.toml"]
	} else if err := yaml.Unmarshal(raw, &patch); err == nil {
		for _, p := range patch {
			if p.Op == "replace" && p.Path == "/data/ingestor.toml" {
				text = p.Value
			}
		}
	}
	if !strings.Contains(text, "[daemon]") {
		t.Fatalf("%s: no ingestor.toml config found", manifest)
	}
	path := filepath.Join(t.TempDir(), "ingestor.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestValidateOfflineDeployConfigs validates the configs that deploy/
// ships, as a CI pipeline would, on a machine without their secrets:
// `validate --offline` passes each and says what it skipped, while plain
// validate fails each, as the missing secrets are what it checks.
func TestValidateOfflineDeployConfigs(t *testing.T) {
	unsetEnv(t, "INGESTOR_ADMIN_TOKEN", "POD_NAME", "POD_NAMESPACE", "EXAMPLE_API_TOKEN")
	for _, tc := range []struct {
		name, path string
		skipped    string
		online     []string // problems plain validate reports
	}{
		{"container", "../../deploy/ingestor.container.toml", "skipped (offline): 0 ${ENV} references, 2 key files",
			[]string{"publish.curve_secret_key_file: stat /run/secrets/ingestor-curve/daemon.key: no such file or directory",
				"publish.curve_authorized_keys_file: open /run/secrets/ingestor-curve/processors.pub: no such file or directory",
				"2 problem(s) found"}},
		{"kubernetes", configMapTOML(t, "../../deploy/kubernetes/base/configmap.yaml"), "skipped (offline): 1 ${ENV} reference, 2 key files",
			[]string{"daemon.admin_token: environment variable INGESTOR_ADMIN_TOKEN is not set",
				"publish.curve_secret_key_file: stat /run/secrets/ingestor-curve/daemon.key", "3 problem(s) found"}},
		{"kubernetes cluster", configMapTOML(t, "../../deploy/kubernetes/cluster/configmap.patch.yaml"),
			"skipped (offline): 4 ${ENV} references, 5 key files",
			[]string{"cluster.member_name: environment variable POD_NAME is not set",
				"cluster.etcd_cert_file: cannot load the certificate and key: open /run/secrets/ingestor-etcd/tls.crt"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run([]string{"validate", "--offline", "-c", tc.path}, &out, &errb); code != 0 {
				t.Fatalf("validate --offline: exit %d\n%s%s", code, out.String(), errb.String())
			}
			if !strings.Contains(out.String(), tc.path+": ok offline (") || !strings.Contains(out.String(), tc.skipped+"\n") {
				t.Errorf("validate --offline printed:\n%s\nwant %q", out.String(), tc.skipped)
			}
			if !strings.Contains(out.String(), "publish.curve_secret_key_file: file not read: /run/secrets/ingestor-curve/daemon.key") {
				t.Errorf("validate --offline does not list the key file it skipped:\n%s", out.String())
			}
			out.Reset()
			if code := run([]string{"validate", "-c", tc.path}, &out, &errb); code != 1 {
				t.Fatalf("plain validate: exit %d, want 1 (the secrets are not on this machine)\n%s", code, out.String())
			}
			for _, want := range tc.online {
				if !strings.Contains(errb.String(), want) {
					t.Errorf("plain validate lacks %q:\n%s", want, errb.String())
				}
			}
		})
	}
}

// TestValidateOfflineStillFailsOnMistakes: offline, an unknown key, a
// value of the wrong type and a bad duration are reported as online.
func TestValidateOfflineStillFailsOnMistakes(t *testing.T) {
	for file, want := range map[string]string{
		"unknown_key.bad.toml":  `unknown_key.bad.toml:7: source "github": colour: unknown key`,
		"bad_duration.bad.toml": `bad_duration.bad.toml:12: source "demo": timeout: must be a duration string such as "30s", not an integer`,
		"many.bad.toml":         `many.bad.toml:10: publish.max_pending_events: must be an integer, not a string`,
	} {
		var out, errb bytes.Buffer
		if code := run([]string{"validate", "--offline", "-c", "../../testdata/config/" + file}, &out, &errb); code != 1 || !strings.Contains(errb.String(), want) {
			t.Errorf("validate --offline %s: exit %d, want 1 with %q:\n%s", file, code, want, errb.String())
		}
	}
}

// TestValidateConfigDirectoryAndRepeatedC: -c takes a directory (its
// *.toml files) and may be repeated; a block defined twice is reported
// naming both files; an empty directory is an error.
func TestValidateConfigDirectoryAndRepeatedC(t *testing.T) {
	split := "../../testdata/config/split"
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-c", split}, 0, split + ": ok (3 files, 2 sources, 2 enabled)\n"},
		{[]string{"-c", split + "/10-daemon.toml", "-c", split + "/30-demo.toml"}, 0,
			split + "/10-daemon.toml, " + split + "/30-demo.toml: ok (2 files, 1 sources, 1 enabled)\n"},
		{[]string{"-c", split, "-c", "../../testdata/config/minimal.good.toml"}, 1,
			`../../testdata/config/minimal.good.toml:2: source "demo" already defined at ` + split + "/30-demo.toml:1\n1 problem(s) found\n"},
		{[]string{"-c", "../../testdata/config/split_dup"}, 1,
			`../../testdata/config/split_dup/20-b.toml:5: source "x" already defined at ../../testdata/config/split_dup/10-a.toml:4`},
		{[]string{"-c", "../../testdata/config/no_toml"}, 1,
			"ingestor: load config: the directory ../../testdata/config/no_toml holds no *.toml file\n"},
		{[]string{"-c", t.TempDir() + "/"}, 1, "holds no *.toml file\n"},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"validate"}, tc.args...), &out, &errb)
		if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.want) {
			t.Errorf("validate %v: exit %d, want %d with %q:\n%s%s", tc.args, code, tc.code, tc.want, out.String(), errb.String())
		}
	}
}

// TestEveryConfigCommandTakesADirectory: every command that loads the
// daemon's config shares the loader, so each reads a directory and
// reports a duplicate naming both files.
func TestEveryConfigCommandTakesADirectory(t *testing.T) {
	dup := "../../testdata/config/split_dup"
	want := `20-b.toml:5: source "x" already defined at ` + dup + "/10-a.toml:4"
	for _, args := range [][]string{
		{"run"}, {"validate"}, {"check-source", "x"}, {"replay", "-source", "x"}, {"doctor"}, {"dlq", "list"},
		{"quarantine", "list"}, {"reload"}, {"status"},
	} {
		var out, errb bytes.Buffer
		if code := run(append(args, "-c", dup), &out, &errb); code != 1 || !strings.Contains(errb.String(), want) {
			t.Errorf("ingestor %s -c %s: exit %d, want 1 with %q:\n%s", strings.Join(args, " "), dup, code, want, errb.String())
		}
	}
}

// TestSIGHUPRereadsASplitConfig runs the built daemon on a file and a
// conf.d directory (-c FILE -c DIR): SIGHUP reads both again, so a file
// added to the directory starts its source; `ingestor reload` and
// `ingestor status` with the same -c name the same config.
func TestSIGHUPRereadsASplitConfig(t *testing.T) {
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	httpAddr := testsync.FreePort(t)
	base, confd := filepath.Join(dir, "base.toml"), filepath.Join(dir, "conf.d")
	write := func(path, text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	demo := func(name string) string {
		return fmt.Sprintf("[source.%s]\nkind = \"demo\"\ninterval = \"100ms\"\nevents_per_tick = 1\n", name)
	}
	write(base, daemonTOML(dir, httpAddr, "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t), "", ""))
	if err := os.Mkdir(confd, 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(confd, "10-a.toml"), demo("a"))
	var logs testsync.LockedBuffer
	p := startProc(t, &logs, bin, "run", "-c", base, "-c", confd)
	waitReady(t, httpAddr, p.cmd)

	write(filepath.Join(confd, "20-b.toml"), demo("b"))
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "source b to start after SIGHUP", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), `"config reloaded"`) && strings.Contains(logs.String(), `"start":["b"]`)
	})
	var out, errb bytes.Buffer
	if code := run([]string{"reload", "-c", base, "-c", confd, "-dry-run"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "dry run of "+base+", "+confd+": nothing applied") || !strings.Contains(out.String(), "stay       2  a, b") ||
		strings.Contains(errb.String(), "note:") {
		t.Errorf("reload -dry-run: exit %d\n%s%s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"status", "-c", base, "-c", confd}, &out, &errb); code != 0 || !strings.Contains(out.String(), "config: "+base+", "+confd+", applied") {
		t.Errorf("status: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, tail(logs.String()))
	}
}
