package jsonscan

import (
	"encoding/binary"
	"math/bits"
)

// More masks for the word-at-a-time scans. Clearing bit 5 (0x20) folds '{'
// onto '[' and '}' onto ']'.
const (
	low7  = 0x7f7f7f7f7f7f7f7f
	bit5  = 0x20 * lsb
	open  = '[' * lsb
	close = ']' * lsb
)

// eqMask returns a word with the high bit set in each byte lane of x that
// equals the matching lane of pat, and no other bit. Unlike the quicker
// zero-byte test in skipString it has no false positives.
func eqMask(x, pat uint64) uint64 {
	v := x ^ pat
	return ^(((v & low7) + low7) | v) & msb
}

// skim returns the index just past the value that starts at b[i], assuming
// the value is valid JSON, as in a record SplitArray returned. It tracks only
// strings and brackets, eight bytes at a time without a branch per token,
// which makes it several times faster than skipValue on records with many
// short strings. On malformed input it stops somewhere in b (at most
// len(b)); it never reads out of bounds and always ends.
func skim(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skimString(b, i+1)
	case '{', '[':
	default:
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && !isSpace[b[i]] {
			i++
		}
		return i
	}
	var (
		depth   = 0
		inStr   uint64 // msb (every lane) when the word starts inside a string
		escLane uint64 // lane 0 flag when the word starts with an escaped byte
	)
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		q := eqMask(x, quote)
		if bs := eqMask(x, bslsh); bs != 0 || escLane != 0 {
			// A backslash escapes the next byte unless it is escaped itself;
			// only an escaped quote matters here.
			esc := escLane
			escLane = 0
			for m := bs &^ esc; m != 0; m &= m - 1 {
				lane := uint64(1) << bits.TrailingZeros64(m)
				if esc&lane != 0 {
					continue
				}
				if lane == 1<<63 {
					escLane = 1 << 7
				} else {
					esc |= lane << 8
				}
			}
			q &^= esc
		} else if q == 0 && inStr != 0 {
			continue // the middle of a string
		}
		// Each lane's parity of quotes up to and including it says whether
		// it is inside a string (opening quote in, closing quote out).
		p := q
		p ^= p << 8
		p ^= p << 16
		p ^= p << 32
		str := p ^ inStr
		inStr = -(str >> 63) & msb
		f := x &^ bit5
		o := eqMask(f, open) &^ str
		c := eqMask(f, close) &^ str
		if o|c == 0 {
			continue
		}
		if nc := bits.OnesCount64(c); nc < depth {
			depth += bits.OnesCount64(o) - nc
			continue
		}
		for m := o | c; m != 0; m &= m - 1 {
			k := bits.TrailingZeros64(m)
			if o&(1<<k) != 0 {
				depth++
			} else if depth--; depth == 0 {
				return i + k>>3 + 1
			}
		}
	}
	// The last few bytes, one at a time.
	str := inStr != 0
	for esc := escLane != 0; i < len(b); i++ {
		c := b[i]
		switch {
		case esc:
			esc = false
		case str:
			str = c != '"'
			esc = c == '\\'
		case c == '"':
			str = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return len(b)
}

// skimString returns the index just past the closing quote of the string
// whose body starts at b[i], assuming it is valid; len(b) when there is none.
func skimString(b []byte, i int) int {
	for {
		for ; i+8 <= len(b); i += 8 {
			x := binary.LittleEndian.Uint64(b[i:])
			q := x ^ quote
			s := x ^ bslsh
			if t := ((q - lsb) &^ q) | ((s - lsb) &^ s); t&msb != 0 {
				i += bits.TrailingZeros64(t&msb) >> 3
				break
			}
		}
		for i < len(b) && b[i] != '"' && b[i] != '\\' {
			i++
		}
		if i >= len(b) {
			return len(b)
		}
		if b[i] == '"' {
			return i + 1
		}
		i += 2 // an escape: the escaped byte is never the closing quote
	}
}
