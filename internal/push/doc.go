// Package push serves the push sources (kind webhook and ws_ingress) on
// the push listener ([push] addr), apart from the ops and admin listeners.
//
// Every pushed event goes through the Inbox, which answers only once the
// event is durable, raw first and then its ledger row, as for a polled
// source: the request body (or WebSocket message) is written to the raw
// store and fsynced, then the event's row is committed to the write-ahead
// queue, then the sender is handed its frame and the upstream gets its
// answer. Group commit keeps that affordable: every request waiting when a
// worker takes work shares one raw object per source and one queue
// transaction. A duplicate (same source and idempotency key, within the
// queue's dedupe window) is not queued again; its answer carries the stored
// event's status.
//
// server.go holds the listener and the routing (/ingest/NAME...), guard.go
// what refuses a request before its source sees it (allow_cidrs,
// require_client_cert, rate_limiter), inbox.go the group commit,
// webhook*.go and wsingress*.go the two kinds, quarantine.go the refused
// webhook deliveries kept for ops (off the path of every answer).
package push
