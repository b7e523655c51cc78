package jsonscan

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// Kind is the kind of a JSON value.
type Kind uint8

// The kinds of JSON values. Invalid is the zero Kind, returned with ok false.
const (
	Invalid Kind = iota
	String
	Number
	Bool
	Null
	Object
	Array
)

var kindNames = [...]string{"invalid", "string", "number", "bool", "null", "object", "array"}

// String returns the kind's lowercase name.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Field finds the value at path in record, a JSON object, without decoding
// the rest of it. path is a dotted list of keys into nested objects ("id",
// "meta.updated_at"); a key containing a dot cannot be addressed. Keys are
// compared after unescaping, and the first occurrence of a duplicated key
// wins.
//
// For a string, val is the raw bytes between the quotes (decode them with
// Unquote); for any other kind it is the raw value as written. ok is false
// when the path is absent, when an intermediate value is not an object, or
// when the record is found malformed on the way to the value.
//
// Field validates the keys it compares and the value it returns, but only
// skims the values it passes over (brackets and quotes), so it expects a
// record that was validated already, such as a span returned by SplitArray;
// on other input it never panics, but its answer is unspecified. val
// aliases record.
func Field(record []byte, path string) (val []byte, kind Kind, ok bool) {
	i := skipSpace(record, 0)
	for depth := 1; ; depth++ {
		key, rest, more := strings.Cut(path, ".")
		if i >= len(record) || record[i] != '{' || depth > maxDepth {
			return nil, Invalid, false
		}
		i = skipSpace(record, i+1)
		for {
			if i >= len(record) || record[i] != '"' {
				return nil, Invalid, false // '}' (absent) or malformed
			}
			end, plain, err := scanKey(record, i+1)
			if err != nil {
				return nil, Invalid, false
			}
			match := keyEqual(record[i+1:end], plain, key)
			i = skipSpace(record, end+1)
			if i >= len(record) || record[i] != ':' {
				return nil, Invalid, false
			}
			i = skipSpace(record, i+1)
			if match {
				break
			}
			if i = skipSpace(record, skim(record, i)); i >= len(record) || record[i] != ',' {
				return nil, Invalid, false
			}
			i = skipSpace(record, i+1)
		}
		if !more {
			return valueAt(record, i, depth)
		}
		path = rest
	}
}

// scanKey scans an object key starting just after its opening quote and
// returns the index of the closing quote. plain reports that the key has no
// escapes and only ASCII bytes, so its raw bytes are its text.
func scanKey(b []byte, i int) (end int, plain bool, err error) {
	for j := i; j < len(b); j++ {
		c := b[j]
		if c == '"' {
			return j, true, nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			end, err = skipString(b, j)
			return end, false, err
		}
	}
	return len(b), false, eofErr(len(b))
}

// keyEqual reports whether the raw key decodes to key.
func keyEqual(raw []byte, plain bool, key string) bool {
	if plain {
		return string(raw) == key
	}
	s, err := Unquote(raw)
	return err == nil && s == key
}

// valueAt returns the value that starts at b[i], checking that a ',' or
// '}' follows it.
func valueAt(b []byte, i, depth int) ([]byte, Kind, bool) {
	if i >= len(b) {
		return nil, Invalid, false
	}
	var (
		kind  Kind
		start = i
		end   int // end of the value bytes returned
		next  int // index just past the value
		err   error
	)
	switch c := b[i]; c {
	case '"':
		kind, start = String, i+1
		end, err = skipString(b, start)
		next = end + 1
	case '{', '[':
		kind = Object
		if c == '[' {
			kind = Array
		}
		end, err = skipValue(b, i, depth)
		next = end
	case 't', 'f', 'n':
		kind = Bool
		lit := "true"
		if c == 'f' {
			lit = "false"
		} else if c == 'n' {
			kind, lit = Null, "null"
		}
		end, err = skipLiteral(b, i, lit)
		next = end
	default:
		if c != '-' && !isDigit(c) {
			return nil, Invalid, false
		}
		kind = Number
		end, err = skipNumber(b, i)
		next = end
	}
	if err != nil {
		return nil, Invalid, false
	}
	if j := skipSpace(b, next); j >= len(b) || (b[j] != ',' && b[j] != '}') {
		return nil, Invalid, false
	}
	return b[start:end], kind, true
}

// errBadString is returned by Unquote for bytes that cannot occur inside a
// JSON string.
var errBadString = errors.New("invalid JSON string")

// Unquote decodes the raw bytes between a JSON string's quotes, as returned
// by Field, into the text encoding/json would produce: escapes are resolved,
// and invalid UTF-8 and unpaired surrogates become U+FFFD.
func Unquote(raw []byte) (string, error) {
	i := 0
	for i < len(raw) {
		c := raw[i]
		if c == '\\' || c == '"' || c < 0x20 {
			break
		}
		if c < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(raw[i:])
		if r == utf8.RuneError && size == 1 {
			break
		}
		i += size
	}
	if i == len(raw) {
		return string(raw), nil
	}
	buf := make([]byte, i, len(raw)+8)
	copy(buf, raw[:i])
	for i < len(raw) {
		c := raw[i]
		switch {
		case c == '\\':
			if i+1 >= len(raw) {
				return "", errBadString
			}
			switch e := raw[i+1]; e {
			case '"', '\\', '/':
				buf = append(buf, e)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				r := hex4(raw[i:])
				if r < 0 {
					return "", errBadString
				}
				i += 6
				if utf16.IsSurrogate(r) {
					if dec := utf16.DecodeRune(r, hex4(raw[i:])); dec != utf8.RuneError {
						r = dec
						i += 6
					} else {
						r = utf8.RuneError
					}
				}
				buf = utf8.AppendRune(buf, r)
				continue
			default:
				return "", errBadString
			}
			i += 2
		case c == '"' || c < 0x20:
			return "", errBadString
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			i++
		default:
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				buf = utf8.AppendRune(buf, utf8.RuneError)
			} else {
				buf = append(buf, raw[i:i+size]...)
			}
			i += size
		}
	}
	return string(buf), nil
}

// hex4 decodes a \uXXXX escape at the start of b, or returns -1.
func hex4(b []byte) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range b[2:6] {
		v := hexVal[c]
		if v < 0 {
			return -1
		}
		r = r<<4 | rune(v)
	}
	return r
}

// ScalarText returns a string's text (unescaped) or a number as written;
// "" for any other value.
func ScalarText(val []byte, kind Kind) string {
	switch kind {
	case Number:
		return string(val)
	case String:
		s, err := Unquote(val)
		if err != nil {
			return "" // not for a value Field returned: it validates strings
		}
		return s
	}
	return ""
}

// Time parses a string value, as Field returns it, as an RFC 3339 time;
// it returns the zero time for any other value.
func Time(val []byte, kind Kind) time.Time {
	if kind != String {
		return time.Time{}
	}
	s := string(val)
	if bytes.IndexByte(val, '\\') >= 0 {
		var err error
		if s, err = Unquote(val); err != nil {
			return time.Time{}
		}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}
