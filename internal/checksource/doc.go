// Package checksource is `ingestor check-source`: a dry run of one poll of
// one configured source, enabled or not, that shows each upstream request,
// the records extracted, the next cursor and any problem with a hint.
//
// It writes nothing: no raw store is opened, and the queue is only read,
// through a read-only SQLite connection, for the source's durable cursor.
package checksource
