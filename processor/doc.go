// Package processor is the Go client for the ingestor daemon's processor
// protocol: it receives the events the daemon publishes over ZeroMQ, hands
// each one to a Handler and acknowledges the ones the Handler accepted.
// PROTOCOL.md at the repository root specifies the protocol for processors
// written in other languages.
//
// # Delivery is at least once
//
// The daemon keeps every event in its write-ahead queue until a processor
// acknowledges it. Events travel in frames; a frame that is not acknowledged
// within the daemon's ack_timeout is sent again, to any connected processor,
// with Frame.Delivery one higher. An event can therefore reach a Handler more
// than once: after a Handler error, after a processor stops or crashes
// before its acks left, or when an ack is lost. Events are never dropped
// silently, but duplicates are normal.
//
// # Idempotency keys
//
// (Event.Source, Event.Key) identifies an event: the key is unique within
// its source and stays the same across redeliveries and across re-fetches
// of the same upstream record. Make a Handler idempotent on that pair, for
// example with an upsert keyed by it or a unique index that rejects a second
// insert, so that processing an event twice has the effect of processing it
// once. Event.Seq is stable across redeliveries of a queued event but is not
// an identity: an upstream record fetched again after the daemon forgot it
// gets a new Seq and the same Key.
//
// # Acknowledgements
//
// A Handler acknowledges an event by returning nil. Returning an error
// leaves the event unacknowledged: it is logged, counted in Stats.Failed and
// delivered again after the daemon's ack timeout. A panic in a Handler is
// recovered and treated as an error. Return nil for an event that can never
// succeed (say, one that fails validation) once it is recorded somewhere,
// or it comes back at every ack timeout, up to the daemon's max_deliveries.
//
// Acks are batched. When every event of a frame succeeded the frame is acked
// whole; otherwise only the events that succeeded are acked one by one, and
// the daemon resends the frame holding just the others. A batch is sent when
// 256 frames are waiting, when no more frames are immediately available, or
// after Options.AckFlushInterval, whichever comes first, and when Run stops.
//
// # Running
//
// Run (or New and Client.Run) connects to the daemon and calls the Handler
// for each event, one at a time and in the order of the frame, until its
// context is cancelled; it then sends the acks it still holds and returns
// nil. Frames received but not yet handled when it stops are redelivered
// after the ack timeout. Several processors may connect to one daemon: it
// spreads frames among them.
package processor
