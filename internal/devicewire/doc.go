// Package devicewire is the ws_ingress protocol, version 1: the envelopes
// a device sends to a daemon's ws_ingress source over a WebSocket, one
// text message each, and the daemon's answer to each. PROTOCOL.md,
// "Device ingress (ws_ingress)", is its specification; this package is
// the Go implementation of it, and both ends import it: the daemon
// (internal/push) reads envelopes with DecodeEnvelope and answers with
// Ack, the edge forwarder (internal/edge) makes envelopes with Encoder and
// reads the answers with DecodeAck. The limits both ends share are the
// constants below; internal/wire is the other protocol, between the
// daemon and its processors.
package devicewire

// Limits and defaults both ends of the protocol share.
const (
	// SchemaVersion is the only schema_version there is.
	SchemaVersion = 1
	// MaxIDBytes is the longest event_id, type, session_id and device_id,
	// and so the longest device id of a per-device token.
	MaxIDBytes = 256
	// DefaultMaxEnvelopeBytes is the default bound of one envelope: the
	// daemon's max_message_bytes and the forwarder's max_envelope_bytes,
	// which must not exceed it.
	DefaultMaxEnvelopeBytes = 1 << 20
	// MaxEnvelopeBytes is the largest bound of one envelope either end may
	// be configured with (64 MiB).
	MaxEnvelopeBytes = 64 << 20
	// DefaultWindow is how many envelopes of one connection may wait for
	// their answer by default: the daemon's max_inflight and the
	// forwarder's window.
	DefaultWindow = 64
)
