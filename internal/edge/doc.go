// Package edge is the device side of ws_ingress: the forwarder that
// `ingestor edge` runs. It takes events from local producers, keeps them
// in its own SQLite outbox, and sends them over one WebSocket connection
// to a daemon's ws_ingress source (the protocol is in PROTOCOL.md,
// "Device ingress (ws_ingress)", and in internal/devicewire, which makes
// the envelopes and reads the answers).
//
// # What is guaranteed
//
// Nothing accepted is lost. An event is accepted, and its producer told
// so (a 200 on HTTP, an "accepted" line on the Unix socket; stdin has no
// answer), only after its row is committed to the outbox, which runs in
// WAL mode with synchronous = FULL: the row survives kill -9, a power cut
// and a reboot. A row is deleted only when the daemon answers "stored" for
// its event_id, which the daemon sends only after its own durable commit.
// Producers that send at the same time share one commit (a group commit),
// each request stored whole or refused whole.
//
// Delivery to the daemon is at least once. A row is sent again after a
// reconnection, a restart of either side, or a "retry" answer, always as
// the same bytes: its event_id, filled in once when the event was
// accepted, never changes, and the daemon stores each event_id once. The
// forwarder also fills ts, session_id (one per forwarder start),
// device_id, schema_version 1 and seq (a per-device counter, assigned in
// the transaction that stores the row) where the producer left them out.
//
// An envelope the daemon answers "rejected" is never sent again: it moves
// to the local dead_letters table with the reason (the newest 10,000 are
// kept). Items that are not valid envelopes are refused at the input
// with the reason and never stored.
//
// # Bounds and backpressure
//
// The outbox holds at most max_outbox_bytes of envelopes. When an event
// does not fit, it is refused: HTTP answers 503 with Retry-After and a
// JSON error, the Unix socket a "full" line; stdin stops reading until the
// daemon has acknowledged enough of the backlog, so a producer writing to
// a pipe is held back rather than losing events.
//
// At most Window envelopes wait for their answer at once. ACKs may come
// in any order and are matched by event_id. A connection that fails, or
// whose oldest envelope has no answer within AckTimeout, is dropped and
// made again after a capped exponential backoff with full jitter
// (internal/backoff); everything unanswered is resent on the new one.
// Every row still in the outbox is resent on start.
//
// # Using it
//
// Run starts a forwarder and returns when its context ends; Start returns
// a running Forwarder, for tests and for callers that need its addresses.
// Both take Options: the settings of the [edge] table (edgeconfig.Config,
// which config.LoadEdge reads without bringing in this package's SQLite)
// and what only a program gives (a logger, a registerer, a stdin).
// ReadStatus reads an outbox's backlog, whether a forwarder runs on it or
// not. The outbox's directory holds a LOCK file so that two forwarders
// never share one outbox.
package edge
