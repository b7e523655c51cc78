package sources

// WebhookSpec configures kind "webhook": an upstream POSTs events to
// /ingest/NAME on the push listener, and each is answered only once it is
// durable.
type WebhookSpec struct {
	// MaxBodyBytes caps a request body. Default 1 MiB.
	MaxBodyBytes int64 `toml:"max_body_bytes"`
}

func newWebhookSpec() *WebhookSpec {
	return &WebhookSpec{MaxBodyBytes: 1 << 20}
}

// Validate implements Spec.
func (s *WebhookSpec) Validate() []FieldError {
	var errs []FieldError
	if s.MaxBodyBytes < 1 || s.MaxBodyBytes > 64<<20 {
		errs = append(errs, FieldError{"max_body_bytes", "must be between 1 and 67108864 (64 MiB)"})
	}
	return errs
}

// Open implements Spec: a webhook source has nothing to fetch.
func (s *WebhookSpec) Open(env Env) (Source, error) {
	if errs := s.Validate(); len(errs) > 0 {
		return nil, specErrors(env.Name, "webhook", errs)
	}
	return pushSource{name: env.Name, kind: "webhook"}, nil
}

// Authenticated implements PushSpec.
func (s *WebhookSpec) Authenticated() bool { return false }
