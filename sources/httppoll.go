package sources

import (
	"errors"
	"net/url"
	"strings"
)

// HTTPPollSpec configures kind "http_poll": GET PollURL every interval and
// read a JSON array of records.
type HTTPPollSpec struct {
	// PollURL is the URL polled; required, http or https.
	PollURL string `toml:"poll_url"`
	// Headers are sent with every request; values may use ${ENV} and are
	// never logged.
	Headers map[string]string `toml:"headers"`
	// IDField is the dotted path of the record field that is the idempotency
	// key; when empty or absent in a record, the key is the SHA-256 of the
	// record's bytes.
	IDField string `toml:"id_field"`
	// CursorField is the dotted path of the record field whose largest value
	// becomes the cursor; empty means the source keeps no cursor.
	CursorField string `toml:"cursor_field"`
	// CursorParam is the query parameter that carries the cursor on the next
	// poll; required when CursorField is set.
	CursorParam string `toml:"cursor_param"`
	// TimeField is the dotted path of the record's RFC 3339 timestamp, used
	// for lag; optional.
	TimeField string `toml:"time_field"`
	// MaxBodyBytes caps a response body; a larger one is an error.
	MaxBodyBytes int64 `toml:"max_body_bytes"`
}

func newHTTPPollSpec() *HTTPPollSpec {
	return &HTTPPollSpec{MaxBodyBytes: 64 << 20}
}

// Validate implements Spec.
func (s *HTTPPollSpec) Validate() []FieldError {
	var errs []FieldError
	if s.PollURL == "" {
		errs = append(errs, FieldError{"poll_url", "is required for kind http_poll"})
	} else if u, err := url.Parse(s.PollURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, FieldError{"poll_url", "must be an absolute http or https URL"})
	}
	if s.CursorField != "" && s.CursorParam == "" {
		errs = append(errs, FieldError{"cursor_param", "is required when cursor_field is set"})
	}
	for _, p := range []struct{ key, val string }{{"id_field", s.IDField}, {"cursor_field", s.CursorField}, {"time_field", s.TimeField}} {
		if p.val != "" && (strings.HasPrefix(p.val, ".") || strings.HasSuffix(p.val, ".") || strings.Contains(p.val, "..")) {
			errs = append(errs, FieldError{p.key, "must be a dotted path such as \"id\" or \"meta.id\""})
		}
	}
	if s.MaxBodyBytes < 1 {
		errs = append(errs, FieldError{"max_body_bytes", "must be positive"})
	}
	return errs
}

// Open implements Spec. PLACEHOLDER: replaced by the real poller.
func (s *HTTPPollSpec) Open(env Env) (Source, error) {
	return nil, errors.New("http_poll: not built yet")
}
