package jsonscan

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestSplitArray(t *testing.T) {
	tests := []struct {
		name string
		body string
		want []string
	}{
		{"empty array", `[]`, nil},
		{"empty array with whitespace", " \t\r\n[ \n ] \n", nil},
		{"scalars", `[1,-0.5e+3,"x",true,false,null]`, []string{`1`, `-0.5e+3`, `"x"`, `true`, `false`, `null`}},
		{"whitespace around elements", "[ {\"a\":1} ,\n\t[2] ]", []string{`{"a":1}`, `[2]`}},
		{"escaped quote", `[{"a":"a\"b"},2]`, []string{`{"a":"a\"b"}`, `2`}},
		{"escaped backslash before quote", `["a\\",{"b":"\\\""}]`, []string{`"a\\"`, `{"b":"\\\""}`}},
		{"unicode escapes", `["\u00e9\uD83D\uDE00","\/\b\f\n\r\t"]`, []string{`"\u00e9\uD83D\uDE00"`, `"\/\b\f\n\r\t"`}},
		{"brackets in strings", `[{"s":"]},[{"},["]","[","{"]]`, []string{`{"s":"]},[{"}`, `["]","[","{"]`}},
		{"nested", `[{"a":{"b":[1,{"c":[]}]},"d":{}},[[[]]]]`, []string{`{"a":{"b":[1,{"c":[]}]},"d":{}}`, `[[[]]]`}},
		{"raw utf-8", "[\"héllo\",\"\xff\"]", []string{`"héllo"`, "\"\xff\""}},
		{"long string", `["` + strings.Repeat("abcdefgh", 20) + `"]`, []string{`"` + strings.Repeat("abcdefgh", 20) + `"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spans, err := SplitArray([]byte(tt.body))
			if err != nil {
				t.Fatalf("SplitArray(%q): %v", tt.body, err)
			}
			var got []string
			for _, s := range spans {
				got = append(got, tt.body[s.Off:s.Off+s.Len])
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) || len(got) != len(tt.want) {
				t.Errorf("SplitArray(%q) = %q, want %q", tt.body, got, tt.want)
			}
		})
	}
}

func TestSplitArrayErrors(t *testing.T) {
	tests := []struct {
		body   string
		offset int
		reason string
	}{
		{``, 0, "no JSON value"},
		{"  \n", 3, "no JSON value"},
		{`{"a":1}`, 0, "not a JSON array (found an object)"},
		{`"x"`, 0, "not a JSON array (found a string)"},
		{` 12`, 1, "not a JSON array (found a number)"},
		{`null`, 0, "not a JSON array (found null)"},
		{`<html>`, 0, "not a JSON array (found '<')"},
		{`[`, 1, "unexpected end of input"},
		{`[1`, 2, "unexpected end of input"},
		{`[1,`, 3, "unexpected end of input"},
		{`[{"oops": `, 10, "unexpected end of input"},
		{`["abc`, 5, "unterminated string"},
		{`["abc\`, 6, "unterminated string"},
		{`["\u12`, 6, "unterminated string"},
		{`["\u12g4"]`, 6, "invalid \\u escape"},
		{`["\x"]`, 3, "invalid escape"},
		{"[\"a\tb\"]", 3, "control character in string"},
		{`[1,]`, 3, "invalid character ']' looking for a value"},
		{`[,1]`, 1, "invalid character ',' looking for a value"},
		{`[1 2]`, 3, "expected ',' or ']' after array element"},
		{`[01]`, 2, "expected ',' or ']'"},
		{`[-]`, 2, "invalid number"},
		{`[1.]`, 3, "digit expected after '.'"},
		{`[1e]`, 3, "digit expected in exponent"},
		{`[+1]`, 1, "invalid character '+'"},
		{`[tru]`, 4, "invalid literal, expected true"},
		{`[nul`, 4, "unexpected end of input"},
		{`[{"a" 1}]`, 6, "expected ':' after object key"},
		{`[{a:1}]`, 2, "expected string for object key"},
		{`[{"a":1,}]`, 8, "expected string for object key"},
		{`[{"a":1]`, 7, "expected ',' or '}' after object element"},
		{`[[1}]`, 3, "expected ',' or ']' after array element"},
		{`[] []`, 3, "unexpected data after the array"},
		{`[]x`, 2, "unexpected data after the array"},
	}
	for _, tt := range tests {
		_, err := SplitArray([]byte(tt.body))
		wantSyntaxError(t, fmt.Sprintf("SplitArray(%q)", tt.body), err, tt.reason, tt.offset)
		if json.Valid([]byte(tt.body)) && strings.HasPrefix(strings.TrimSpace(tt.body), "[") {
			t.Errorf("test case %q is valid JSON", tt.body)
		}
	}
}

// wantSyntaxError checks that err, returned by call, is a *SyntaxError
// whose reason holds reason, at offset.
func wantSyntaxError(t *testing.T, call string, err error, reason string, offset int) {
	t.Helper()
	var se *SyntaxError
	if !errors.As(err, &se) || se.Offset != offset || !strings.Contains(se.Reason, reason) {
		t.Errorf("%s = %v, want %q at offset %d", call, err, reason, offset)
	}
}

func TestSplitArrayDepth(t *testing.T) {
	for _, depth := range []int{maxDepth - 1, maxDepth, maxDepth + 1, 3 * maxDepth} {
		for _, open := range []string{"[", `{"k":`} {
			body := "[" + strings.Repeat(open, depth-1) + "1" + closers(open, depth-1) + "]"
			_, err := SplitArray([]byte(body))
			if valid := json.Valid([]byte(body)); (err == nil) != valid {
				t.Errorf("depth %d of %q: SplitArray error %v, json.Valid %v", depth, open, err, valid)
			}
		}
	}
}

func closers(open string, n int) string {
	if open == "[" {
		return strings.Repeat("]", n)
	}
	return strings.Repeat("}", n)
}

func TestField(t *testing.T) {
	rec := `{"id":"a\"b","n": -12.5e3 ,"t":true,"f":false,"z":null,` +
		`"skip":{"x":["}",{"y":"]"}],"id":"inner"},"arr":[1,[2],{"a":3}],` +
		`"meta":{"updated_at":"2024-05-01T10:00:00Z","deep":{"k":"\u00e9"}},` +
		`"esc\u0061ped":1,"id":"dup","e":""}`
	tests := []struct {
		path string
		val  string
		kind Kind
		ok   bool
	}{
		{"id", `a\"b`, String, true}, // first of duplicated keys wins
		{"n", `-12.5e3`, Number, true},
		{"t", `true`, Bool, true},
		{"f", `false`, Bool, true},
		{"z", `null`, Null, true},
		{"skip", `{"x":["}",{"y":"]"}],"id":"inner"}`, Object, true},
		{"skip.id", `inner`, String, true},
		{"arr", `[1,[2],{"a":3}]`, Array, true},
		{"meta.updated_at", `2024-05-01T10:00:00Z`, String, true},
		{"meta.deep.k", `\u00e9`, String, true},
		{"escaped", `1`, Number, true},
		{"e", ``, String, true},
		{"missing", ``, Invalid, false},
		{"meta.missing", ``, Invalid, false},
		{"id.x", ``, Invalid, false},  // id is not an object
		{"arr.0", ``, Invalid, false}, // arrays are not indexed
		{"meta.", ``, Invalid, false}, // empty key absent
		{"updated_at", ``, Invalid, false},
	}
	for _, tt := range tests {
		val, kind, ok := Field([]byte(rec), tt.path)
		if string(val) != tt.val || kind != tt.kind || ok != tt.ok {
			t.Errorf("Field(%q) = %q, %v, %v; want %q, %v, %v", tt.path, val, kind, ok, tt.val, tt.kind, tt.ok)
		}
	}
}

func TestFieldWhitespaceAndMalformed(t *testing.T) {
	tests := []struct {
		rec, path, val string
		ok             bool
	}{
		{" \n{ \"a\" :\t{ \"b\" : [ 1 ] } } ", "a.b", "[ 1 ]", true},
		{`{"":1}`, "", "1", true},
		{`[{"a":1}]`, "a", "", false},
		{`"a"`, "a", "", false},
		{``, "a", "", false},
		{`{"a":1`, "a", "", false},    // truncated after the value
		{`{"a":01}`, "a", "", false},  // invalid number
		{`{"a":tru}`, "a", "", false}, // invalid literal
		{`{"a":"x}`, "a", "", false},  // unterminated string
		{`{"b":1 "a":1}`, "a", "", false},
		{`{"a" 1}`, "a", "", false},
		{`{"a":1 x}`, "a", "", false},
		{`{"\u00e9":2}`, "é", "2", true},
		{"{\"\xff\":3}", "\uFFFD", "3", true}, // compared as encoding/json decodes it
	}
	for _, tt := range tests {
		val, _, ok := Field([]byte(tt.rec), tt.path)
		if string(val) != tt.val || ok != tt.ok {
			t.Errorf("Field(%q, %q) = %q, %v; want %q, %v", tt.rec, tt.path, val, ok, tt.val, tt.ok)
		}
	}
}

func TestUnquote(t *testing.T) {
	tests := []struct {
		raw, want string
	}{
		{``, ``},
		{`plain`, `plain`},
		{`a\"b`, `a"b`},
		{`\\\/\b\f\n\r\t`, "\\/\b\f\n\r\t"},
		{`caf\u00e9`, "café"},
		{`\u00E9\u4e16`, "é世"},
		{`\ud83d\ude00`, "😀"},
		{`\ud83d`, "\uFFFD"},
		{`\ud83dx`, "\uFFFDx"},
		{`\ude00\ud83d`, "\uFFFD\uFFFD"},
		{`\ud83d\u0041`, "\uFFFDA"},
		{"h\xc3\xa9", "hé"},
		{"a\xffb", "a\uFFFDb"},
		{"\xe2\x82", "\uFFFD\uFFFD"},
	}
	for _, tt := range tests {
		got, err := Unquote([]byte(tt.raw))
		if err != nil || got != tt.want {
			t.Errorf("Unquote(%q) = %q, %v; want %q", tt.raw, got, err, tt.want)
		}
		var viaJSON string
		if err := json.Unmarshal([]byte(`"`+tt.raw+`"`), &viaJSON); err != nil || viaJSON != got {
			t.Errorf("Unquote(%q) = %q, encoding/json gives %q (%v)", tt.raw, got, viaJSON, err)
		}
	}
	for _, bad := range []string{`\`, `\x`, `\u12`, `\u12G4`, `a"b`, "a\nb"} {
		if got, err := Unquote([]byte(bad)); err == nil {
			t.Errorf("Unquote(%q) = %q, want an error", bad, got)
		}
	}
}

func TestKindString(t *testing.T) {
	if got := Array.String(); got != "array" {
		t.Errorf("Array.String() = %q", got)
	}
	if got := Kind(42).String(); got != "Kind(42)" {
		t.Errorf("Kind(42).String() = %q", got)
	}
}

// benchBody returns a JSON array of n records of about 1 KiB each, with the
// looked-up fields at the start, the middle and the end of each record.
func benchBody(n int) []byte {
	var b []byte
	b = append(b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ",\n"...)
		}
		b = fmt.Appendf(b, `{"id":"evt-%08d","seq":%d,"type":"order.updated",`, i, i)
		b = append(b, `"payload":{"customer":{"name":"Zo\u00eb \"Z\" O'Brien","tags":["vip","eu-west","]}"]},`...)
		b = append(b, `"lines":[`...)
		for j := range 6 {
			if j > 0 {
				b = append(b, ',')
			}
			b = fmt.Appendf(b, `{"sku":"SKU-%05d","qty":%d,"price":%d.99,"note":"handle with care, fragile item"}`, i*7+j, j+1, 10+j)
		}
		b = append(b, `],"comment":"`...)
		b = append(b, strings.Repeat("lorem ipsum dolor sit amet ", 11)...)
		b = fmt.Appendf(b, `"},"meta":{"source":"bench","updated_at":"2024-05-01T10:00:%02d.123456Z"}}`, i%60)
	}
	return append(b, ']')
}

func BenchmarkExtract(b *testing.B) {
	body := benchBody(1000)
	spans, err := SplitArray(body)
	if err != nil || len(spans) != 1000 {
		b.Fatalf("bench body: %d spans, %v", len(spans), err)
	}
	b.Logf("mean record size %d bytes", len(body)/len(spans))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		spans, err := SplitArray(body)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range spans {
			rec := body[s.Off : s.Off+s.Len]
			id, _, ok1 := Field(rec, "id")
			_, _, ok2 := Field(rec, "seq")
			_, _, ok3 := Field(rec, "meta.updated_at")
			if !ok1 || !ok2 || !ok3 || len(id) == 0 {
				b.Fatal("field not found")
			}
		}
	}
}

func BenchmarkSplitArray(b *testing.B) {
	body := benchBody(1000)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := SplitArray(body); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSkim checks the fast skip against the validating one, with escapes and
// brackets at every position relative to the eight-byte words.
func TestSkim(t *testing.T) {
	values := []string{
		`{}`, `[]`, `"x"`, `12.5`, `true`, `null`,
		`{"a":"x\"]}","b":[1,{"c":"\\"}],"d":"\\\"{"}`,
		`[["]"],{"}":"\\\\\\"},{"\u005d":"\ud83d\ude00"}]`,
		`{"s":"` + strings.Repeat(`\\`, 9) + `\"]}[{"}`,
		`[` + strings.Repeat(`{"k":[1,"]}"]},`, 5) + `0]`,
	}
	for _, v := range values {
		for pad := range 17 {
			b := []byte(strings.Repeat(" ", pad) + v + ` ,"tail"]}`)
			want, err := skipValue(b, pad, 0)
			if err != nil {
				t.Fatalf("skipValue(%q): %v", v, err)
			}
			if got := skim(b, pad); got != want {
				t.Errorf("skim(%q) with %d bytes before = %d, want %d", v, pad, got, want)
			}
		}
	}
	for _, bad := range []string{`{"a":"`, `[1,[2`, `"abc\`, `{"a":"\"}`} {
		if got := skim([]byte(bad), 0); got != len(bad) {
			t.Errorf("skim(%q) = %d, want %d", bad, got, len(bad))
		}
	}
}
