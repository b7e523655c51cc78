package jsonscan

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// maxDepth is the deepest nesting accepted, counting the outermost
// container as 1. It is encoding/json's limit, so that SplitArray accepts
// exactly the arrays json.Valid accepts.
const maxDepth = 10000

// SyntaxError is malformed or truncated input at a byte offset.
type SyntaxError struct {
	// Offset is the byte offset in the input where the problem was found.
	Offset int
	// Reason says what is wrong, e.g. "unterminated string".
	Reason string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("%s at offset %d", e.Reason, e.Offset)
}

func syntaxErr(off int, reason string) error {
	return &SyntaxError{Offset: off, Reason: reason}
}

// eofErr is the error for input that ends where more was needed.
func eofErr(off int) error { return syntaxErr(off, "unexpected end of input") }

// isSpace reports the four whitespace bytes JSON allows between tokens.
var isSpace = [256]bool{' ': true, '\t': true, '\n': true, '\r': true}

// skipSpace returns the index of the first non-whitespace byte at or after i.
func skipSpace(b []byte, i int) int {
	// Most tokens follow each other without whitespace: any byte above ' '
	// ends the skip without a table lookup.
	for i < len(b) && b[i] <= ' ' && isSpace[b[i]] {
		i++
	}
	return i
}

// Masks for the SWAR string scan, eight bytes at a time.
const (
	lsb   = 0x0101010101010101
	msb   = 0x8080808080808080
	quote = '"' * lsb
	bslsh = '\\' * lsb
	ctl   = 0x20 * lsb
)

// skipString scans a string body starting just after its opening quote and
// returns the index of the closing quote.
func skipString(b []byte, i int) (int, error) {
	for {
		// Eight bytes at a time, stop at the first '"', '\\' or control byte.
		// Each zero-byte test can flag false positives only above a true
		// positive, so the lowest flagged byte is exact.
		for ; i+8 <= len(b); i += 8 {
			x := binary.LittleEndian.Uint64(b[i:])
			q := x ^ quote
			s := x ^ bslsh
			if t := ((q - lsb) &^ q) | ((s - lsb) &^ s) | ((x - ctl) &^ x); t&msb != 0 {
				i += bits.TrailingZeros64(t&msb) >> 3
				goto special
			}
		}
		for ; i < len(b); i++ {
			if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
				goto special
			}
		}
		return i, syntaxErr(i, "unterminated string")
	special:
		switch b[i] {
		case '"':
			return i, nil
		case '\\':
			n, err := skipEscape(b, i)
			if err != nil {
				return n, err
			}
			i = n
		default:
			return i, syntaxErr(i, "control character in string")
		}
	}
}

// shortString returns the index of the closing quote of the string whose
// body starts at b[i] when that quote is in the body's first eight bytes
// and nothing before it is a backslash or a control byte, as in most keys;
// otherwise -1, and skipString must scan it. It is small enough to be
// inlined.
func shortString(b []byte, i int) int {
	if i+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[i:])
		q, s := x^quote, x^bslsh
		// As in skipString, the lowest flagged byte is exact.
		t := ((q - lsb) &^ q) | ((s - lsb) &^ s) | ((x - ctl) &^ x)
		if k := i + bits.TrailingZeros64(t&msb)>>3; k < i+8 && b[k] == '"' {
			return k
		}
	}
	return -1
}

// skipEscape validates the escape sequence at b[i] == '\\' and returns the
// index just past it.
func skipEscape(b []byte, i int) (int, error) {
	if i+1 >= len(b) {
		return i + 1, syntaxErr(i+1, "unterminated string")
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2, nil
	case 'u':
		for k := i + 2; k < i+6; k++ {
			if k >= len(b) {
				return k, syntaxErr(k, "unterminated string")
			}
			if hexVal[b[k]] < 0 {
				return k, syntaxErr(k, "invalid \\u escape in string")
			}
		}
		return i + 6, nil
	default:
		return i + 1, syntaxErr(i+1, "invalid escape in string")
	}
}

// hexVal maps a hex digit to its value and any other byte to -1.
var hexVal = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = int8(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = int8(c - 'a' + 10)
		t[c-'a'+'A'] = int8(c - 'a' + 10)
	}
	return t
}()

func isDigit(c byte) bool { return c-'0' < 10 }

// skipNumber validates the number starting at b[i] and returns the index
// just past it. What follows is checked by the caller.
func skipNumber(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return i, eofErr(i)
	case b[i] == '0':
		i++
	case isDigit(b[i]):
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	default:
		return i, syntaxErr(i, "invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return i, syntaxErr(i, "invalid number: digit expected after '.'")
		}
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return i, syntaxErr(i, "invalid number: digit expected in exponent")
		}
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	return i, nil
}

// skipLiteral checks that b[i:] starts with lit and returns the index just
// past it.
func skipLiteral(b []byte, i int, lit string) (int, error) {
	for k := 0; k < len(lit); k++ {
		if i+k >= len(b) {
			return i + k, eofErr(i + k)
		}
		if b[i+k] != lit[k] {
			return i + k, syntaxErr(i+k, "invalid literal, expected "+lit)
		}
	}
	return i + len(lit), nil
}

// skipKey validates an object key and its colon, starting at b[i], and
// returns the index of the value after them (whitespace skipped).
func skipKey(b []byte, i int) (int, error) {
	if i >= len(b) {
		return i, eofErr(i)
	}
	if b[i] != '"' {
		return i, syntaxErr(i, "expected string for object key")
	}
	if k := shortString(b, i+1); k >= 0 && k+2 < len(b) && b[k+1] == ':' && b[k+2] > ' ' {
		return k + 2, nil // "key":value, as most encoders write it
	}
	i, err := skipString(b, i+1)
	if err != nil {
		return i, err
	}
	i = skipSpace(b, i+1)
	if i >= len(b) {
		return i, eofErr(i)
	}
	if b[i] != ':' {
		return i, syntaxErr(i, "expected ':' after object key")
	}
	return skipSpace(b, i+1), nil
}

// skipValue validates the JSON value starting at b[i] (leading whitespace
// allowed) and returns the index just past it. depth is the number of
// containers that enclose the value. It is iterative, so deep nesting costs
// heap, not stack.
func skipValue(b []byte, i, depth int) (int, error) {
	var buf [64]byte
	stack := buf[:0] // the open containers: '{' or '['
	var err error
	for {
		// A value is expected at i.
		i = skipSpace(b, i)
		if i >= len(b) {
			return i, eofErr(i)
		}
		switch c := b[i]; c {
		case '"':
			if i, err = skipString(b, i+1); err != nil {
				return i, err
			}
			i++
		case '{', '[':
			if depth+len(stack)+1 > maxDepth {
				return i, syntaxErr(i, "nesting too deep")
			}
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' or ']'
				i++
				break
			}
			stack = append(stack, c)
			if c == '{' {
				if i, err = skipKey(b, i); err != nil {
					return i, err
				}
			}
			continue
		case 't':
			if i, err = skipLiteral(b, i, "true"); err != nil {
				return i, err
			}
		case 'f':
			if i, err = skipLiteral(b, i, "false"); err != nil {
				return i, err
			}
		case 'n':
			if i, err = skipLiteral(b, i, "null"); err != nil {
				return i, err
			}
		default:
			if c != '-' && !isDigit(c) {
				return i, syntaxErr(i, "invalid character "+quoteByte(c)+" looking for a value")
			}
			if i, err = skipNumber(b, i); err != nil {
				return i, err
			}
		}
		// After a value: close finished containers, or move on to the next
		// element of the innermost one.
		for {
			if len(stack) == 0 {
				return i, nil
			}
			i = skipSpace(b, i)
			if i >= len(b) {
				return i, eofErr(i)
			}
			top := stack[len(stack)-1]
			if b[i] == top+2 {
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			if b[i] != ',' {
				return i, syntaxErr(i, "expected ',' or "+quoteByte(top+2)+" after "+containerName(top)+" element")
			}
			i++
			if top == '{' {
				if i, err = skipKey(b, skipSpace(b, i)); err != nil {
					return i, err
				}
			}
			break
		}
	}
}

func containerName(open byte) string {
	if open == '{' {
		return "object"
	}
	return "array"
}

// quoteByte renders c for an error message.
func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f && c != '\'' {
		return "'" + string(rune(c)) + "'"
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

// describe names the kind of value that starts with c, for the message
// about a payload that is not an array.
func describe(c byte) string {
	switch {
	case c == '{':
		return "an object"
	case c == '"':
		return "a string"
	case c == '-' || isDigit(c):
		return "a number"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	default:
		return quoteByte(c)
	}
}
