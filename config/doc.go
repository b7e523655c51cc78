// Package config loads and validates the ingestor's TOML configuration.
//
// Loading follows three steps, as in Prometheus: defaults first, then a
// strict decode, then validation. Every problem in the file is collected and
// returned at once as Errors, each located by file and line:
//
//	ingestor.toml:12: source "github": poll_url: is required for kind http_poll
//
// An unknown key or a bad value is reported at its own line; a missing
// required key at the header of its table. Each table and each source block
// is decoded key by key, and durations and percentages are parsed only
// during validation, so one bad value never hides the next.
//
// The file has four global tables, [daemon], [raw_store], [publish] and
// [defaults], and one [source.NAME] block per feed. A source block holds the
// common keys (kind, enabled, interval, jitter, timeout, inflight_batches,
// malformed_retries), inheriting from [defaults] any it leaves out, and the
// keys of its kind, which are decoded into the kind's sources.Spec and
// checked by its Validate method.
//
// String values may reference environment variables as ${NAME}, so that
// secrets stay out of the file; $${ stands for a literal ${. References in a
// disabled source are left as written, so its secrets need not be set.
// Error messages never contain a value taken from the environment.
//
// The edge forwarder (`ingestor edge -c FILE`) has a file of its own with
// one [edge] table, read by LoadEdge into edgeconfig.Config with the same decoder and rules, and
// documented by EdgeExampleTOML (edge.example.toml).
//
// ExampleTOML, embedded from ingestor.example.toml, documents every key with
// its default; tests keep it loadable, complete, and identical to the copy
// at the repository root.
package config
