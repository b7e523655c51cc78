package jsonscan

import "bytes"

// Decoder reads one JSON value from a byte slice in a single validating
// pass, for a caller that descends into nested objects and arrays: Object
// and Array call back for each member or element, and the callback reads
// the value there with Value, Object or Array, or leaves it unread to be
// skipped. Every byte is scanned once, however deep the caller descends;
// a value that Value returns whole, such as a nested object nobody looks
// into, is validated as it is skipped.
//
// The accepted syntax is encoding/json.Valid's, nesting limit included,
// as for SplitArray. A malformed value yields a *SyntaxError with the
// offset of the problem in the whole input; what the callbacks were handed
// before it was valid JSON, but the caller learns that the input as a
// whole is valid only when every read, then End, returned nil.
//
// Errors are sticky: once a read has failed, or a callback has returned
// an error, every later read and End return that first error, so a
// callback that drops an error cannot make d accept malformed input.
//
// The zero Decoder reads empty input; Reset gives it something to read. A
// Decoder allocates nothing but the errors it makes, and every slice it
// returns aliases the input.
type Decoder struct {
	b     []byte
	i     int // index of the next byte to read
	depth int // containers open around position i
	err   error
}

// Reset makes d read data, from its start, forgetting any error. A
// callback must not call it.
func (d *Decoder) Reset(data []byte) { *d = Decoder{b: data} }

// Offset returns the offset in the input of the next byte to read: in an
// Object or Array callback, of the value's first byte; after a read, just
// past the value read.
func (d *Decoder) Offset() int { return d.i }

// Peek returns the kind of the next value, judging by its first byte,
// without reading it: Invalid at the end of the input or at a byte that
// cannot start a value. Inside Object and Array callbacks it is never
// Invalid.
func (d *Decoder) Peek() Kind {
	d.i = skipSpace(d.b, d.i)
	if d.i >= len(d.b) || d.err != nil {
		return Invalid
	}
	return kindOfByte[d.b[d.i]]
}

// kindOfByte maps a byte to the kind of the values it starts: '-' and digits
// start numbers; a byte that starts no value maps to Invalid.
var kindOfByte = func() (t [256]Kind) {
	for c := '0'; c <= '9'; c++ {
		t[c] = Number
	}
	t['-'] = Number
	t['"'] = String
	t['t'], t['f'] = Bool, Bool
	t['n'] = Null
	t['{'] = Object
	t['['] = Array
	return t
}()

// Value reads the next value whole and validates it. For a string, val is
// the raw bytes between the quotes (decode them with Unquote); for any
// other kind it is the raw value as written, without the whitespace around
// it.
func (d *Decoder) Value() (val []byte, kind Kind, err error) {
	if d.err != nil {
		return nil, Invalid, d.err
	}
	i := skipSpace(d.b, d.i)
	if i >= len(d.b) && d.depth == 0 {
		d.i = i
		return nil, Invalid, d.fail(syntaxErr(i, "no JSON value"))
	}
	if val, kind, d.i, err = scanValue(d.b, i, d.depth); err != nil {
		return nil, Invalid, d.fail(err)
	}
	return val, kind, nil
}

// Skim reads the next value whole, as Value does, without validating it:
// it trusts the input to be valid JSON (a message its sender validated) and
// tracks only strings and brackets, several times faster than Value on a
// large value. val is as Value's. On invalid input it returns some bytes of
// the input, never reads out of bounds and always ends; what follows the
// value is still read, and checked, by the calls after it.
func (d *Decoder) Skim() (val []byte, kind Kind, err error) {
	if d.err != nil {
		return nil, Invalid, d.err
	}
	i := skipSpace(d.b, d.i)
	if i >= len(d.b) {
		d.i = i
		return nil, Invalid, d.fail(eofErr(i))
	}
	kind = kindOfByte[d.b[i]]
	if kind == Invalid {
		return nil, Invalid, d.fail(syntaxErr(i, "invalid character "+quoteByte(d.b[i])+" looking for the beginning of a value"))
	}
	end := skim(d.b, i)
	d.i = end
	if kind != String {
		return d.b[i:end], kind, nil
	}
	if end-1 <= i || d.b[end-1] != '"' {
		return nil, Invalid, d.fail(eofErr(end))
	}
	return d.b[i+1 : end-1], String, nil
}

// Take reads the next n bytes as a value, without looking at them, for a
// caller that knows the value's length (a payload whose length its message
// states): false, reading nothing, when fewer than n bytes are left or n
// is not positive. What follows is read, and checked, by the calls after
// it, so a wrong length shows there.
func (d *Decoder) Take(n int) (val []byte, ok bool) {
	if d.err != nil || n <= 0 {
		return nil, false
	}
	i := skipSpace(d.b, d.i)
	if n > len(d.b)-i {
		return nil, false
	}
	d.i = i + n
	return d.b[i : i+n], true
}

// ExpectAhead reports whether the input at d's position starts with one of
// texts, reading nothing.
func (d *Decoder) ExpectAhead(texts ...[]byte) bool {
	if d.err != nil {
		return false
	}
	for _, t := range texts {
		if bytes.HasPrefix(d.b[d.i:], t) {
			return true
		}
	}
	return false
}

// A Mark is a position of a Decoder in its input, for Rewind.
type Mark struct{ i, depth int }

// Mark returns d's position.
func (d *Decoder) Mark() Mark { return Mark{d.i, d.depth} }

// Rewind puts d back at m, a position Mark returned earlier on the same
// input, to read again from there: what is read again is validated again.
// Once d has an error it does nothing, as errors are sticky.
func (d *Decoder) Rewind(m Mark) {
	if d.err == nil {
		d.i, d.depth = m.i, m.depth
	}
}

// A Lit is a run of JSON punctuation and object keys for Expect, with the
// containers it opens and closes counted once by NewLit.
type Lit struct {
	text  string
	depth int // containers opened minus containers closed
}

// NewLit returns text as a Lit. text must be JSON punctuation and object
// keys without whitespace, such as `{"key":`, `,"seq":` or `}`; its keys
// must not hold brackets.
func NewLit(text string) Lit {
	l := Lit{text: text}
	for k := range len(text) {
		switch text[k] {
		case '{', '[':
			l.depth++
		case '}', ']':
			l.depth--
		}
	}
	return l
}

// Expect reads lit when the input continues with exactly its text, and
// reports whether it did; otherwise it reads nothing. It is for a caller
// that knows how the input is usually laid out, such as a message its own
// encoder wrote, to read the punctuation and keys between values in one
// comparison: `{"key":` where a value starts, `,"seq":` or `}` after a
// member's value. lit must be such that reading it where it is read keeps
// the input valid: the Decoder does not check lit, it only counts the
// containers lit opens and closes. Values are read with Value, Object and
// Array as usual.
func (d *Decoder) Expect(lit Lit) bool {
	if d.err != nil || len(d.b)-d.i < len(lit.text) || string(d.b[d.i:d.i+len(lit.text)]) != lit.text ||
		d.depth+lit.depth > maxDepth {
		return false
	}
	d.i, d.depth = d.i+len(lit.text), d.depth+lit.depth
	return true
}

// fail makes err d's error, unless d has one already, and returns d's
// error.
func (d *Decoder) fail(err error) error {
	if d.err == nil {
		d.err = err
	}
	return d.err
}

// Object reads the next value, which must be an object, calling fn for
// each member in the order they are written, with d at the member's value.
// key is the raw bytes between the key's quotes. plainKey reports that they
// are the key's text: no escapes and only ASCII, so key can be compared
// with a name directly; otherwise decode it with Unquote to compare.
// Duplicate keys are passed to fn as they come.
//
// fn reads the member's value with one call of Value, Object or Array (and
// any calls of Peek), or none, or reads it piece by piece with Expect
// between such calls, as Expect allows: a value fn leaves unread is
// skipped, and
// validated, when fn returns. When fn returns an error, Object stops and
// returns that error unchanged.
func (d *Decoder) Object(fn func(key []byte, plainKey bool) error) error {
	return d.ObjectNames(nil, func(_ int, key []byte, plainKey bool) error { return fn(key, plainKey) })
}

// ObjectNames is Object for a caller that knows the names members are
// usually written with, in the order they usually come, such as those of
// a message its own encoder wrote: a key written exactly as the next of
// names, or as one after it, is recognized by comparing bytes, without
// scanning it, and fn gets its index in names (key is then its bytes and
// plainKey true). Any other key is scanned as Object scans it, and fn
// gets -1. The object is read and validated as Object reads it, whatever
// the order of its members. Each name must be plain: ASCII without '"',
// '\\' or control bytes.
func (d *Decoder) ObjectNames(names []string, fn func(name int, key []byte, plainKey bool) error) error {
	b := d.b
	i, err := d.open('{')
	if err != nil {
		return err
	}
	next := 0 // the index in names to look for first
	if b[i] != '}' {
		for {
			if b[i] != '"' {
				return d.fail(syntaxErr(i, "expected string for object key"))
			}
			k, end, plain := -1, 0, false
			for j := next; j < len(names); j++ {
				if e := i + 1 + len(names[j]); e < len(b) && b[e] == '"' && string(b[i+1:e]) == names[j] {
					k, end, plain, next = j, e, true, j+1
					break
				}
			}
			if k < 0 {
				if end, plain, err = scanKey(b, i+1); err != nil {
					return d.fail(err)
				}
			}
			key := b[i+1 : end]
			i = skipSpace(b, end+1)
			if i >= len(b) {
				return d.fail(eofErr(i))
			}
			if b[i] != ':' {
				return d.fail(syntaxErr(i, "expected ':' after object key"))
			}
			if i, err = d.enter(skipSpace(b, i+1)); err != nil {
				return err
			}
			if err := fn(k, key, plain); err != nil {
				return d.fail(err)
			}
			if i, err = d.leave(i, '{'); err != nil {
				return err
			}
			if b[i] == '}' {
				break
			}
			if i = skipSpace(b, i+1); i >= len(b) {
				return d.fail(eofErr(i))
			}
		}
	}
	d.i, d.depth = i+1, d.depth-1
	return nil
}

// Array reads the next value, which must be an array, calling fn for each
// element in order, with d at the element. fn reads the element as
// Object's fn reads a member's value, or leaves it to be skipped; an error
// from fn is returned unchanged.
func (d *Decoder) Array(fn func() error) error {
	b := d.b
	i, err := d.open('[')
	if err != nil {
		return err
	}
	if b[i] != ']' {
		for {
			if i, err = d.enter(i); err != nil {
				return err
			}
			if err := fn(); err != nil {
				return d.fail(err)
			}
			if i, err = d.leave(i, '['); err != nil {
				return err
			}
			if b[i] == ']' {
				break
			}
			i = skipSpace(b, i+1)
		}
	}
	d.i, d.depth = i+1, d.depth-1
	return nil
}

// End checks that nothing but whitespace follows the value read.
func (d *Decoder) End() error {
	if d.err != nil {
		return d.err
	}
	if i := skipSpace(d.b, d.i); i < len(d.b) {
		return d.fail(syntaxErr(i, "unexpected data after the value"))
	}
	return nil
}

// open reads the opening bracket of a container and returns the index of
// the first non-whitespace byte inside it, which is in bounds.
func (d *Decoder) open(bracket byte) (int, error) {
	if d.err != nil {
		return d.i, d.err
	}
	b := d.b
	i := skipSpace(b, d.i)
	if i >= len(b) {
		if d.depth == 0 {
			return i, d.fail(syntaxErr(i, "no JSON value, expected an "+containerName(bracket)))
		}
		return i, d.fail(eofErr(i))
	}
	if c := b[i]; c != bracket {
		if kindOfByte[c] == Invalid {
			return i, d.fail(syntaxErr(i, "invalid character "+quoteByte(c)+" looking for a value"))
		}
		return i, d.fail(syntaxErr(i, "not a JSON "+containerName(bracket)+" (found "+describe(c)+")"))
	}
	if d.depth+1 > maxDepth {
		return i, d.fail(syntaxErr(i, "nesting too deep"))
	}
	d.depth++
	i = skipSpace(b, i+1)
	if i >= len(b) {
		return i, d.fail(eofErr(i))
	}
	return i, nil
}

// enter checks that a value starts at b[i], where Object or Array hands
// it to its callback, and puts d there.
func (d *Decoder) enter(i int) (int, error) {
	if i >= len(d.b) {
		return i, d.fail(eofErr(i))
	}
	if c := d.b[i]; kindOfByte[c] == Invalid {
		return i, d.fail(syntaxErr(i, "invalid character "+quoteByte(c)+" looking for a value"))
	}
	d.i = i
	return i, nil
}

// leave skips the value that starts at b[start] if the callback left it
// unread, and returns the index of the ',' or the closing bracket of the
// container opened by bracket that must follow it, which is in bounds.
func (d *Decoder) leave(start int, bracket byte) (int, error) {
	if d.err != nil {
		return d.i, d.err
	}
	if d.i == start {
		if _, _, err := d.Value(); err != nil {
			return d.i, err
		}
	}
	b := d.b
	i := skipSpace(b, d.i)
	if i >= len(b) {
		return i, d.fail(eofErr(i))
	}
	if c := b[i]; c != ',' && c != bracket+2 {
		return i, d.fail(syntaxErr(i, "expected ',' or "+quoteByte(bracket+2)+" after "+containerName(bracket)+" element"))
	}
	return i, nil
}

// scanValue validates the value starting at b[i], inside depth containers,
// and returns it as Decoder.Value does, with the index just past it.
func scanValue(b []byte, i, depth int) (val []byte, kind Kind, next int, err error) {
	if i >= len(b) {
		return nil, Invalid, i, eofErr(i)
	}
	switch c := b[i]; c {
	case '"':
		end, err := skipString(b, i+1)
		if err != nil {
			return nil, Invalid, end, err
		}
		return b[i+1 : end], String, end + 1, nil
	case '{', '[':
		kind = Object
		if c == '[' {
			kind = Array
		}
		next, err = skipValue(b, i, depth)
	case 't':
		kind = Bool
		next, err = skipLiteral(b, i, "true")
	case 'f':
		kind = Bool
		next, err = skipLiteral(b, i, "false")
	case 'n':
		kind = Null
		next, err = skipLiteral(b, i, "null")
	default:
		if c != '-' && !isDigit(c) {
			return nil, Invalid, i, syntaxErr(i, "invalid character "+quoteByte(c)+" looking for a value")
		}
		kind = Number
		next, err = skipNumber(b, i)
	}
	if err != nil {
		return nil, Invalid, next, err
	}
	return b[i:next], kind, next, nil
}
