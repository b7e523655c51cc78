package sources

import (
	"cmp"
	"math/big"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// CompareCursor orders two cursor values and returns -1, 0 or +1 as a is
// before, equal to or after b. When both are decimal numbers (an optional
// sign, digits, an optional fraction and exponent, as JSON numbers are, with
// leading zeros allowed) they compare by value with no loss of precision, so
// "9" < "10" and "1e3" == "1000"; when both are RFC 3339 timestamps they
// compare as instants, so offsets and fractions are handled; anything else
// compares as strings, byte by byte.
//
// The kind is decided per pair, so a cursor field whose values mix kinds
// (numbers and text) has no consistent order: cursor fields should hold one
// kind of value.
func CompareCursor(a, b string) int {
	if isDigits(a) && isDigits(b) { // the common case, without parsing
		a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
		if len(a) != len(b) {
			return cmp.Compare(len(a), len(b))
		}
		return strings.Compare(a, b)
	}
	if da, ok := parseDecimal(a); ok {
		if db, ok := parseDecimal(b); ok {
			return da.cmp(db)
		}
	}
	if ta, ok := parseTimestamp(a); ok {
		if tb, ok := parseTimestamp(b); ok {
			return ta.Compare(tb)
		}
	}
	return strings.Compare(a, b)
}

// parseTimestamp parses an RFC 3339 timestamp, with or without a fraction.
func parseTimestamp(s string) (time.Time, bool) {
	// "2006-01-02T15:04:05Z" is the shortest form; check the shape before
	// paying for time.Parse's error on other strings.
	if len(s) < 20 || s[4] != '-' || s[7] != '-' {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	return t, err == nil
}

// decimal is a parsed decimal number: (-1)^neg × 0.D × 10^exp, where D is
// hi followed by lo, without leading or trailing zeros. D is empty for zero.
type decimal struct {
	neg    bool
	hi, lo string
	exp    int64
	// bigExp replaces exp when the exponent written does not fit in 60 bits.
	bigExp *big.Int
}

func (d decimal) isZero() bool { return d.hi == "" && d.lo == "" }

func (d decimal) digit(i int) byte {
	if i < len(d.hi) {
		return d.hi[i]
	}
	return d.lo[i-len(d.hi)]
}

func isDigit(c byte) bool { return c-'0' < 10 }

// isDigits reports whether s is a non-empty run of ASCII digits.
func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return s != ""
}

// parseDecimal parses [+-]digits[.digits][(e|E)[+-]digits] without
// allocating (unless the exponent is enormous).
func parseDecimal(s string) (decimal, bool) {
	var d decimal
	i := 0
	if i < len(s) && (s[i] == '-' || s[i] == '+') {
		d.neg = s[i] == '-'
		i++
	}
	start := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	intPart := s[start:i]
	if intPart == "" {
		return d, false
	}
	var frac string
	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if frac = s[start:i]; frac == "" {
			return d, false
		}
	}
	var exp string
	expNeg := false
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '-' || s[i] == '+') {
			expNeg = s[i] == '-'
			i++
		}
		start = i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if exp = s[start:i]; exp == "" {
			return d, false
		}
	}
	if i != len(s) {
		return d, false
	}

	// Normalise to 0.D × 10^shift, then add the written exponent.
	intPart = strings.TrimLeft(intPart, "0")
	shift := int64(len(intPart))
	if intPart == "" {
		trimmed := strings.TrimLeft(frac, "0")
		shift = -int64(len(frac) - len(trimmed))
		frac = trimmed
	}
	if frac = strings.TrimRight(frac, "0"); frac == "" {
		intPart = strings.TrimRight(intPart, "0")
	}
	d.hi, d.lo = intPart, frac
	if d.isZero() {
		return decimal{}, true // -0 == 0, and the exponent does not matter
	}
	exp = strings.TrimLeft(exp, "0")
	if len(exp) <= 18 {
		var e int64
		if exp != "" {
			var err error
			if e, err = strconv.ParseInt(exp, 10, 64); err != nil {
				return d, false
			}
		}
		if expNeg {
			e = -e
		}
		d.exp = e + shift // |e| < 1e18 and |shift| < 2^62: no overflow
		return d, true
	}
	e, ok := new(big.Int).SetString(exp, 10)
	if !ok {
		return d, false
	}
	if expNeg {
		e.Neg(e)
	}
	d.bigExp = e.Add(e, big.NewInt(shift))
	return d, true
}

// cmp compares two decimals by value.
func (d decimal) cmp(o decimal) int {
	ds, os := d.sign(), o.sign()
	if ds != os || ds == 0 {
		return cmp.Compare(ds, os)
	}
	if ds < 0 {
		return -d.cmpAbs(o)
	}
	return d.cmpAbs(o)
}

func (d decimal) sign() int {
	switch {
	case d.isZero():
		return 0
	case d.neg:
		return -1
	default:
		return 1
	}
}

// cmpAbs compares the magnitudes of two non-zero decimals: a larger exponent
// wins since D starts with a non-zero digit, then the digits decide.
func (d decimal) cmpAbs(o decimal) int {
	if d.bigExp != nil || o.bigExp != nil {
		if c := d.bigExponent().Cmp(o.bigExponent()); c != 0 {
			return c
		}
	} else if d.exp != o.exp {
		return cmp.Compare(d.exp, o.exp)
	}
	n, m := len(d.hi)+len(d.lo), len(o.hi)+len(o.lo)
	for i := 0; i < n && i < m; i++ {
		if a, b := d.digit(i), o.digit(i); a != b {
			return cmp.Compare(int(a), int(b))
		}
	}
	return cmp.Compare(n, m) // no trailing zeros: more digits is larger
}

func (d decimal) bigExponent() *big.Int {
	if d.bigExp != nil {
		return d.bigExp
	}
	return big.NewInt(d.exp)
}

// fillURLCursor returns rawURL with each {cursor} replaced by cursor,
// escaped as a path segment before the "?" and as a query value after it.
func fillURLCursor(rawURL, cursor string) string {
	if !strings.Contains(rawURL, "{cursor}") {
		return rawURL
	}
	path, query, hasQuery := strings.Cut(rawURL, "?")
	filled := strings.ReplaceAll(path, "{cursor}", url.PathEscape(cursor))
	if hasQuery {
		filled += "?" + strings.ReplaceAll(query, "{cursor}", url.QueryEscape(cursor))
	}
	return filled
}
