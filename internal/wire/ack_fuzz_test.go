package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeAck checks DecodeAck against decodeAckStd, a plain reading of
// PROTOCOL.md's ack rules on top of encoding/json: on any input both fail
// or both succeed with equal acks, and DecodeAck never accepts invalid
// JSON. The seeds are acks from EncodeAck and the malformed cases of
// PROTOCOL.md; inputs the fuzzer finds go to testdata/fuzz/FuzzDecodeAck.
func FuzzDecodeAck(f *testing.F) {
	for _, a := range []Ack{
		{Frames: []int64{1, 2, 1 << 53}},
		{Keys: []KeyAck{{Frame: 4, Source: "github", Key: `k"1\<>&` + "\n\u2028é"}}},
		{Frames: []int64{9}, Nacks: []Nack{{Frame: 10, Source: "s", Key: "a", Reason: "bad", Permanent: true}, {Frame: 10, Source: "s", Key: "b"}}},
		{Nacks: []Nack{{Frame: 3, Source: "s", Key: "k", Reason: strings.Repeat("é", MaxReasonBytes)}}},
	} {
		data, err := EncodeAck(a)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		``, `null`, `[]`, `"ack"`, "\ufeff" + `{"v":1,"type":"ack","frames":[1]}`,
		`{"v":1,"type":"ack","frames":[1]} x`, `{"v":1,"type":"ack","frames":[1]}{}`,
		`{"v":2,"type":"ack","frames":[1]}`, `{"v":"1","type":"ack","frames":[1]}`, `{"v":1.0,"type":"ack","frames":[1]}`,
		`{"v":null,"type":"ack","frames":[1]}`, `{"type":"ack","frames":[1]}`, `{"v":1,"frames":[1]}`,
		`{"v":1,"type":"events","frames":[1]}`, `{"v":1,"type":"ack"}`, `{"v":1,"type":"ack","frames":[]}`,
		`{"v":1,"type":"ack","frames":null,"keys":[{"frame":1,"source":"s","key":"k"}]}`,
		`{"v":1,"type":"ack","frames":[1,"x"]}`, `{"v":1,"type":"ack","frames":[-1]}`, `{"v":1,"type":"ack","frames":[0]}`,
		`{"v":1,"type":"ack","frames":[null]}`, `{"v":1,"type":"ack","frames":[1e2]}`, `{"v":1,"type":"ack","frames":[9223372036854775808]}`,
		`{"v":1,"type":"ack","keys":[{}]}`, `{"v":1,"type":"ack","keys":[{"frame":1,"source":"s"}]}`,
		`{"v":1,"type":"ack","nacks":[{"frame":1,"source":"s","key":"k"}]}`,
		`{"v":1,"type":"ack","nacks":[{"frame":1,"source":"s","key":"k","reason":"r","permanent":"yes"}]}`,
		`{"v":1,"type":"ack","frames":[1],"frames":[2]}`, `{"v":1,"type":"ack","keys":[{"frame":1,"source":"s","key":"k","key":"j"}]}`,
		`{"v":1,"type":"ack","frames":[1],"x":"` + "\xff" + `"}`,
		`{"\u0076":1,"typ\u0065":"ack","fr\u0061mes":[7],"V":2,"x":{"y":[1,{"z":null}]}}`,
		`{"v":1,"type":"ack","keys":[{"frame":1,"source":"s","key":"\ud800","x":[]}],"nacks":[]}`,
		`{"v":1,"type":"ack","frames":[1],"x":` + strings.Repeat("[", MaxAckDepth-1) + strings.Repeat("]", MaxAckDepth-1) + `}`,
		`{"v":1,"type":"ack","frames":[1],"x":` + strings.Repeat("[", MaxAckDepth) + strings.Repeat("]", MaxAckDepth) + `}`,
		`{"v":1,"type":"ack","frames":[1` + strings.Repeat(",1", MaxAckEntries-1) + `]}`,
		`{"v":1,"type":"ack","frames":[1` + strings.Repeat(",1", MaxAckEntries) + `]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DecodeAck(data)
		if err == nil && !json.Valid(data) {
			t.Fatalf("DecodeAck accepted invalid JSON: %+v", got)
		}
		if err != nil && got != nil {
			t.Fatalf("DecodeAck returned an ack with error %v", err)
		}
		want, stdErr := decodeAckStd(data)
		if (err == nil) != (stdErr == nil) {
			t.Fatalf("DecodeAck error %v, reference error %v", err, stdErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("acks differ\nDecodeAck: %+v\nreference: %+v", got, want)
		}
	})
}

// decodeAckStd is a slow and plain implementation of the ack rules of
// PROTOCOL.md with encoding/json, the reference for FuzzDecodeAck.
func decodeAckStd(data []byte) (*Ack, error) {
	if !utf8.Valid(data) || !json.Valid(data) { // Valid also checks the depth
		return nil, errors.New("not UTF-8 JSON")
	}
	top, err := stdObject(data, "v", "type", "frames", "keys", "nacks")
	if err != nil {
		return nil, err
	}
	a := &Ack{}
	v, ok := top["v"]
	if !ok {
		return nil, errors.New("no v")
	}
	n, err := stdInt(v, 1)
	if err != nil || n != 1 {
		return nil, fmt.Errorf("v: %s", v)
	}
	a.V = 1
	if a.Type, err = stdString(top, "type"); err != nil || a.Type != TypeAck {
		return nil, fmt.Errorf("type: %v", err)
	}
	entries := 0
	lists := map[string][]json.RawMessage{}
	for _, name := range []string{"frames", "keys", "nacks"} {
		raw, ok := top[name]
		if !ok {
			continue
		}
		if raw[0] != '[' {
			return nil, fmt.Errorf("%s not an array", name)
		}
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, err
		}
		lists[name] = elems
		entries += len(elems)
	}
	if entries == 0 || entries > MaxAckEntries {
		return nil, fmt.Errorf("%d entries", entries)
	}
	for _, raw := range lists["frames"] {
		id, err := stdInt(raw, 1)
		if err != nil {
			return nil, err
		}
		a.Frames = append(a.Frames, id)
	}
	for _, raw := range lists["keys"] {
		n, err := stdEntry(raw, false)
		if err != nil {
			return nil, err
		}
		a.Keys = append(a.Keys, KeyAck{Frame: n.Frame, Source: n.Source, Key: n.Key})
	}
	for _, raw := range lists["nacks"] {
		n, err := stdEntry(raw, true)
		if err != nil {
			return nil, err
		}
		a.Nacks = append(a.Nacks, n)
	}
	return a, nil
}

// stdEntry decodes one key ack (nack false) or nack.
func stdEntry(raw json.RawMessage, nack bool) (Nack, error) {
	var n Nack
	fields, err := stdObject(raw, "frame", "source", "key", "reason", "permanent")
	if err != nil {
		return n, err
	}
	f, ok := fields["frame"]
	if !ok {
		return n, errors.New("no frame")
	}
	if n.Frame, err = stdInt(f, 1); err != nil {
		return n, err
	}
	if n.Source, err = stdString(fields, "source"); err != nil {
		return n, err
	}
	if n.Key, err = stdString(fields, "key"); err != nil {
		return n, err
	}
	if !nack {
		return n, nil
	}
	if n.Reason, err = stdString(fields, "reason"); err != nil {
		return n, err
	}
	for len(n.Reason) > MaxReasonBytes {
		_, size := utf8.DecodeLastRuneInString(n.Reason)
		n.Reason = n.Reason[:len(n.Reason)-size]
	}
	switch p, ok := fields["permanent"]; {
	case !ok:
	case string(p) == "true":
		n.Permanent = true
	case string(p) != "false":
		return n, fmt.Errorf("permanent: %s", p)
	}
	return n, nil
}

// stdObject returns the members of the JSON object raw, and fails if one
// of the known names appears twice.
func stdObject(raw []byte, known ...string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not an object: %v", err)
	}
	m := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if _, dup := m[key]; dup && strings.Contains(" "+strings.Join(known, " ")+" ", " "+key+" ") {
			return nil, fmt.Errorf("%s repeated", key)
		}
		m[key] = v
	}
	return m, nil
}

// stdInt parses raw as a JSON integer of at least least.
func stdInt(raw json.RawMessage, least int64) (int64, error) {
	s := string(raw)
	if strings.ContainsAny(s, ".eE") || (len(s) > 0 && s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, fmt.Errorf("not an integer: %s", s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < least {
		return 0, fmt.Errorf("not an integer from %d: %s", least, s)
	}
	return n, nil
}

// stdString decodes the member name of fields, which must be a string.
func stdString(fields map[string]json.RawMessage, name string) (string, error) {
	raw, ok := fields[name]
	if !ok || raw[0] != '"' {
		return "", fmt.Errorf("%s missing or not a string", name)
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}
