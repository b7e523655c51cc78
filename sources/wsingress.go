package sources

// WSIngressSpec configures kind "ws_ingress": devices connect to
// /ingest/NAME/ws on the push listener and send envelopes, each
// acknowledged only once it is durable.
type WSIngressSpec struct {
	// MaxMessageBytes caps one envelope. Default 1 MiB.
	MaxMessageBytes int64 `toml:"max_message_bytes"`
}

func newWSIngressSpec() *WSIngressSpec {
	return &WSIngressSpec{MaxMessageBytes: 1 << 20}
}

// Validate implements Spec.
func (s *WSIngressSpec) Validate() []FieldError {
	var errs []FieldError
	if s.MaxMessageBytes < 1 || s.MaxMessageBytes > 64<<20 {
		errs = append(errs, FieldError{"max_message_bytes", "must be between 1 and 67108864 (64 MiB)"})
	}
	return errs
}

// Open implements Spec: a ws_ingress source has nothing to fetch.
func (s *WSIngressSpec) Open(env Env) (Source, error) {
	if errs := s.Validate(); len(errs) > 0 {
		return nil, specErrors(env.Name, "ws_ingress", errs)
	}
	return pushSource{name: env.Name, kind: "ws_ingress"}, nil
}

// Authenticated implements PushSpec.
func (s *WSIngressSpec) Authenticated() bool { return false }
