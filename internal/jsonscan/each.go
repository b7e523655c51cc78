package jsonscan

// ObjectEach calls fn for each member of obj, a JSON object with optional
// whitespace around it, in the order they are written. It validates obj in
// the same single pass: anything but exactly one valid JSON object
// (another kind of value, malformed or truncated JSON, trailing data) makes
// it return a *SyntaxError with the offset of the problem.
//
// key is the raw bytes between the key's quotes. plainKey reports that they
// are the key's text: no escapes and only ASCII, so key can be compared
// with a name directly; otherwise decode it with Unquote to compare. For a
// string value, val is the raw bytes between the quotes (decode them with
// Unquote); for any other kind it is the raw value as written, without the
// whitespace around it. kind is never Invalid. Duplicate keys are passed to
// fn as they come.
//
// Every val handed to fn is a complete, valid JSON value, but later members
// are validated after fn has seen earlier ones, so fn may have been called
// for some members when ObjectEach reports an error. A nested object or
// array is validated as a whole before fn sees it: iterating it with
// another ObjectEach or ArrayEach scans its bytes again, which a Decoder
// avoids.
//
// When fn returns an error, ObjectEach stops and returns that error
// unchanged. key and val alias obj; ObjectEach allocates nothing but the
// errors it makes.
func ObjectEach(obj []byte, fn func(key []byte, plainKey bool, val []byte, kind Kind) error) error {
	d := Decoder{b: obj}
	err := d.Object(func(key []byte, plainKey bool) error {
		val, kind, err := d.Value()
		if err != nil {
			return err
		}
		return fn(key, plainKey, val, kind)
	})
	if err != nil {
		return err
	}
	return d.end("object")
}

// ArrayEach calls fn for each element of arr, a JSON array with optional
// whitespace around it, in order. It validates arr in the same single pass,
// as ObjectEach validates an object, and returns a *SyntaxError for
// anything but exactly one valid JSON array.
//
// For a string element, elem is the raw bytes between the quotes (decode
// them with Unquote); for any other kind it is the raw element as written,
// without the whitespace around it. The rest is as for ObjectEach: every
// elem is complete and valid, fn may have been called for earlier elements
// when ArrayEach reports an error, an error from fn is returned unchanged,
// and elem aliases arr.
func ArrayEach(arr []byte, fn func(elem []byte, kind Kind) error) error {
	d := Decoder{b: arr}
	err := d.Array(func() error {
		elem, kind, err := d.Value()
		if err != nil {
			return err
		}
		return fn(elem, kind)
	})
	if err != nil {
		return err
	}
	return d.end("array")
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
