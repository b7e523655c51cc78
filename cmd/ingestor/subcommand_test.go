package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestSubcommandHelp: -h on every subcommand that takes -c FILE prints its
// usage and exits 0. Before, `dlq -h` answered "-c FILE is required" and
// `quarantine -h` "unknown command", both with exit 2, and the others
// exited 2 after printing the usage.
func TestSubcommandHelp(t *testing.T) {
	for _, args := range [][]string{
		{"validate", "-h"}, {"doctor", "-h"}, {"check-source", "-h"}, {"reload", "-h"},
		{"dlq", "-h"}, {"dlq", "list", "-h"}, {"quarantine", "--help"}, {"quarantine", "list", "-h"}, {"tap", "-h"},
	} {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		all := out.String() + errb.String()
		if code != 0 || !strings.Contains(all, "-c") || strings.Contains(all, "is required") || strings.Contains(all, "unknown command") {
			t.Errorf("ingestor %s: exit %d, want 0 and the usage:\n%s", strings.Join(args, " "), code, all)
		}
	}
}

// TestEveryCommandAnswersHelpAndVersion: -h and --help on every command,
// the ones without -c FILE too (run, replay, status, healthcheck,
// curve-keygen, edge status exited 2 after their usage), print a usage
// and exit 0; `ingestor --version`, `-version` and `version` print the
// version and exit 0 (--version was "unknown command").
func TestEveryCommandAnswersHelpAndVersion(t *testing.T) {
	for _, cmd := range [][]string{{"run"}, {"replay"}, {"status"}, {"healthcheck"}, {"curve-keygen"}, {"edge"}, {"edge", "status"}, {"tap"}} {
		for _, help := range []string{"-h", "--help"} {
			var out, errb bytes.Buffer
			args := append(append([]string(nil), cmd...), help)
			code := run(args, &out, &errb)
			if all := out.String() + errb.String(); code != 0 || !strings.Contains(strings.ToLower(all), "usage") {
				t.Errorf("ingestor %s: exit %d, want 0 and a usage:\n%s", strings.Join(args, " "), code, all)
			}
		}
	}
	for _, v := range []string{"--version", "-version", "version"} {
		var out, errb bytes.Buffer
		if code := run([]string{v}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "ingestor ") {
			t.Errorf("ingestor %s: exit %d, %q; want 0 and the version", v, code, out.String()+errb.String())
		}
	}
}

// TestSubcommandsShareTheConfigPreamble: every subcommand that loads -c
// FILE reports the same usage error without it and every problem of a bad
// file with file:line.
func TestSubcommandsShareTheConfigPreamble(t *testing.T) {
	for _, sub := range [][]string{{"validate"}, {"dlq", "list"}, {"quarantine", "list"}} {
		var out, errb bytes.Buffer
		if code := run(sub, &out, &errb); code != 2 || !strings.Contains(errb.String(), "ingestor "+strings.Join(sub, " ")+": -c FILE is required") {
			t.Errorf("ingestor %s without -c: exit %d, stderr %q", strings.Join(sub, " "), code, errb.String())
		}
		errb.Reset()
		args := append(append([]string{}, sub...), "-c", "../../testdata/config/bad_duration.bad.toml")
		if code := run(args, &out, &errb); code != 1 || !strings.Contains(errb.String(), "bad_duration.bad.toml:4:") {
			t.Errorf("ingestor %s with a bad file: exit %d, stderr %q", strings.Join(args, " "), code, errb.String())
		}
	}
}
