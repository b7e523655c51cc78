package config

import (
	"slices"
	"strings"
	"testing"
)

func TestExpandEnv(t *testing.T) {
	env := envOf(map[string]string{"A": "alpha", "EMPTY": "", "Q": `"quoted" ${A}`})
	for _, tc := range []struct {
		in, out  string
		problems []string
		unset    []string
	}{
		{in: "plain", out: "plain"},
		{in: "${A}", out: "alpha"},
		{in: "x-${A}-${A}-y", out: "x-alpha-alpha-y"},
		{in: "${EMPTY}", out: ""},
		{in: "${Q}", out: `"quoted" ${A}`}, // values are not expanded again
		{in: "$${A}", out: "${A}"},
		{in: "$$${A}", out: "$${A}"},
		{in: "$A and $", out: "$A and $"},
		{in: "${MISSING} ${ALSO}", unset: []string{"MISSING", "ALSO"}},
		{in: "${MISSING} ${A", problems: []string{`unterminated "${"`}, unset: []string{"MISSING"}},
		{in: "${A", problems: []string{`unterminated "${"`}},
		{in: "${1X}", problems: []string{`invalid environment variable name "1X"`}},
		{in: "${}", problems: []string{`invalid environment variable name ""`}},
	} {
		out, problems, unset := expandEnv(tc.in, env)
		if !slices.Equal(unset, tc.unset) {
			t.Errorf("expandEnv(%q) unset = %q, want %q", tc.in, unset, tc.unset)
		}
		if len(problems) != len(tc.problems) {
			t.Errorf("expandEnv(%q) problems = %q, want %q", tc.in, problems, tc.problems)
			continue
		}
		for i, p := range problems {
			if !strings.Contains(p, tc.problems[i]) {
				t.Errorf("expandEnv(%q) problem %q, want it to contain %q", tc.in, p, tc.problems[i])
			}
		}
		if len(tc.problems)+len(tc.unset) == 0 && out != tc.out {
			t.Errorf("expandEnv(%q) = %q, want %q", tc.in, out, tc.out)
		}
	}
}
