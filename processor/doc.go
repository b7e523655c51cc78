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
// with its delivery number one higher. An event can therefore reach a Handler more
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
// nacks it: the error is logged, counted in Stats.Failed and sent to the
// daemon as the nack's reason. An error made with Permanent (say, for an
// event that fails validation) is a permanent nack: the daemon moves the
// event to its dead-letter list at once. Any other error is a retryable
// nack: the daemon records the reason and delivers the event again on its
// backoff schedule. A panic in a Handler is recovered and treated as a
// retryable error.
//
// Acks are batched, nacks with them. When every event of a frame succeeded
// the frame is acked whole; otherwise the events that succeeded are acked
// one by one and the others nacked. A batch is sent when 256 frames are
// waiting (or 4096 single-event acks and nacks, or about 512 KiB of them,
// which keeps each ack far below the daemon's limits), when no more frames
// are immediately available and no frame is being processed, or after
// Options.AckFlushInterval, whichever comes first, and when Run stops.
//
// # Skipping duplicates and exactly-once effects
//
// With Options.DedupeDB, Run records every processed (source, key) in a
// SQLite table, with an in-memory cache in front, and skips events found
// there: they are acknowledged again without calling the Handler and
// counted in Stats.Duplicates. The record is written after the Handler, so
// a crash in between still repeats it.
//
// Client.RunTx closes that gap when the effects live in a SQLite database:
// a TxHandler writes inside a transaction that also records the event's
// key, one transaction per frame with a savepoint per event, and the ack
// leaves only after the commit. A redelivery after a crash between the
// commit and the ack finds the key and is acknowledged without being
// applied again.
//
// # Running
//
// Run (or New and Client.Run) connects to the daemon and calls the Handler
// for each event, in the order of the frame, until its context is
// cancelled. Options.Workers frames are processed at once, each by one
// worker; the ZeroMQ sockets stay on Run's goroutine. When the context is
// cancelled Run stops receiving, lets each worker finish the event it is
// on, sends the acks and nacks it still holds and returns nil. Events not
// yet handled when it stops are redelivered after the ack timeout. Several
// processors may connect to one daemon: it spreads frames among them.
//
// An Event and its Payload are the Handler's to keep: each frame is
// received into memory of its own. With Options.RecycleFrames, for a
// Handler that keeps neither past its return, the memory of a frame whose
// events were handled is used again for the next frames.
//
// # Clusters
//
// Daemons in cluster mode share the sources, each with its own queue and
// endpoints. RunCluster follows them: one Client per member, from a fixed
// StaticMembers list or from etcd (package processor/etcdmembers), each
// acking on the sockets of the member that sent the frame. After a member
// crashes, another may send again events it had sent: deduplicate by
// (Source, Key) across members, as RunTx in one database does.
//
// # Security
//
// A daemon with publish.curve_secret_key_file set accepts only ZeroMQ
// CURVE connections from the processor keys in its
// publish.curve_authorized_keys_file. Set Options.CurveServerKey to the
// daemon's public key and Options.CurveSecretKey to the processor's own
// secret key (its public key is derived), both in Z85; ReadCurveKey reads
// them from the files `ingestor curve-keygen` writes:
//
//	server, err := processor.ReadCurveKey("/etc/ingestor/daemon.pub")
//	...
//	secret, err := processor.ReadCurveKey("/etc/processor/processor-a.key")
//	...
//	err = processor.Run(ctx, processor.Options{
//		Endpoint: "tcp://ingestor:5557", AckEndpoint: "tcp://ingestor:5558",
//		CurveServerKey: server, CurveSecretKey: secret,
//	}, handle)
//
// Both sockets are then encrypted and authenticated. A key the daemon does
// not authorize is refused at the handshake, over and over as ZeroMQ
// reconnects: Run keeps running but receives nothing, and the daemon
// counts and logs the refusals. The same happens with no keys against a
// CURVE daemon, or with keys against a daemon without CURVE. Keys are never
// logged.
package processor
