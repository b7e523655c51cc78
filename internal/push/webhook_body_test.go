package push

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// firstMembers returns the first raw value of each top-level key of the
// JSON object obj, decoded by encoding/json; ok is false when obj is not
// an object.
func firstMembers(obj []byte) (map[string]json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		if k := tok.(string); out[k] == nil {
			out[k] = v
		}
	}
	return out, true
}

// scalarOf is what an id field holds, as encoding/json reads it: a
// string's text or a number as written; "" for anything else.
func scalarOf(raw json.RawMessage) string {
	switch {
	case len(raw) == 0:
		return ""
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return ""
		}
		return s
	case raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9':
		return string(raw)
	}
	return ""
}

// checkBody decodes body with rules {id, at, required type} and checks the
// result against encoding/json: the same bodies are valid JSON, an object
// or an array of objects makes events whose spans are those objects, and
// the id, time and required field agree with the first member of each
// name (the documented rule for duplicated keys).
func checkBody(t *testing.T, body []byte) {
	rules := bodyRules{idField: "id", timeField: "at", required: []string{"type"}}
	events, batch, err := rules.decode(body)
	valid := json.Valid(body) && utf8.Valid(body) // encoding/json lets invalid UTF-8 in strings pass
	if !valid {
		if err == nil {
			t.Fatalf("%q: encoding/json says invalid, decode found %d events", body, len(events))
		}
		return
	}
	var top any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if jerr := dec.Decode(&top); jerr != nil {
		t.Fatalf("%q: valid but does not unmarshal: %v", body, jerr)
	}
	var objs [][]byte
	switch v := top.(type) {
	case map[string]any:
		objs = [][]byte{bytes.TrimSpace(body)}
	case []any:
		var elems []json.RawMessage
		if jerr := json.Unmarshal(body, &elems); jerr != nil {
			t.Fatal(jerr)
		}
		for _, e := range elems {
			objs = append(objs, e)
		}
		if len(v) == 0 {
			if err == nil || !batch {
				t.Fatalf("%q: an empty array decoded without error (batch %v)", body, batch)
			}
			return
		}
	default:
		if err == nil || !strings.Contains(err.Error(), "want an object or an array of objects") {
			t.Fatalf("%q: a JSON %T: err %v", body, v, err)
		}
		return
	}
	if _, isArray := top.([]any); batch != isArray {
		t.Fatalf("%q: batch %v", body, batch)
	}
	var wantErr string
	for i, obj := range objs {
		m, ok := firstMembers(obj)
		if !ok {
			wantErr = "not a JSON object"
			break
		}
		if typ := m["type"]; len(typ) == 0 || string(typ) == "null" {
			wantErr = `the required field "type" is missing`
			break
		}
		if err != nil {
			continue
		}
		e := events[i]
		if got := body[e.Off : e.Off+e.Len]; !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(obj)) || e.Len != len(bytes.TrimSpace(got)) {
			t.Fatalf("%q: event %d spans %q, want %q", body, i, got, obj)
		}
		if want := scalarOf(m["id"]); e.ID != want {
			t.Fatalf("%q: event %d id %q, want %q", body, i, e.ID, want)
		}
		var at string
		wantTime := time.Time{}
		if raw := m["at"]; len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &at) == nil {
			if tm, perr := time.Parse(time.RFC3339Nano, at); perr == nil {
				wantTime = tm
			}
		}
		if !e.Time.Equal(wantTime) {
			t.Fatalf("%q: event %d time %v, want %v", body, i, e.Time, wantTime)
		}
	}
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("%q: decode failed: %v", body, err)
	case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
		t.Fatalf("%q: err %v, want %q", body, err, wantErr)
	case err == nil && len(events) != len(objs):
		t.Fatalf("%q: %d events, want %d", body, len(events), len(objs))
	}
}

// FuzzWebhookBody checks webhook body decoding (object or array, id, time
// and required fields) against encoding/json. Its seed corpus is
// testdata/fuzz/FuzzWebhookBody.
func FuzzWebhookBody(f *testing.F) {
	f.Add([]byte(`{"id":"a","type":"t","at":"2026-01-02T03:04:05Z"}`))
	f.Fuzz(checkBody)
}

// TestWebhookBodyDecode names the answers to the bodies a sender gets
// wrong most often.
func TestWebhookBodyDecode(t *testing.T) {
	for _, tc := range []struct{ body, err string }{
		{`{"id":"a","type":"t"}`, ""},
		{` [ {"id":1,"type":"t"} , {"type":"u"} ] `, ""},
		{`{"id":"a","id":"b","type":"t"}`, ""},
		{`{"id":"a"}`, `the required field "type" is missing`},
		{`[{"type":"t"},{"type":null}]`, `event 1: the required field "type" is missing`},
		{`[{"type":"t"},[]]`, `event 1 is not a JSON object`},
		{`{"type":"t"} {}`, "invalid JSON"},
		{`{"type":"t"`, "invalid JSON"},
		{`[`, "invalid JSON"},
		{"   ", "empty body"},
		{`null`, "the body is a JSON null"},
		{`[]`, "the array holds no events"},
	} {
		checkBody(t, []byte(tc.body))
		_, _, err := (&bodyRules{idField: "id", required: []string{"type"}}).decode([]byte(tc.body))
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: err %v, want %q", tc.body, err, tc.err)
		}
	}
}
