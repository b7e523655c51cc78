package sources

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestWebSocketSpecDefaults(t *testing.T) {
	spec, ok := NewSpec("websocket")
	if !ok {
		t.Fatal("kind websocket is not registered")
	}
	want := &WebSocketSpec{MaxBatch: 1000, PingInterval: "20s", ReadTimeout: "60s", MaxMessageBytes: 1 << 20, ReconnectMax: "30s"}
	if !reflect.DeepEqual(spec, want) {
		t.Fatalf("defaults %+v, want %+v", spec, want)
	}
	if errs := spec.Validate(); len(errs) != 1 || errs[0].Key != "url" {
		t.Fatalf("defaults without url: %v, want only url reported", errs)
	}
}

func TestWebSocketSpecValidate(t *testing.T) {
	good := func() *WebSocketSpec {
		s := newWebSocketSpec()
		s.URL = "wss://stream.example.com/v1?token=x"
		return s
	}
	cases := []struct {
		name string
		edit func(*WebSocketSpec)
		want []string // keys reported
	}{
		{"good", func(*WebSocketSpec) {}, nil},
		{"http url", func(s *WebSocketSpec) { s.URL = "https://example.com" }, []string{"url"}},
		{"relative url", func(s *WebSocketSpec) { s.URL = "ws:///path" }, []string{"url"}},
		{"insecure on ws", func(s *WebSocketSpec) { s.URL, s.TLSInsecureSkipVerify = "ws://h", true }, []string{"tls_insecure_skip_verify"}},
		{"ca file on ws", func(s *WebSocketSpec) { s.URL, s.TLSCAFile = "ws://h", "ca.pem" }, []string{"tls_ca_file"}},
		{"missing ca file", func(s *WebSocketSpec) { s.TLSCAFile = "/nonexistent/ca.pem" }, []string{"tls_ca_file"}},
		{"ca file and insecure", func(s *WebSocketSpec) { s.TLSCAFile, s.TLSInsecureSkipVerify = "/nonexistent/ca.pem", true },
			[]string{"tls_ca_file", "tls_insecure_skip_verify"}},
		{"handshake header", func(s *WebSocketSpec) { s.Headers = map[string]string{"upgrade": "x"} }, []string{"headers.upgrade"}},
		{"bad header name", func(s *WebSocketSpec) { s.Headers = map[string]string{"X Token": "x"} }, []string{"headers"}},
		{"cursor without field", func(s *WebSocketSpec) { s.Subscribe = `{"since":"{cursor}"}` }, []string{"subscribe"}},
		{"cursor in url", func(s *WebSocketSpec) {
			s.URL, s.CursorField, s.InitialCursor = "wss://h/{cursor}/events?since={cursor}", "seq", "0"
		}, nil},
		{"cursor in header", func(s *WebSocketSpec) { s.Headers, s.CursorField = map[string]string{"X-Since": "{cursor}"}, "seq" }, nil},
		{"cursor in subscribe", func(s *WebSocketSpec) { s.Subscribe, s.CursorField = `{"since":{cursor}}`, "seq" }, nil},
		{"cursor in url host", func(s *WebSocketSpec) { s.URL, s.CursorField = "ws://{cursor}.example.com/", "seq" }, []string{"url"}},
		{"cursor sent nowhere", func(s *WebSocketSpec) { s.CursorField, s.InitialCursor = "seq", "0" }, []string{"cursor_field"}},
		{"url cursor without field", func(s *WebSocketSpec) { s.URL = "ws://h/events?since={cursor}" }, []string{"url"}},
		{"header cursor without field", func(s *WebSocketSpec) { s.Headers = map[string]string{"X-Since": "{cursor}"} }, []string{"headers.X-Since"}},
		{"cursor in host", func(s *WebSocketSpec) {
			s.Headers, s.Subscribe, s.CursorField = map[string]string{"host": "{cursor}.example.com"}, "{cursor}", "seq"
		}, []string{"headers.host"}},
		{"initial cursor without field", func(s *WebSocketSpec) { s.InitialCursor = "0" }, []string{"initial_cursor"}},
		{"paths", func(s *WebSocketSpec) {
			s.IDField, s.CursorField, s.TimeField, s.RecordsPath, s.Subscribe = ".id", "a..b", "t.", ".", "{cursor}"
		}, []string{"id_field", "cursor_field", "time_field", "records_path"}},
		{"max_batch", func(s *WebSocketSpec) { s.MaxBatch = 0 }, []string{"max_batch"}},
		{"durations", func(s *WebSocketSpec) { s.PingInterval, s.ReadTimeout, s.ReconnectMax = "soon", "0s", "-1s" },
			[]string{"ping_interval", "read_timeout", "reconnect_max"}},
		{"ping not shorter than read", func(s *WebSocketSpec) { s.PingInterval, s.ReadTimeout = "1m", "1m" }, []string{"ping_interval"}},
		{"max_message_bytes", func(s *WebSocketSpec) { s.MaxMessageBytes = 0 }, []string{"max_message_bytes"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.edit(s)
			var got []string
			for _, e := range s.Validate() {
				got = append(got, e.Key)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("reported %v, want %v", got, tc.want)
			}
			if _, err := s.Open(Env{Name: "ws"}); (err != nil) != (tc.want != nil) {
				t.Fatalf("Open: %v", err)
			}
		})
	}
}

func TestWebSocketParse(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name, recordsPath string
		body              string
		want              []string // the records' bytes
	}{
		{"one record per message", "", ` [ {"id":"a","n":1} , "text", 7 ] `, []string{`{"id":"a","n":1}`, `"text"`, `7`}},
		{"array messages", "", `[[{"id":"a"},{"id":"b"}],[],{"id":"c"}]`, []string{`{"id":"a"}`, `{"id":"b"}`, `{"id":"c"}`}},
		{"records_path", "data.items", `[{"type":"ack"},{"data":{"items":[{"id":"a"}, {"id":"b"}]}},{"data":{"items":{"id":"c"}}},{"data":{"items":null}}]`,
			[]string{`{"id":"a"}`, `{"id":"b"}`, `{"id":"c"}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := &wsSource{parser: wsParser{idField: "id", recordsPath: tc.recordsPath}}
			b, err := w.Parse([]byte(tc.body), at)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range b.Records {
				got = append(got, string(b.Body[r.Off:r.Off+r.Len]))
			}
			if !slices.Equal(got, tc.want) || !b.FetchedAt.Equal(at) {
				t.Fatalf("records %q, want %q", got, tc.want)
			}
			if b.Records[0].Key != "a" && tc.name != "one record per message" {
				t.Fatalf("key %q", b.Records[0].Key)
			}
		})
	}
	w := &wsSource{parser: wsParser{recordsPath: "data"}}
	for _, body := range []string{``, `{"not":"an array"}`, `[{"data":"a string"}]`, `[{"a":1}`} {
		if _, err := w.Parse([]byte(body), at); err == nil {
			t.Errorf("Parse(%q) succeeded", body)
		} else if _, ok := AsMalformed(err); !ok {
			t.Errorf("Parse(%q): %v, want a *MalformedError", body, err)
		}
	}
}

func TestWebSocketMessageValidation(t *testing.T) {
	p := wsParser{}
	for _, msg := range []string{``, ` `, `{"a":`, `{"a":1} {"b":2}`, `[1,]`, "\x00"} {
		if _, err := p.records(nil, []byte(msg)); err == nil {
			t.Errorf("message %q accepted", msg)
		}
	}
	recs, err := p.records(nil, []byte(" {\"a\":1}\n"))
	if err != nil || len(recs) != 1 || recs[0].Off != 1 || recs[0].Len != 7 || len(recs[0].Key) != 64 {
		t.Fatalf("records %+v, %v", recs, err)
	}
}

func TestWebSocketSubscribeEscapesCursor(t *testing.T) {
	for cursor, want := range map[string]string{
		``:                     `{"since":"","n":}`,
		`42`:                   `{"since":"42","n":42}`,
		`2026-01-02T03:04:05Z`: `{"since":"2026-01-02T03:04:05Z","n":2026-01-02T03:04:05Z}`,
		`a"b\c`:                `{"since":"a\"b\\c","n":a\"b\\c}`,
	} {
		if got := subscribeMessage(`{"since":"{cursor}","n":{cursor}}`, cursor); string(got) != want {
			t.Errorf("cursor %q: subscribe message %s, want %s", cursor, got, want)
		}
	}
}
