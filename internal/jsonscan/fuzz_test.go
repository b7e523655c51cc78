package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// The seed corpora are in testdata/fuzz/FuzzSplitArray and
// testdata/fuzz/FuzzField.

// FuzzSplitArray checks SplitArray against encoding/json: it accepts exactly
// the valid JSON arrays, and its spans are the elements json.Unmarshal finds.
func FuzzSplitArray(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		spans, err := SplitArray(body)
		trimmed := bytes.TrimLeft(body, " \t\r\n")
		isArray := json.Valid(body) && len(trimmed) > 0 && trimmed[0] == '['
		if err != nil {
			if isArray {
				t.Fatalf("SplitArray rejected a valid array: %v", err)
			}
			var se *SyntaxError
			if !errors.As(err, &se) || se.Offset < 0 || se.Offset > len(body) || se.Reason == "" {
				t.Fatalf("SplitArray error %#v is not a *SyntaxError within the body", err)
			}
			return
		}
		if !isArray {
			t.Fatalf("SplitArray accepted something that is not a valid JSON array: %d spans", len(spans))
		}
		var elems []json.RawMessage
		if err := json.Unmarshal(body, &elems); err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		if len(spans) != len(elems) {
			t.Fatalf("SplitArray found %d elements, encoding/json %d", len(spans), len(elems))
		}
		prev := 0
		for k, s := range spans {
			if s.Off < prev || s.Len <= 0 || s.Off+s.Len > len(body) {
				t.Fatalf("span %d %+v out of order or out of bounds (previous end %d, body %d)", k, s, prev, len(body))
			}
			elem := body[s.Off : s.Off+s.Len]
			if !json.Valid(elem) {
				t.Fatalf("span %d %q is not valid JSON", k, elem)
			}
			if !bytes.Equal(elem, elems[k]) {
				t.Fatalf("span %d is %q, encoding/json found %q", k, elem, elems[k])
			}
			if end := skim(body, s.Off); end != s.Off+s.Len {
				t.Fatalf("skim of span %d %q ends at %d, want %d", k, elem, end, s.Off+s.Len)
			}
			prev = s.Off + s.Len
		}
	})
}

// FuzzField checks that Field never panics and, on valid JSON, finds what a
// walk with encoding/json's tokenizer finds (the first occurrence of each key).
func FuzzField(f *testing.F) {
	f.Fuzz(func(t *testing.T, record []byte, path string) {
		val, kind, ok := Field(record, path)
		if !ok {
			if val != nil || kind != Invalid {
				t.Fatalf("Field not ok but returned %q, %v", val, kind)
			}
		} else if !within(val, record) {
			t.Fatalf("Field returned %q, not a part of the record", val)
		}
		if ok && kind == String {
			if _, err := Unquote(val); err != nil {
				t.Fatalf("Unquote(%q): %v", val, err)
			}
		}
		if !json.Valid(record) {
			return
		}
		want, found := referenceField(t, record, path)
		if ok != found {
			t.Fatalf("Field found %v (%q), encoding/json found %v (%q)", ok, val, found, want)
		}
		if !ok {
			return
		}
		if wantKind := kindOf(want[0]); kind != wantKind {
			t.Fatalf("Field kind %v, want %v", kind, wantKind)
		}
		if kind != String {
			if !bytes.Equal(val, want) {
				t.Fatalf("Field = %q, want %q", val, want)
			}
			return
		}
		if !bytes.Equal(val, want[1:len(want)-1]) {
			t.Fatalf("Field = %q, want the inside of %q", val, want)
		}
		var s string
		if err := json.Unmarshal(want, &s); err != nil {
			t.Fatal(err)
		}
		if got, err := Unquote(val); err != nil || got != s {
			t.Fatalf("Unquote(%q) = %q, %v; encoding/json decodes %q", val, got, err, s)
		}
	})
}

// within reports whether sub is a slice of b's backing array.
func within(sub, b []byte) bool {
	if len(sub) == 0 {
		return true
	}
	for i := range b {
		if &b[i] == &sub[0] {
			return i+len(sub) <= len(b)
		}
	}
	return false
}

// referenceField walks a valid record with encoding/json to the first
// occurrence of each key of path.
func referenceField(t *testing.T, record []byte, path string) (json.RawMessage, bool) {
	raw := json.RawMessage(record)
	for _, key := range strings.Split(path, ".") {
		keys, vals, ok := referenceMembers(t, raw)
		i := slices.Index(keys, key)
		if !ok || i < 0 {
			return nil, false
		}
		raw = vals[i]
	}
	return raw, true
}

func kindOf(c byte) Kind {
	switch c {
	case '"':
		return String
	case '{':
		return Object
	case '[':
		return Array
	case 't', 'f':
		return Bool
	case 'n':
		return Null
	default:
		return Number
	}
}
