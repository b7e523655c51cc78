package sources

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// TestFileLayout checks the layout the package documentation describes:
// every file belongs to a kind (KIND.go or KIND_PART.go, the kind's name
// without underscores) or is one of the shared files, and every kind has
// its KIND.go.
func TestFileLayout(t *testing.T) {
	shared := map[string]bool{"source": true, "cursor": true, "push": true, "ratelimit": true, "tls": true, "oauth2": true, "stream": true}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	prefixes := make(map[string]bool)
	for _, k := range Kinds() {
		prefixes[strings.ReplaceAll(k, "_", "")] = false
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".go")
		if !ok {
			continue
		}
		name = strings.TrimSuffix(name, "_test")
		base, _, _ := strings.Cut(name, "_")
		if _, isKind := prefixes[base]; isKind {
			prefixes[base] = prefixes[base] || base == name
			continue
		}
		if !shared[name] {
			t.Errorf("%s belongs to no kind (%v) and is not a shared file: name it KIND_PART.go or list it in the package documentation", e.Name(), Kinds())
		}
	}
	for p, hasMain := range prefixes {
		if !hasMain {
			t.Errorf("kind file %s.go is missing", p)
		}
	}
}

// TestValidateOfflineReadsNoFile: each kind whose keys name files
// validates offline without reading them, says which it left unread, and
// still reports what needs no file.
func TestValidateOfflineReadsNoFile(t *testing.T) {
	const missing = "/nonexistent/offline-test"
	for _, tc := range []struct {
		name    string
		spec    OfflineSpec
		unread  []string
		offline []string // problems offline too
	}{
		{"http_poll", &HTTPPollSpec{PollURL: "https://x/", Method: "GET", Format: "json", RateBurst: 1, MaxBodyBytes: 1, TLSCAFile: missing},
			[]string{"tls_ca_file"}, nil},
		{"http_poll over http", &HTTPPollSpec{PollURL: "http://x/", Method: "GET", Format: "json", RateBurst: 1, MaxBodyBytes: 1, TLSCAFile: missing},
			nil, []string{"tls_ca_file: is only used with an https poll_url"}},
		{"websocket", &WebSocketSpec{URL: "wss://x/", TLSCAFile: missing}, []string{"tls_ca_file"}, nil},
		{"sse", &SSESpec{URL: "https://x/", TLSCAFile: missing}, []string{"tls_ca_file"}, nil},
		{"webhook", &WebhookSpec{TokenFile: missing}, []string{"token_file"}, nil},
		{"webhook with both", &WebhookSpec{Token: "0123456789abcdef0123", TokenFile: missing}, nil,
			[]string{"token_file: set token or token_file, not both"}},
		{"ws_ingress", &WSIngressSpec{TokensFile: missing}, []string{"tokens_file"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fill(tc.spec)
			problems, unread := tc.spec.ValidateOffline()
			if !slices.Equal(unread, tc.unread) {
				t.Errorf("unread %q, want %q", unread, tc.unread)
			}
			for _, fe := range problems {
				if strings.Contains(fe.Msg, missing) {
					t.Errorf("offline, a file was read: %v", fe)
				}
			}
			for _, want := range tc.offline {
				if !slices.ContainsFunc(problems, func(fe FieldError) bool { return strings.Contains(fe.Error(), want) }) {
					t.Errorf("offline problems %v lack %q", problems, want)
				}
			}
			if len(tc.unread) == 0 {
				return
			}
			online := tc.spec.Validate()
			if !slices.ContainsFunc(online, func(fe FieldError) bool { return fe.Key == tc.unread[0] && strings.Contains(fe.Msg, missing) }) {
				t.Errorf("online, %s was not read: %v", tc.unread[0], online)
			}
		})
	}
}

// fill gives spec the defaults of its kind for the keys the test left
// out, so that only the keys under test can be at fault.
func fill(spec OfflineSpec) {
	switch s := spec.(type) {
	case *WebSocketSpec:
		d := newWebSocketSpec()
		d.URL, d.TLSCAFile = s.URL, s.TLSCAFile
		*s = *d
	case *SSESpec:
		d := newSSESpec()
		d.URL, d.TLSCAFile = s.URL, s.TLSCAFile
		*s = *d
	case *WebhookSpec:
		d := newWebhookSpec()
		d.Token, d.TokenFile = s.Token, s.TokenFile
		*s = *d
	case *WSIngressSpec:
		d := newWSIngressSpec()
		d.TokensFile = s.TokensFile
		*s = *d
	case *HTTPPollSpec:
		d := newHTTPPollSpec()
		d.PollURL, d.TLSCAFile = s.PollURL, s.TLSCAFile
		*s = *d
	}
}
