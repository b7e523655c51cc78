package config

import (
	"fmt"
	"strings"
)

// expandEnv replaces each ${NAME} in s with the value lookup returns for
// NAME; $${ stands for a literal ${. It returns one problem per malformed
// reference, and the names of the variables that are not set. Problems
// name variables, never values.
func expandEnv(s string, lookup func(string) (string, bool)) (string, []string, []string) {
	if !strings.Contains(s, "${") {
		return s, nil, nil
	}
	var (
		b        strings.Builder
		problems []string
		unset    []string
	)
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			break
		}
		if i > 0 && s[i-1] == '$' {
			// $${ is an escaped ${.
			b.WriteString(s[:i-1])
			b.WriteString("${")
			s = s[i+2:]
			continue
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i+2:], '}')
		if end < 0 {
			problems = append(problems, `unterminated "${" (write "$${" for a literal "${")`)
			b.WriteString(s[i:])
			break
		}
		name := s[i+2 : i+2+end]
		s = s[i+2+end+1:]
		if !isEnvName(name) {
			problems = append(problems, fmt.Sprintf("invalid environment variable name %q in ${...} (want letters, digits and '_', not starting with a digit)", name))
			continue
		}
		v, ok := lookup(name)
		if !ok {
			unset = append(unset, name)
			continue
		}
		b.WriteString(v)
	}
	return b.String(), problems, unset
}

func isEnvName(name string) bool {
	if name == "" || isDigit(name[0]) {
		return false
	}
	for i := range len(name) {
		c := name[i]
		if !(c == '_' || isDigit(c) || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}
