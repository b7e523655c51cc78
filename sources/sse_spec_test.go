package sources

import (
	"reflect"
	"slices"
	"testing"
)

func TestSSESpecDefaults(t *testing.T) {
	spec, ok := NewSpec("sse")
	if !ok {
		t.Fatal("kind sse is not registered")
	}
	want := &SSESpec{MaxBatch: 1000, ReadTimeout: "60s", MaxEventBytes: 1 << 20, ReconnectMax: "30s"}
	if !reflect.DeepEqual(spec, want) {
		t.Fatalf("defaults %+v, want %+v", spec, want)
	}
	if errs := spec.Validate(); len(errs) != 1 || errs[0].Key != "url" {
		t.Fatalf("defaults without url: %v, want only url reported", errs)
	}
}

func TestSSESpecValidate(t *testing.T) {
	good := func() *SSESpec {
		s := newSSESpec()
		s.URL = "https://stream.example.com/v1/events?token=x"
		return s
	}
	cases := []struct {
		name string
		edit func(*SSESpec)
		want []string // keys reported
	}{
		{"good", func(*SSESpec) {}, nil},
		{"everything set", func(s *SSESpec) {
			s.Headers = map[string]string{"Authorization": "Bearer x", "Host": "h", "Accept": "text/event-stream"}
			s.InitialCursor, s.EventTypes = "42", []string{"trade", "message"}
			s.IDField, s.TimeField, s.RecordsPath = "id", "meta.ts", "data.items"
		}, nil},
		{"ws url", func(s *SSESpec) { s.URL = "wss://example.com" }, []string{"url"}},
		{"relative url", func(s *SSESpec) { s.URL = "http:///path" }, []string{"url"}},
		{"cursor in url", func(s *SSESpec) { s.URL = "http://h/events?since={cursor}" }, []string{"url"}},
		{"insecure on http", func(s *SSESpec) { s.URL, s.TLSInsecureSkipVerify = "http://h", true }, []string{"tls_insecure_skip_verify"}},
		{"ca file on http", func(s *SSESpec) { s.URL, s.TLSCAFile = "http://h", "ca.pem" }, []string{"tls_ca_file"}},
		{"missing ca file", func(s *SSESpec) { s.TLSCAFile = "/nonexistent/ca.pem" }, []string{"tls_ca_file"}},
		{"ca file and insecure", func(s *SSESpec) { s.TLSCAFile, s.TLSInsecureSkipVerify = "/nonexistent/ca.pem", true },
			[]string{"tls_ca_file", "tls_insecure_skip_verify"}},
		{"Last-Event-ID header", func(s *SSESpec) { s.Headers = map[string]string{"last-event-id": "5"} }, []string{"headers.last-event-id"}},
		{"bad header name", func(s *SSESpec) { s.Headers = map[string]string{"X Token": "x"} }, []string{"headers"}},
		{"initial cursor with a newline", func(s *SSESpec) { s.InitialCursor = "4\n2" }, []string{"initial_cursor"}},
		{"empty event type", func(s *SSESpec) { s.EventTypes = []string{"a", ""} }, []string{"event_types"}},
		{"paths", func(s *SSESpec) { s.IDField, s.TimeField, s.RecordsPath = ".id", "t.", "a..b" },
			[]string{"id_field", "time_field", "records_path"}},
		{"max_batch", func(s *SSESpec) { s.MaxBatch = 100_001 }, []string{"max_batch"}},
		{"durations", func(s *SSESpec) { s.ReadTimeout, s.ReconnectMax = "soon", "0s" }, []string{"read_timeout", "reconnect_max"}},
		{"max_event_bytes", func(s *SSESpec) { s.MaxEventBytes = 0 }, []string{"max_event_bytes"}},
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
			src, err := s.Open(Env{Name: "sse"})
			if (err != nil) != (tc.want != nil) {
				t.Fatalf("Open: %v", err)
			}
			if src != nil {
				if err := src.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
