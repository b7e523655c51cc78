// Package ingest is the one seam through which every path makes a batch
// durable: polled pages (the actors' PersistRaw and Publisher), pushed
// groups (push.Inbox) and replayed payloads (replay). The data path reads
// sources or push -> ingest -> queue -> delivery.
//
// A batch becomes durable in two steps, and nothing is acknowledged before
// both are done:
//
//  1. Write makes its raw bytes durable (fsynced on the file store). The
//     raw store decides where they go, and under which key: a page is
//     appended to its source's page segment where the store appends pages
//     (rawstore.PageAppender), else it is an object of its own under its
//     content key (rawstore.Key); a malformed payload is an object under
//     deadletter/. The caller gets back a Ref and never computes a key.
//  2. Commit (or TryCommit, without waiting, on a source's chain) commits
//     its events in one queue transaction with what goes with them: the
//     source's cursor (a polled page's last slice) or the device seqs and
//     signature verdicts of pushed events, and hands the new frames to
//     delivery, showing them first to the tap (`ingestor tap`, which
//     therefore shows only what is durable). RecordDeadLetter lists a
//     malformed payload once Write kept it.
//
// Every write that fails is shown to the DiskGuard, so that a full disk
// pauses new work (IsDiskFull tells the caller); DiskLow says when new work
// must wait. What to do about a failure (retry with backoff and spill,
// answer a push sender "retry later", end a replay) stays with the caller.
package ingest
