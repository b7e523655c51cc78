package wire

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The seed corpus is in testdata/fuzz/FuzzAppendString.

// FuzzAppendString checks AppendString byte for byte against json.Marshal of
// the same string, and that what it appends is valid JSON.
func FuzzAppendString(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("json.Marshal(%q): %v", s, err)
		}
		got := AppendString([]byte("[1,"), s)
		if !bytes.Equal(got[3:], want) {
			t.Fatalf("AppendString(%q)\n got %s\nwant %s", s, got[3:], want)
		}
		if !json.Valid(append(got, ']')) {
			t.Fatalf("AppendString(%q) = %s is not valid JSON", s, got[3:])
		}
	})
}
