package config

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// offlineParse parses the testdata file name offline, with no variable
// set.
func offlineParse(t *testing.T, name string) (*Config, error) {
	t.Helper()
	return LoadPaths([]string{filepath.Join(testdata, name)}, Options{Offline: true, Lookup: envOf(nil)})
}

// TestOffline: offline.bad.toml, whose every problem online is a file
// this machine does not have or a variable it does not set, passes an
// offline check, which lists each of them as skipped, and reads none of
// its files.
func TestOffline(t *testing.T) {
	cfg, err := offlineParse(t, "offline.bad.toml")
	if err != nil {
		t.Fatalf("offline: %v", err)
	}
	if got, want := cfg.SkippedSummary(), "4 ${ENV} references, 13 key files"; got != want {
		t.Errorf("skipped %q, want %q", got, want)
	}
	var got []string
	for _, s := range cfg.Skipped {
		got = append(got, strings.TrimPrefix(s.String(), testdata+"/"))
	}
	for _, want := range []string{
		"offline.bad.toml:5: daemon.admin_token_file: file not read: /nonexistent/secrets/admin.token",
		"offline.bad.toml:8: publish.curve_secret_key_file: file not read: /nonexistent/secrets/daemon.key",
		"offline.bad.toml:14: push.tls_key_file: file not read: /nonexistent/secrets/push.key",
		"offline.bad.toml:22: cluster.etcd_key_file: file not read: /nonexistent/secrets/etcd.key",
		"offline.bad.toml:25: cluster.member_name: ${POD_NAME} is not set",
		"offline.bad.toml:26: cluster.advertise_host: ${POD_NAMESPACE} is not set",
		`offline.bad.toml:31: source "orders": headers.Authorization: ${ORDERS_TOKEN} is not set`,
		`offline.bad.toml:32: source "orders": tls_ca_file: file not read: /nonexistent/secrets/orders-ca.crt`,
		`offline.bad.toml:36: source "hooks": token_file: file not read: /nonexistent/secrets/hooks.token`,
		`offline.bad.toml:40: source "devices": tokens_file: file not read: /nonexistent/secrets/device-tokens`,
	} {
		if !slices.Contains(got, want) {
			t.Errorf("skipped lacks %q:\n%s", want, strings.Join(got, "\n"))
		}
	}
	if !slices.IsSortedFunc(cfg.Skipped, func(a, b Skipped) int { return a.Line - b.Line }) {
		t.Errorf("skipped not in line order:\n%s", strings.Join(got, "\n"))
	}
	// A set variable is used and checked, offline too.
	if _, err := LoadPaths([]string{filepath.Join(testdata, "offline.bad.toml")},
		Options{Offline: true, Lookup: envOf(map[string]string{"POD_NAME": "not/a/member"})}); err == nil ||
		!strings.Contains(err.Error(), `cluster.member_name: must be 1-63 letters`) {
		t.Errorf("a set variable with a bad value: err = %v", err)
	}
}

// machineBound are the bad files with problems an offline check cannot
// see (a file's contents, an unset variable): offline, they report fewer
// problems, or none. Every other bad file reports the same problems
// offline as online.
var machineBound = map[string]bool{
	"offline.bad.toml": true, "unset_env.bad.toml": true, "curve.bad.toml": true, "admin_token_file.bad.toml": true,
	"webhook.bad.toml": true, "ws_ingress.bad.toml": true, "cluster.bad.toml": true, "push_client_ca_pem.bad.toml": true,
}

// TestOfflineStillReportsMistakes checks every bad file offline: a
// mistake in the file (an unknown key, a value of the wrong type, a bad
// duration, a missing kind) fails offline as online, with the same
// message; only what needs the machine is left out.
func TestOfflineStillReportsMistakes(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testdata, "*.bad.toml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no bad files: %v", err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		_, onErr := LoadPaths([]string{f}, Options{Lookup: envOf(nil)})
		_, offErr := offlineParse(t, name)
		var on, off Errors
		if !errors.As(onErr, &on) {
			t.Fatalf("%s online: %v", name, onErr)
		}
		errors.As(offErr, &off)
		for _, e := range off {
			if !slices.ContainsFunc(on, func(o *Error) bool { return o.Error() == e.Error() }) {
				t.Errorf("%s: offline reports %q, which online does not", name, e)
			}
		}
		switch {
		case machineBound[name] && len(off) >= len(on):
			t.Errorf("%s: offline reports all %d problems of online: it is not machine-bound", name, len(on))
		case !machineBound[name] && len(off) != len(on):
			t.Errorf("%s: offline reports %d problems, online %d:\noffline:\n%v\nonline:\n%v", name, len(off), len(on), offErr, onErr)
		}
	}
	for _, name := range []string{"unknown_key.bad.toml", "bad_duration.bad.toml", "missing_kind.bad.toml", "many.bad.toml"} {
		if _, err := offlineParse(t, name); err == nil {
			t.Errorf("%s passes offline", name)
		}
	}
}
