// Package edgeconfig is the edge forwarder's configuration: one struct,
// Config, that the [edge] table of its file decodes into (config.LoadEdge),
// the flags of `ingestor edge` bind to, and internal/edge runs with; its
// defaults (Default) and its checks (Validate). It is a package of its own
// so that reading the configuration does not bring in the forwarder's
// SQLite outbox, as sources does for the daemon's source kinds.
package edgeconfig
