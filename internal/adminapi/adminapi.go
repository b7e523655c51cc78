// Package adminapi holds the names the daemon's admin HTTP API and its
// clients (the ingestor subcommands) share, so that a client needs no
// import of the daemon itself.
package adminapi

import "time"

// TotalCountHeader is the response header of GET /dlq giving how many dead
// letters the filter selects in all, beyond the page returned.
const TotalCountHeader = "X-Total-Count"

// TapPath is the admin endpoint `ingestor tap` follows: GET
// /tap?source=A&source=B&max_bytes=N streams the committed events as
// NDJSON, one line each (TapStart first, then TapEvent and TapDropped,
// TapEnd when the daemon ends the stream), with an empty line as a
// keepalive when nothing else was written for a while.
const TapPath = "/tap"

// The "type" of each line of GET /tap.
const (
	TapTypeStart   = "start"
	TapTypeEvent   = "event"
	TapTypeDropped = "dropped"
	TapTypeEnd     = "end"
)

// TapStart is the first line of GET /tap: what the session follows.
type TapStart struct {
	Type string `json:"type"`
	// Sources are the sources followed; empty for every source.
	Sources []string `json:"sources"`
	// MaxBytes is how many bytes of each payload are sent.
	MaxBytes int `json:"max_bytes"`
	// BufferEvents and BufferBytes bound what the daemon holds for the
	// session while its reader is behind; beyond, events are dropped.
	BufferEvents int `json:"buffer_events"`
	BufferBytes  int `json:"buffer_bytes"`
}

// TapEvent is a line of GET /tap: one event, once its commit is durable.
type TapEvent struct {
	Type        string    `json:"type"`
	Source      string    `json:"source"`
	Key         string    `json:"key"`
	Seq         int64     `json:"seq"`
	CommittedAt time.Time `json:"committed_at"`
	FetchedAt   time.Time `json:"fetched_at"`
	EventTime   time.Time `json:"event_time,omitzero"`
	// Size is the length of the whole payload in bytes.
	Size int `json:"size"`
	// Truncated: Payload (or PayloadB64) holds only the first bytes of
	// the payload, at most max_bytes, cut at a character boundary.
	Truncated bool `json:"truncated"`
	// Payload is those bytes as text, when they are valid UTF-8;
	// otherwise PayloadB64 has them in standard base64.
	Payload    *string `json:"payload,omitempty"`
	PayloadB64 string  `json:"payload_b64,omitempty"`
}

// TapDropped is a line of GET /tap: Dropped events were committed after
// the previous event line but not sent, as the session's buffer was full
// (its reader was too slow).
type TapDropped struct {
	Type    string `json:"type"`
	Dropped int64  `json:"dropped"`
}

// TapEnd is the last line of GET /tap when the daemon ends the stream.
type TapEnd struct {
	Type   string `json:"type"`
	Reason string `json:"reason"`
}
