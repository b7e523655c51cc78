// Package datadir guards a data dir against two processes using it at
// once: the daemon holds the lock while it runs, and the offline tools
// (`ingestor replay`, `ingestor doctor`, `ingestor dlq` with the daemon
// stopped) take it before they open the queue. A dir the process may not
// write in is refused before anything in it is touched.
package datadir
