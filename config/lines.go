package config

import (
	"strconv"
	"strings"
)

// lineIndex maps a dotted key path (joined with pathSep) to the line where
// it is first defined. BurntSushi/toml keeps key positions private, so the
// index is built by a small scanner over text that toml has already parsed
// without error.
type lineIndex map[string]int

const pathSep = "\x00"

// indexLines scans valid TOML text and records the line of every table
// header, every key and every implicit parent of a dotted key. Keys inside
// inline tables are recorded at their own line; lookups of anything the scan
// could not see fall back to the nearest recorded parent.
func indexLines(src string) lineIndex {
	s := &lineScanner{src: strings.TrimPrefix(src, "\ufeff"), line: 1, idx: lineIndex{}}
	s.document()
	return s.idx
}

// lookup returns the line of path or, failing that, of its nearest recorded
// parent: a missing key is reported at its table header, and a key inside an
// inline table the scan did not resolve at the line of the table's key.
// It returns 0 when nothing on the path was recorded.
func (ix lineIndex) lookup(path []string) int {
	for n := len(path); n > 0; n-- {
		if line, ok := ix[strings.Join(path[:n], pathSep)]; ok {
			return line
		}
	}
	return 0
}

// lineScanner is a recursive-descent walk over TOML text that only tracks
// structure: table headers, keys, strings, arrays and inline tables. Every
// step consumes at least one byte, so it terminates on any input.
type lineScanner struct {
	src  string
	pos  int
	line int
	idx  lineIndex
}

func (s *lineScanner) eof() bool { return s.pos >= len(s.src) }

func (s *lineScanner) peek() byte {
	if s.eof() {
		return 0
	}
	return s.src[s.pos]
}

func (s *lineScanner) hasPrefix(p string) bool { return strings.HasPrefix(s.src[s.pos:], p) }

// advance consumes one byte, counting lines.
func (s *lineScanner) advance() {
	if s.src[s.pos] == '\n' {
		s.line++
	}
	s.pos++
}

// record notes line as the line of path and of each of its parents not yet
// recorded; the first definition wins.
func (s *lineScanner) record(path []string, line int) {
	for n := 1; n <= len(path); n++ {
		k := strings.Join(path[:n], pathSep)
		if _, ok := s.idx[k]; !ok {
			s.idx[k] = line
		}
	}
}

// skipBlank skips spaces and tabs, and also newlines and comments when nl is set.
func (s *lineScanner) skipBlank(nl bool) {
	for !s.eof() {
		switch c := s.peek(); {
		case c == ' ' || c == '\t' || c == '\r':
			s.pos++
		case c == '\n' && nl:
			s.advance()
		case c == '#' && nl:
			for !s.eof() && s.peek() != '\n' {
				s.pos++
			}
		default:
			return
		}
	}
}

// skipLine consumes the rest of the current line, newline included.
func (s *lineScanner) skipLine() {
	for !s.eof() && s.peek() != '\n' {
		s.pos++
	}
	if !s.eof() {
		s.advance()
	}
}

func (s *lineScanner) document() {
	var table []string
	for {
		s.skipBlank(true)
		if s.eof() {
			return
		}
		start := s.pos
		if s.peek() == '[' {
			s.pos++
			if s.peek() == '[' {
				s.pos++
			}
			line := s.line
			table = s.keyParts()
			s.record(table, line)
			s.skipLine()
		} else {
			s.keyval(table)
		}
		if s.pos == start {
			s.advance()
		}
	}
}

// keyval scans `key = value` and records the key under prefix.
func (s *lineScanner) keyval(prefix []string) {
	line := s.line
	parts := s.keyParts()
	if len(parts) == 0 {
		return
	}
	path := append(append([]string(nil), prefix...), parts...)
	s.record(path, line)
	s.skipBlank(false)
	if s.peek() == '=' {
		s.pos++
	}
	s.skipBlank(false)
	s.value(path)
}

// keyParts scans a possibly dotted, possibly quoted key.
func (s *lineScanner) keyParts() []string {
	var parts []string
	for {
		s.skipBlank(false)
		switch c := s.peek(); {
		case c == '"' || c == '\'':
			parts = append(parts, s.quoted())
		case isBareKeyChar(c):
			start := s.pos
			for !s.eof() && isBareKeyChar(s.peek()) {
				s.pos++
			}
			parts = append(parts, s.src[start:s.pos])
		default:
			return parts
		}
		s.skipBlank(false)
		if s.peek() != '.' {
			return parts
		}
		s.pos++
	}
}

func isBareKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// quoted scans a single-line basic or literal string and returns its value.
func (s *lineScanner) quoted() string {
	q := s.peek()
	start := s.pos
	s.pos++
	for !s.eof() && s.peek() != q && s.peek() != '\n' {
		if q == '"' && s.peek() == '\\' && s.pos+1 < len(s.src) {
			s.pos++
		}
		s.pos++
	}
	if s.peek() == q {
		s.pos++
	}
	raw := s.src[start:s.pos]
	if q == '\'' {
		return strings.Trim(raw, "'")
	}
	if v, err := strconv.Unquote(raw); err == nil {
		return v
	}
	return strings.Trim(raw, `"`)
}

// value scans one value of the key at path.
func (s *lineScanner) value(path []string) {
	switch {
	case s.hasPrefix(`"""`), s.hasPrefix(`'''`):
		s.multiline(s.src[s.pos : s.pos+3])
	case s.peek() == '"' || s.peek() == '\'':
		s.quoted()
	case s.peek() == '[':
		s.container(']', func() { s.value(path) })
	case s.peek() == '{':
		s.container('}', func() { s.keyval(path) })
	default:
		s.scalar()
	}
}

// container scans an array or inline table from its opening bracket to
// closing, calling item for each element or key/value pair; an item that
// consumes nothing is skipped a character at a time, so a malformed
// container still ends.
func (s *lineScanner) container(closing byte, item func()) {
	s.pos++
	for {
		s.skipBlank(true)
		switch {
		case s.eof():
			return
		case s.peek() == closing:
			s.pos++
			return
		case s.peek() == ',':
			s.pos++
		default:
			start := s.pos
			item()
			if s.pos == start {
				s.advance()
			}
		}
	}
}

// multiline scans a multi-line string, whose delimiter is three double or
// three single quotes, and which may span lines.
func (s *lineScanner) multiline(delim string) {
	s.pos += 3
	for !s.eof() {
		if delim == `"""` && s.peek() == '\\' && s.pos+1 < len(s.src) {
			s.pos++
			s.advance()
			continue
		}
		if s.hasPrefix(delim) {
			s.pos += 3
			// Up to two more quotes belong to the content: """a"""" is `a"`.
			for i := 0; i < 2 && s.peek() == delim[0]; i++ {
				s.pos++
			}
			return
		}
		s.advance()
	}
}

// scalar scans a number, boolean or date-time. A date and a time may be
// separated by one space (1979-05-27 07:32:00Z).
func (s *lineScanner) scalar() {
	start := s.pos
	for !s.eof() && !strings.ContainsRune(" \t\r\n,]}#", rune(s.peek())) {
		s.pos++
	}
	if isDate(s.src[start:s.pos]) && s.peek() == ' ' && s.pos+1 < len(s.src) && isDigit(s.src[s.pos+1]) {
		s.pos++
		s.scalar()
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isDate reports whether tok is a full date such as 1979-05-27.
func isDate(tok string) bool {
	if len(tok) != 10 || tok[4] != '-' || tok[7] != '-' {
		return false
	}
	for i := range len(tok) {
		if i != 4 && i != 7 && !isDigit(tok[i]) {
			return false
		}
	}
	return true
}
