package jsonscan

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// objectEach reads obj with a Decoder, as a caller that only looks at the
// top-level members does, calling fn with each member's value read whole.
func objectEach(obj []byte, fn func(key []byte, plainKey bool, val []byte, kind Kind) error) error {
	var d Decoder
	d.Reset(obj)
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
	return d.End()
}

// arrayEach reads arr with a Decoder as objectEach reads an object.
func arrayEach(arr []byte, fn func(elem []byte, kind Kind) error) error {
	var d Decoder
	d.Reset(arr)
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
	return d.End()
}

// member is one member handed to an objectEach callback, for comparison.
type member struct {
	key   string
	plain bool
	val   string
	kind  Kind
}

func collectMembers(obj string) ([]member, error) {
	var got []member
	err := objectEach([]byte(obj), func(key []byte, plain bool, val []byte, kind Kind) error {
		got = append(got, member{string(key), plain, string(val), kind})
		return nil
	})
	return got, err
}

func TestDecoderObject(t *testing.T) {
	tests := []struct {
		name string
		obj  string
		want []member
	}{
		{"empty", `{}`, nil},
		{"empty with whitespace", " \r\n{ \t} \n", nil},
		{"kinds", `{"s":"x","n":-1.5e3,"t":true,"f":false,"z":null,"o":{"a":[1]},"a":[{},"]"]}`, []member{
			{"s", true, "x", String}, {"n", true, "-1.5e3", Number}, {"t", true, "true", Bool},
			{"f", true, "false", Bool}, {"z", true, "null", Null}, {"o", true, `{"a":[1]}`, Object},
			{"a", true, `[{},"]"]`, Array},
		}},
		{"whitespace everywhere", "{ \"a\" :\n1 ,\t\"b\"\r: [ 2 , 3 ] }", []member{
			{"a", true, "1", Number}, {"b", true, "[ 2 , 3 ]", Array},
		}},
		{"string escapes kept raw", `{"q":"a\"b\\","u":"\u00e9"}`, []member{
			{"q", true, `a\"b\\`, String}, {"u", true, `\u00e9`, String},
		}},
		{"keys that are not plain", `{"esc\u0061ped":1,"tab\t":2,"café":3,"":4}`, []member{
			{`esc\u0061ped`, false, "1", Number}, {`tab\t`, false, "2", Number},
			{"café", false, "3", Number}, {"", true, "4", Number},
		}},
		{"duplicates in order", `{"k":1,"k":2}`, []member{{"k", true, "1", Number}, {"k", true, "2", Number}}},
		{"empty string value", `{"e":""}`, []member{{"e", true, "", String}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := collectMembers(tt.obj)
			if err != nil {
				t.Fatalf("objectEach(%q): %v", tt.obj, err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("objectEach(%q) members\n got %v\nwant %v", tt.obj, got, tt.want)
			}
		})
	}
}

func TestDecoderObjectErrors(t *testing.T) {
	tests := []struct {
		obj    string
		offset int
		reason string
	}{
		{``, 0, "no JSON value, expected an object"},
		{" \n", 2, "no JSON value, expected an object"},
		{`[1]`, 0, "not a JSON object (found '[')"},
		{` "x"`, 1, "not a JSON object (found a string)"},
		{`null`, 0, "not a JSON object (found null)"},
		{`hello`, 0, "invalid character 'h' looking for a value"},
		{`{`, 1, "unexpected end of input"},
		{`{"a"`, 4, "unexpected end of input"},
		{`{"a":`, 5, "unexpected end of input"},
		{`{"a":1`, 6, "unexpected end of input"},
		{`{"a":1,`, 7, "unexpected end of input"},
		{`{"a":1,}`, 7, "expected string for object key"},
		{`{,}`, 1, "expected string for object key"},
		{`{a:1}`, 1, "expected string for object key"},
		{`{"a" 1}`, 5, "expected ':' after object key"},
		{`{"a":1 "b":2}`, 7, "expected ',' or '}' after object element"},
		{`{"a":1]`, 6, "expected ',' or '}' after object element"},
		{`{"a":}`, 5, "invalid character '}' looking for a value"},
		{`{"a":tru}`, 8, "invalid literal, expected true"},
		{`{"a":01}`, 6, "expected ',' or '}'"},
		{`{"a":[1,]}`, 8, "invalid character ']' looking for a value"},
		{`{"a":{"b":1]}`, 11, "expected ',' or '}' after object element"},
		{"{\"a\x01\":1}", 3, "control character in string"},
		{`{"a":"\x"}`, 7, "invalid escape in string"},
		{`{"a":1}x`, 7, "unexpected data after the value"},
		{`{"a":1} {}`, 8, "unexpected data after the value"},
	}
	for _, tt := range tests {
		_, err := collectMembers(tt.obj)
		wantSyntaxError(t, fmt.Sprintf("objectEach(%q)", tt.obj), err, tt.reason, tt.offset)
		if json.Valid([]byte(tt.obj)) && strings.HasPrefix(strings.TrimSpace(tt.obj), "{") {
			t.Errorf("test case %q is a valid object", tt.obj)
		}
	}
}

func TestDecoderArray(t *testing.T) {
	tests := []struct {
		arr  string
		want string
	}{
		{`[]`, "[]"},
		{" [ \n ] ", "[]"},
		{`["a\"",1,true,null,{"k":"]"},[[]]]`, `[a\" string 1 number true bool null null {"k":"]"} object [[]] array]`},
		{"[ 1 ,\n2 ]", "[1 number 2 number]"},
	}
	for _, tt := range tests {
		var got []string
		err := arrayEach([]byte(tt.arr), func(elem []byte, kind Kind) error {
			got = append(got, string(elem), kind.String())
			return nil
		})
		if err != nil {
			t.Errorf("arrayEach(%q): %v", tt.arr, err)
			continue
		}
		if s := fmt.Sprint(got); s != tt.want {
			t.Errorf("arrayEach(%q) = %s, want %s", tt.arr, s, tt.want)
		}
	}
}

func TestDecoderArrayErrors(t *testing.T) {
	tests := []struct {
		arr    string
		offset int
		reason string
	}{
		{``, 0, "no JSON value, expected an array"},
		{`{}`, 0, "not a JSON array (found an object)"},
		{`[`, 1, "unexpected end of input"},
		{`[1`, 2, "unexpected end of input"},
		{`[1,`, 3, "unexpected end of input"},
		{`[1,]`, 3, "invalid character ']' looking for a value"},
		{`[,1]`, 1, "invalid character ',' looking for a value"},
		{`[1 2]`, 3, "expected ',' or ']' after array element"},
		{`[1}`, 2, "expected ',' or ']' after array element"},
		{`[1]]`, 3, "unexpected data after the value"},
	}
	for _, tt := range tests {
		err := arrayEach([]byte(tt.arr), func([]byte, Kind) error { return nil })
		wantSyntaxError(t, fmt.Sprintf("arrayEach(%q)", tt.arr), err, tt.reason, tt.offset)
	}
}

func TestDecoderStopsAtCallbackError(t *testing.T) {
	stop := errors.New("stop")
	calls := 0
	// The callback's error wins over the syntax error further on.
	err := objectEach([]byte(`{"a":1,"b":2,"c":3,oops`), func(key []byte, _ bool, _ []byte, _ Kind) error {
		calls++
		if string(key) == "b" {
			return stop
		}
		return nil
	})
	if err != stop || calls != 2 {
		t.Errorf("objectEach = %v after %d calls, want the callback's error unchanged after 2", err, calls)
	}
	calls = 0
	err = arrayEach([]byte(`[1,2,3]`), func([]byte, Kind) error {
		calls++
		return stop
	})
	if err != stop || calls != 1 {
		t.Errorf("arrayEach = %v after %d calls, want the callback's error unchanged after 1", err, calls)
	}
}

func TestDecoderFlatDepth(t *testing.T) {
	// The object or array itself counts as the first level.
	for _, depth := range []int{maxDepth - 1, maxDepth, maxDepth + 1} {
		nested := strings.Repeat("[", depth-1) + closers("[", depth-1)
		for _, in := range []string{`{"k":` + nested + `}`, `[` + nested + `]`} {
			var err error
			if in[0] == '{' {
				err = objectEach([]byte(in), func([]byte, bool, []byte, Kind) error { return nil })
			} else {
				err = arrayEach([]byte(in), func([]byte, Kind) error { return nil })
			}
			if valid := json.Valid([]byte(in)); (err == nil) != valid {
				t.Errorf("depth %d of %.10q…: error %v, json.Valid %v", depth, in, err, valid)
			}
		}
	}
}

func TestDecoder(t *testing.T) {
	in := []byte(` {"id":7, "skip":{"deep":[1,{"x":"}"}]}, "tags":["a","b\n"], "meta":{"n":null,"o":{}}, "last":true} `)
	var d Decoder
	d.Reset(in)
	var log []string
	err := d.Object(func(key []byte, plain bool) error {
		if k := d.Peek(); k == Invalid {
			t.Errorf("Peek at %q is Invalid", key)
		}
		if c := in[d.Offset()]; kindOfByte[c] != d.Peek() {
			t.Errorf("Offset %d at %q is not the value's first byte", d.Offset(), key)
		}
		switch string(key) {
		case "id", "last":
			val, kind, err := d.Value()
			log = append(log, fmt.Sprintf("%s=%s(%v)", key, val, kind))
			return err
		case "tags":
			return d.Array(func() error {
				val, _, err := d.Value()
				s, uerr := Unquote(val)
				log = append(log, fmt.Sprintf("tag %q", s))
				return errors.Join(err, uerr)
			})
		case "meta":
			return d.Object(func(key []byte, _ bool) error {
				log = append(log, "meta."+string(key)+":"+d.Peek().String())
				return nil // left unread: skipped
			})
		}
		return nil // "skip" is left unread
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.End(); err != nil {
		t.Fatal(err)
	}
	want := `[id=7(number) tag "a" tag "b\n" meta.n:null meta.o:object last=true(bool)]`
	if got := fmt.Sprint(log); got != want {
		t.Errorf("walk = %s\nwant   %s", got, want)
	}
	if d.Offset() != len(in)-1 {
		t.Errorf("Offset after the object = %d, want %d", d.Offset(), len(in)-1)
	}
}

func TestDecoderErrors(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		walk   func(d *Decoder) error
		offset int
		reason string
	}{
		{"unread value is validated", `{"a":[1,}`, func(d *Decoder) error {
			return d.Object(func([]byte, bool) error { return nil })
		}, 8, "invalid character '}'"},
		{"value read twice", `{"a":1,"b":2}`, func(d *Decoder) error {
			return d.Object(func([]byte, bool) error {
				if _, _, err := d.Value(); err != nil {
					return err
				}
				_, _, err := d.Value()
				return err
			})
		}, 6, "invalid character ','"},
		{"object where a string is", `{"a":"x"}`, func(d *Decoder) error {
			return d.Object(func([]byte, bool) error { return d.Object(func([]byte, bool) error { return nil }) })
		}, 5, "not a JSON object (found a string)"},
		{"array where an object is", `[{}]`, func(d *Decoder) error {
			return d.Array(func() error { return d.Array(func() error { return nil }) })
		}, 1, "not a JSON array (found an object)"},
		{"trailing data", `[] x`, func(d *Decoder) error {
			if err := d.Array(func() error { return nil }); err != nil {
				return err
			}
			return d.End()
		}, 3, "unexpected data after the value"},
		{"value at end of input", ` `, func(d *Decoder) error {
			_, _, err := d.Value()
			return err
		}, 1, "no JSON value"},
		{"nested member list truncated", `{"a":{"b":1`, func(d *Decoder) error {
			return d.Object(func([]byte, bool) error { return d.Object(func([]byte, bool) error { return nil }) })
		}, 11, "unexpected end of input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Decoder
			d.Reset([]byte(tt.in))
			wantSyntaxError(t, fmt.Sprintf("walk of %q", tt.in), tt.walk(&d), tt.reason, tt.offset)
		})
	}
}

// TestDecoderDepth checks that the nesting limit counts the containers a
// Decoder descends into together with those Value skips.
func TestDecoderDepth(t *testing.T) {
	var descend func(d *Decoder, levels int) error
	descend = func(d *Decoder, levels int) error {
		if levels == 0 {
			_, _, err := d.Value()
			return err
		}
		return d.Array(func() error { return descend(d, levels-1) })
	}
	for _, depth := range []int{maxDepth, maxDepth + 1} {
		in := []byte(strings.Repeat("[", depth) + strings.Repeat("]", depth))
		for _, levels := range []int{0, 1, depth / 2, depth - 1} {
			var d Decoder
			d.Reset(in)
			err := descend(&d, levels)
			if valid := json.Valid(in); (err == nil) != valid {
				t.Errorf("depth %d, descending %d levels: error %v, json.Valid %v", depth, levels, err, valid)
			}
		}
	}
}

// BenchmarkDecoderFlat measures a flat walk of each record of benchBody,
// against BenchmarkSplitArray, which validates the same bytes.
func BenchmarkDecoderFlat(b *testing.B) {
	body := benchBody(1000)
	spans, err := SplitArray(body)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		for _, s := range spans {
			err := objectEach(body[s.Off:s.Off+s.Len], func([]byte, bool, []byte, Kind) error { return nil })
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}

func TestDecoderAllocatesNothing(t *testing.T) {
	obj := []byte(`{"a":"x","b":[1,{"c":null}],"d\u0065":true}`)
	arr := []byte(`[1,"two",{"three":[3]}]`)
	var n int
	allocs := testing.AllocsPerRun(10, func() {
		err := objectEach(obj, func(_ []byte, _ bool, val []byte, _ Kind) error {
			n += len(val)
			return nil
		})
		if err == nil {
			err = arrayEach(arr, func(elem []byte, _ Kind) error {
				n += len(elem)
				return nil
			})
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("a flat Decoder walk made %v allocations, want none", allocs)
	}
}

// TestDecoderObjectNames checks that ObjectNames recognizes keys written
// as the names it is given, in their order or skipping some, hands every
// other key over as Object does with -1, and reads the same members and
// fails the same way as Object whatever the order.
func TestDecoderObjectNames(t *testing.T) {
	names := []string{"key", "source", "seq", "raw"}
	type named struct {
		name  int
		key   string
		plain bool
		val   string
	}
	tests := []struct {
		obj  string
		want []named
	}{
		{`{"key":"a","source":"s","seq":1,"raw":{}}`, []named{{0, "key", true, `a`}, {1, "source", true, `s`}, {2, "seq", true, `1`}, {3, "raw", true, `{}`}}},
		{`{"key":"a","raw":null}`, []named{{0, "key", true, `a`}, {3, "raw", true, `null`}}},
		// Out of order, repeated, unknown, escaped or spaced: scanned.
		{`{"seq":1,"key":"a","seq":2}`, []named{{2, "seq", true, `1`}, {-1, "key", true, `a`}, {-1, "seq", true, `2`}}},
		{`{"k\u0065y":1,"sourc":2,"sources":3,"source" :4}`, []named{{-1, `k\u0065y`, false, `1`}, {-1, "sourc", true, `2`}, {-1, "sources", true, `3`}, {1, "source", true, `4`}}},
		{`{}`, nil},
	}
	for _, tt := range tests {
		var got []named
		var d Decoder
		d.Reset([]byte(tt.obj))
		err := d.ObjectNames(names, func(name int, key []byte, plain bool) error {
			val, _, err := d.Value()
			got = append(got, named{name, string(key), plain, string(val)})
			return err
		})
		if err == nil {
			err = d.End()
		}
		if err != nil {
			t.Errorf("ObjectNames(%s): %v", tt.obj, err)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("ObjectNames(%s) members\n got %v\nwant %v", tt.obj, got, tt.want)
		}
	}
	for _, obj := range []string{`{"key":}`, `{"key" "a"}`, `{"key":1,}`, `{"key":1`, `{"key`, `{"raw":[}`} {
		var d, o Decoder
		d.Reset([]byte(obj))
		o.Reset([]byte(obj))
		err := d.ObjectNames(names, func(int, []byte, bool) error { return nil })
		want := o.Object(func([]byte, bool) error { return nil })
		if err == nil || fmt.Sprint(err) != fmt.Sprint(want) {
			t.Errorf("ObjectNames(%s) error %v, Object's %v", obj, err, want)
		}
	}
}

// TestDecoderExpect reads an object laid out as expected with Expect and
// Value, then fails to find an unexpected layout, reading nothing, and
// reads it again from a Mark with Object.
func TestDecoderExpect(t *testing.T) {
	var d Decoder
	d.Reset([]byte(`[{"a":1,"b":{"c":"x"}},{"a":2, "b":{}}]`))
	var got []string
	open, a, b, c, end := NewLit(`{"a":`), NewLit(`,"b":{"c":`), NewLit(`,"b":{}`), NewLit(`}}`), NewLit(`}`)
	err := d.Array(func() error {
		m := d.Mark()
		if d.Expect(open) {
			v, _, err := d.Value()
			if err != nil {
				return err
			}
			got = append(got, "a="+string(v))
			if d.Expect(a) {
				if v, _, err = d.Value(); err != nil {
					return err
				}
				got = append(got, "c="+string(v))
				if d.Expect(c) {
					return nil
				}
			} else if d.Expect(b) && d.Expect(end) {
				return nil
			}
		}
		d.Rewind(m)
		got = append(got, "rewound")
		return d.Object(func(key []byte, _ bool) error {
			v, _, err := d.Value()
			got = append(got, string(key)+":"+string(v))
			return err
		})
	})
	if err == nil {
		err = d.End()
	}
	if err != nil {
		t.Fatal(err)
	}
	want := "[a=1 c=x a=2 rewound a:2 b:{}]"
	if fmt.Sprint(got) != want {
		t.Errorf("read %v, want %s", got, want)
	}
	// Expect counts the containers lit opens against the depth limit.
	d.Reset([]byte(`{"k":1}`))
	d.depth = maxDepth
	if d.Expect(NewLit(`{"k":`)) || d.Offset() != 0 {
		t.Errorf("Expect read past the depth limit, to offset %d", d.Offset())
	}
}
