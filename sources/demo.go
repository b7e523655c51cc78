package sources

import "errors"

// DemoSpec configures kind "demo": a synthetic generator that needs no
// network, so the daemon does real work offline out of the box.
type DemoSpec struct {
	// EventsPerTick is how many events one fetch produces.
	EventsPerTick int `toml:"events_per_tick"`
	// EventSize is the approximate size of one event in bytes.
	EventSize int `toml:"event_size"`
	// MalformedEvery makes every Nth fetch return a malformed payload, to
	// exercise the dead-letter path; 0 never does.
	MalformedEvery int `toml:"malformed_every"`
}

func newDemoSpec() *DemoSpec {
	return &DemoSpec{EventsPerTick: 100, EventSize: 256}
}

// Validate implements Spec.
func (s *DemoSpec) Validate() []FieldError {
	var errs []FieldError
	if s.EventsPerTick < 1 || s.EventsPerTick > 1_000_000 {
		errs = append(errs, FieldError{"events_per_tick", "must be between 1 and 1000000"})
	}
	if s.EventSize < 64 || s.EventSize > 1<<20 {
		errs = append(errs, FieldError{"event_size", "must be between 64 and 1048576"})
	}
	if s.MalformedEvery < 0 {
		errs = append(errs, FieldError{"malformed_every", "must not be negative"})
	}
	return errs
}

// Open implements Spec. PLACEHOLDER: replaced by the real generator.
func (s *DemoSpec) Open(env Env) (Source, error) { return nil, errors.New("demo: not built yet") }
