// Package actors wires the daemon's ingestion pipeline as protoactor-go
// actors.
//
// The Supervisor spawns the shared actors, PersistRaw and Publisher, and
// one SourceActor per enabled [source.NAME] block, and restarts a crashed
// child after a capped exponential backoff with full jitter, without
// touching its siblings.
//
// A SourceActor reads its durable cursor from the queue when it starts,
// and the not-before time an upstream's Retry-After set (kept in the queue
// before the wait begins), which it honours before its first fetch. A
// drain cancels its fetch in progress: that batch is not durable yet.
// A fetched batch then flows SourceActor -> PersistRaw (raw payload
// durable) -> SourceActor -> Publisher (events and cursor committed to the
// write-ahead queue in one transaction, then handed to the ZeroMQ sender)
// -> SourceActor. Every Receive stays quick: HTTP, raw-store and SQLite
// work runs in goroutines whose results come back as messages, and the
// Publisher parks a batch rather than wait for a busy queue writer.
//
// Delivery is not made of actors: the ZeroMQ sender and ack receiver
// (internal/delivery) each own their socket on one goroutine, which the
// daemon runs beside the pipeline.
//
// Backpressure is an in-flight window, not a full mailbox: a source holds at
// most inflight_batches fetched batches that are not yet committed and
// fetches nothing more until one commits; when the queue holds
// max_pending_events unacked events, sources pause polling.
//
// A malformed payload does not move the cursor: the source fetches the same
// request again, with backoff, up to malformed_retries times, then
// dead-letters it (malformed.go); a later good fetch of that request marks
// its dead letters resolved.
//
// Each SourceActor reports its state to Metrics as it goes (status.go):
// polling, waiting and for what until when, failing with its last error;
// the supervisor adds its crashes. The daemon's GET /status reads it with
// Metrics.SourceStatus, keyed by source name; Metrics.ForgetSource drops a
// removed source's status and metric series.
package actors
