package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"
)

// The seed corpora are in testdata/fuzz/FuzzDecoderObject,
// testdata/fuzz/FuzzDecoderArray and testdata/fuzz/FuzzDecoder.

// FuzzDecoderObject checks a Decoder reading one object's members whole
// (objectEach) against encoding/json: it accepts exactly the valid JSON
// objects, and hands over the members a walk with encoding/json's
// tokenizer finds, duplicates included.
func FuzzDecoderObject(f *testing.F) {
	f.Fuzz(func(t *testing.T, obj []byte) {
		var got []member
		err := objectEach(obj, func(key []byte, plain bool, val []byte, kind Kind) error {
			if !within(key, obj) || !within(val, obj) {
				t.Fatalf("key %q or value %q is not a part of the input", key, val)
			}
			got = append(got, member{string(key), plain, string(val), kind})
			return nil
		})
		trimmed := bytes.TrimLeft(obj, " \t\r\n")
		isObject := json.Valid(obj) && len(trimmed) > 0 && trimmed[0] == '{'
		if err != nil {
			if isObject {
				t.Fatalf("objectEach rejected a valid object: %v", err)
			}
			checkSyntaxError(t, err, obj)
			return
		}
		if !isObject {
			t.Fatalf("objectEach accepted something that is not a valid JSON object: %v", got)
		}
		keys, vals, ok := referenceMembers(t, obj)
		if !ok {
			t.Fatalf("encoding/json: %q is not an object", obj)
		}
		if len(got) != len(keys) {
			t.Fatalf("objectEach found %d members, encoding/json %d", len(got), len(keys))
		}
		for k, m := range got {
			checkKey(t, []byte(m.key), m.plain, keys[k])
			checkValue(t, []byte(m.val), m.kind, vals[k])
		}
	})
}

// FuzzDecoderArray checks a Decoder reading one array's elements whole
// (arrayEach) against encoding/json as FuzzSplitArray checks SplitArray.
func FuzzDecoderArray(f *testing.F) {
	f.Fuzz(func(t *testing.T, arr []byte) {
		type elem struct {
			val  []byte
			kind Kind
		}
		var got []elem
		err := arrayEach(arr, func(val []byte, kind Kind) error {
			if !within(val, arr) {
				t.Fatalf("element %q is not a part of the input", val)
			}
			got = append(got, elem{val, kind})
			return nil
		})
		trimmed := bytes.TrimLeft(arr, " \t\r\n")
		isArray := json.Valid(arr) && len(trimmed) > 0 && trimmed[0] == '['
		if err != nil {
			if isArray {
				t.Fatalf("arrayEach rejected a valid array: %v", err)
			}
			checkSyntaxError(t, err, arr)
			return
		}
		if !isArray {
			t.Fatalf("arrayEach accepted something that is not a valid JSON array: %d elements", len(got))
		}
		var want []json.RawMessage
		if err := json.Unmarshal(arr, &want); err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		if len(got) != len(want) {
			t.Fatalf("arrayEach found %d elements, encoding/json %d", len(got), len(want))
		}
		for k, e := range got {
			checkValue(t, e.val, e.kind, want[k])
		}
	})
}

// FuzzDecoder walks arbitrary input with a Decoder, descending into
// containers, reading them whole or leaving them unread as the bits of
// modes say, and checks that it accepts exactly valid JSON and finds the
// value encoding/json decodes.
func FuzzDecoder(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, modes uint64) {
		var d Decoder
		d.Reset(data)
		w := walker{t: t, d: &d, data: data, modes: modes}
		got, err := w.value(false)
		if err == nil {
			err = d.End()
		}
		if !json.Valid(data) {
			if err == nil {
				t.Fatalf("Decoder accepted invalid JSON as %#v", got)
			}
			checkSyntaxError(t, err, data)
			return
		}
		if err != nil {
			t.Fatalf("Decoder rejected valid JSON: %v", err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var want any
		if err := dec.Decode(&want); err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		if !matches(got, want) {
			t.Fatalf("Decoder found %#v\nencoding/json     %#v", got, want)
		}
	})
}

// unread stands for a value a walker left to the Decoder to skip.
type unread struct{}

// walker reads a value with a Decoder into what encoding/json decodes into
// an any with UseNumber, choosing how to read each value by the next two
// bits of modes: descend into a container, read it whole with Value, or
// leave it unread.
type walker struct {
	t     *testing.T
	d     *Decoder
	data  []byte
	modes uint64
}

func (w *walker) mode() uint64 {
	m := w.modes & 3
	w.modes = w.modes>>2 | w.modes<<62
	return m
}

// value reads the value at the Decoder, or leaves it unread when it may.
func (w *walker) value(mayLeave bool) (any, error) {
	kind := w.d.Peek()
	mode := w.mode()
	if mayLeave && kind == Invalid {
		w.t.Fatalf("Peek in a callback is Invalid at offset %d", w.d.Offset())
	}
	switch {
	case mode == 3 && mayLeave:
		return unread{}, nil
	case mode != 2 && kind == Object:
		m := map[string]any{}
		err := w.d.Object(func(key []byte, plain bool) error {
			k, err := Unquote(key)
			if err != nil {
				w.t.Fatalf("Unquote(%q): %v", key, err)
			}
			if plain && string(key) != k {
				w.t.Fatalf("plain key %q unquotes to %q", key, k)
			}
			v, err := w.value(true)
			m[k] = v
			return err
		})
		return m, err
	case mode != 2 && kind == Array:
		a := []any{}
		err := w.d.Array(func() error {
			v, err := w.value(true)
			a = append(a, v)
			return err
		})
		return a, err
	}
	val, got, err := w.d.Value()
	if err != nil {
		return nil, err
	}
	if got != kind || !within(val, w.data) {
		w.t.Fatalf("Value %q of kind %v, Peek said %v", val, got, kind)
	}
	switch kind {
	case String:
		s, err := Unquote(val)
		if err != nil {
			w.t.Fatalf("Unquote(%q): %v", val, err)
		}
		return s, nil
	case Number:
		return json.Number(val), nil
	case Bool:
		return string(val) == "true", nil
	case Null:
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(val))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		w.t.Fatalf("encoding/json rejects the %v %q Value returned: %v", kind, val, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		w.t.Fatalf("Value %q is followed by more data", val)
	}
	return v, nil
}

// matches compares a walker's result with encoding/json's, an unread
// value matching anything.
func matches(got, want any) bool {
	switch g := got.(type) {
	case unread:
		return true
	case map[string]any:
		w, ok := want.(map[string]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for k, v := range g {
			if wv, ok := w[k]; !ok || !matches(v, wv) {
				return false
			}
		}
		return true
	case []any:
		w, ok := want.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for k := range g {
			if !matches(g[k], w[k]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(got, want)
}

// referenceMembers walks valid JSON with encoding/json's tokenizer,
// returning every key of the object it is, duplicates included, with its
// raw value; ok is false when it is not an object.
func referenceMembers(t *testing.T, obj []byte) (keys []string, vals []json.RawMessage, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		keys = append(keys, tok.(string))
		vals = append(vals, v)
	}
	return keys, vals, true
}

// checkKey checks a raw key against the text encoding/json decoded.
func checkKey(t *testing.T, raw []byte, plain bool, want string) {
	t.Helper()
	got, err := Unquote(raw)
	if err != nil || got != want {
		t.Fatalf("key %q unquotes to %q, %v; encoding/json found %q", raw, got, err, want)
	}
	isPlain := true
	for _, c := range raw {
		if c == '\\' || c >= 0x80 {
			isPlain = false
		}
	}
	if plain != isPlain {
		t.Fatalf("key %q: plainKey %v", raw, plain)
	}
}

// checkValue checks a value as Value returns it against the raw value
// encoding/json found.
func checkValue(t *testing.T, val []byte, kind Kind, want json.RawMessage) {
	t.Helper()
	if wantKind := kindOf(want[0]); kind != wantKind {
		t.Fatalf("value %q of kind %v, want %v", val, kind, wantKind)
	}
	if kind == String {
		want = want[1 : len(want)-1]
	}
	if !bytes.Equal(val, want) {
		t.Fatalf("value %q, encoding/json found %q", val, want)
	}
}

func checkSyntaxError(t *testing.T, err error, in []byte) {
	t.Helper()
	var se *SyntaxError
	if !errors.As(err, &se) || se.Offset < 0 || se.Offset > len(in) || se.Reason == "" {
		t.Fatalf("error %#v is not a *SyntaxError within the input", err)
	}
}

// TestDecoderErrorsAreSticky checks that a callback that drops an error
// cannot make a Decoder accept malformed input.
func TestDecoderErrorsAreSticky(t *testing.T) {
	for _, in := range []string{
		`{"a":[1,}, "b":2}`,  // a syntax error dropped
		`{"a":{"x":1,"y":2}`, // a callback's error dropped mid-object
	} {
		var d Decoder
		d.Reset([]byte(in))
		stop := errors.New("stop")
		err := d.Object(func([]byte, bool) error {
			if d.Peek() == Object {
				_ = d.Object(func([]byte, bool) error { return stop }) // dropped on purpose
				return nil
			}
			_, _, _ = d.Value() // dropped on purpose
			return nil
		})
		if err == nil {
			err = d.End()
		}
		if err == nil {
			t.Errorf("%s: accepted", in)
		}
		if again := d.End(); again != err {
			t.Errorf("%s: End after the error = %v, want the first error %v", in, again, err)
		}
	}
}
