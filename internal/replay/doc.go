// Package replay re-ingests raw payloads that are already in the raw store
// through a source's current parsing rules: after a parser fix, the
// payloads it got wrong (or dead-lettered) are parsed again and their
// events queued, without asking the upstream for anything.
//
// A replay runs with the daemon stopped: it takes the data dir's lock, so
// it cannot run beside a daemon, and a daemon cannot start while it runs.
// The events it queues are delivered when the daemon next starts, which
// resends everything pending. The queue's UNIQUE(source, key) makes a
// replay idempotent: an event already queued, or acked within the dedupe
// window, is a duplicate and is not queued again, unless the replay is
// forced.
package replay
