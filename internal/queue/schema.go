package queue

import (
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
)

// migrations are applied in order; migrations[i] takes the schema from
// user_version i to i+1. Never edit one that has shipped: append.
var migrations = []string{
	`
CREATE TABLE raw_objects (
	id         INTEGER PRIMARY KEY,
	key        TEXT    NOT NULL,
	fetched_at INTEGER NOT NULL,
	-- seq_floor is at most the seq of the object's first event: pruning
	-- finds the seq boundary of its dedupe window here, not in events.
	seq_floor  INTEGER NOT NULL
);
CREATE TABLE events (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	source     TEXT    NOT NULL,
	key        TEXT    NOT NULL,
	frame_id   INTEGER NOT NULL,
	event_time INTEGER NOT NULL,
	raw_id     INTEGER NOT NULL,
	raw_off    INTEGER NOT NULL,
	raw_len    INTEGER NOT NULL,
	acked      INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX events_source_key ON events(source, key);
CREATE TABLE frames (
	id         INTEGER PRIMARY KEY,
	source     TEXT    NOT NULL,
	n          INTEGER NOT NULL,
	first_seq  INTEGER NOT NULL,
	last_seq   INTEGER NOT NULL,
	deliveries INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL
);
CREATE TABLE meta (
	key   TEXT PRIMARY KEY,
	value INTEGER NOT NULL
);
INSERT INTO meta(key, value) VALUES ('frame_high', 0);
CREATE TABLE offsets (
	source     TEXT PRIMARY KEY,
	cursor     TEXT    NOT NULL,
	updated_at INTEGER NOT NULL
);
CREATE TABLE dead_letters (
	id         INTEGER PRIMARY KEY,
	source     TEXT    NOT NULL,
	reason     TEXT    NOT NULL,
	raw_key    TEXT    NOT NULL,
	frame_id   INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL
);
CREATE INDEX dead_letters_source ON dead_letters(source, created_at);
`,
	// v2: the duplicate-arrival ledger and per-event dead letters.
	`
ALTER TABLE events ADD COLUMN attempts   INTEGER NOT NULL DEFAULT 1;
ALTER TABLE events ADD COLUMN last_seen  INTEGER NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN last_error TEXT    NOT NULL DEFAULT '';
-- dead is 1 while the event sits in an active dead letter: Prune keeps it.
ALTER TABLE events ADD COLUMN dead       INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dead_letters ADD COLUMN seq         INTEGER NOT NULL DEFAULT 0;
-- event_key is empty for a payload dead letter (a malformed upstream
-- response), set for an event dead letter.
ALTER TABLE dead_letters ADD COLUMN event_key   TEXT    NOT NULL DEFAULT '';
ALTER TABLE dead_letters ADD COLUMN deliveries  INTEGER NOT NULL DEFAULT 0;
-- history holds JSON lines, one per thing that happened to the entry.
ALTER TABLE dead_letters ADD COLUMN history     TEXT    NOT NULL DEFAULT '';
ALTER TABLE dead_letters ADD COLUMN replayed_at INTEGER NOT NULL DEFAULT 0;
CREATE INDEX dead_letters_active ON dead_letters(replayed_at, id);
`,
	// v3: payload dead letters resolved by a later good fetch.
	`
-- request is the source's cursor a malformed payload was fetched with (the
-- request to fetch again); NULL for an event dead letter and for entries
-- from before v3, whose request is unknown, so nothing resolves them.
ALTER TABLE dead_letters ADD COLUMN request     TEXT;
-- resolved_at is set when a later fetch of the same request succeeded.
ALTER TABLE dead_letters ADD COLUMN resolved_at INTEGER NOT NULL DEFAULT 0;
CREATE INDEX dead_letters_request ON dead_letters(source, request) WHERE event_key = '' AND resolved_at = 0;
`,
	// v4: the time before which a source must not ask its upstream again
	// (a Retry-After promise), kept across restarts.
	`
CREATE TABLE not_before (
	source     TEXT PRIMARY KEY,
	until      INTEGER NOT NULL, -- unix nanoseconds
	updated_at INTEGER NOT NULL
);
`,
	// v5: the sequence numbers of push devices, to find events lost at the
	// edge (devseq.go).
	`
CREATE TABLE device_seqs (
	source     TEXT    NOT NULL,
	device     TEXT    NOT NULL,
	high       INTEGER NOT NULL, -- the highest seq stored
	-- missing is a JSON array of [from, to, since] ranges below high not
	-- stored yet, since in unix nanoseconds: reported once older than the
	-- source's grace.
	missing    TEXT    NOT NULL DEFAULT '[]',
	gaps       INTEGER NOT NULL DEFAULT 0, -- ranges reported lost
	lost       INTEGER NOT NULL DEFAULT 0, -- seqs in them
	resets     INTEGER NOT NULL DEFAULT 0, -- times the seq went back
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (source, device)
) WITHOUT ROWID;
`,
	// v6: the last rejected deliveries of each webhook source, kept for ops
	// to see why a provider's requests were refused (quarantine.go).
	`
CREATE TABLE quarantine (
	id          INTEGER PRIMARY KEY AUTOINCREMENT,
	source      TEXT    NOT NULL,
	at          INTEGER NOT NULL, -- unix nanoseconds
	reason      TEXT    NOT NULL, -- a machine reason: bad_signature, too_large, ...
	detail      TEXT    NOT NULL, -- the error answered
	code        INTEGER NOT NULL, -- the HTTP status answered
	request_id  TEXT    NOT NULL,
	remote      TEXT    NOT NULL,
	method      TEXT    NOT NULL,
	path        TEXT    NOT NULL,
	headers     TEXT    NOT NULL, -- JSON object, secrets redacted
	body        BLOB    NOT NULL, -- capped at quarantine_body_bytes
	truncated   INTEGER NOT NULL  -- 1 when body is not the whole request body
);
CREATE INDEX quarantine_source ON quarantine(source, id);
`,
	// v7: the signature verdict of each event of a signed webhook source,
	// for the status look-up (verdict.go).
	`
CREATE TABLE event_verdicts (
	seq         INTEGER PRIMARY KEY, -- the event's events.id
	scheme      TEXT    NOT NULL,    -- the source's signature scheme
	secret      INTEGER NOT NULL,    -- the position of the secret that matched
	signed_at   INTEGER NOT NULL,    -- the signed Unix time in seconds, 0 for none
	received_at INTEGER NOT NULL     -- unix nanoseconds
);
`,
	// v8: a payload that fails again counts on its active entry instead
	// of adding one (DeadLetter). An event has one active entry by
	// construction: its key is unique in events, and a dead event is never
	// delivered again until its entry is replayed.
	`
-- digest is a payload dead letter's content hash (the hex SHA-256 prefix
-- its raw key ends with); '' for an event and for entries from before v8.
ALTER TABLE dead_letters ADD COLUMN digest    TEXT    NOT NULL DEFAULT '';
-- count is how many times the entry's payload failed (1 for an event);
-- last_seen (unix nanoseconds) the last time, 0 for the first only.
ALTER TABLE dead_letters ADD COLUMN count     INTEGER NOT NULL DEFAULT 1;
ALTER TABLE dead_letters ADD COLUMN last_seen INTEGER NOT NULL DEFAULT 0;
CREATE INDEX dead_letters_digest ON dead_letters(source, digest) WHERE event_key = '' AND digest != '' AND resolved_at = 0 AND replayed_at = 0;
`,
	// v9: the W3C trace context of traced events, which every frame of
	// them carries, also after a restart: a polled batch's (its poll's) on
	// its raw object, NULL for a batch not traced (its row grows by two
	// bytes); a push event's own (its request's or envelope's) in
	// event_traces, which holds rows only for those.
	`
ALTER TABLE raw_objects ADD COLUMN traceparent TEXT;
ALTER TABLE raw_objects ADD COLUMN tracestate  TEXT;
CREATE TABLE event_traces (
	seq         INTEGER PRIMARY KEY, -- the event's events.id
	traceparent TEXT    NOT NULL,
	tracestate  TEXT
);
`,
	// v10: the ledger in generations (ledger.go). The per-event rows of
	// events become a key row in a WITHOUT ROWID generation table, one
	// frame_log row per frame (its events packed in a blob), and
	// event_marks rows for the exceptions (key acks, nacks, dead
	// letters). migrateLedger (a Go step) copies the events table into
	// them, then replaces it with a read-only view.
	`
CREATE TABLE ledger_0 (
	source    TEXT    NOT NULL,
	key       TEXT    NOT NULL,
	seq       INTEGER NOT NULL,
	attempts  INTEGER NOT NULL DEFAULT 1,
	last_seen INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (source, key)
) WITHOUT ROWID;
CREATE TABLE ledger_1 (
	source    TEXT    NOT NULL,
	key       TEXT    NOT NULL,
	seq       INTEGER NOT NULL,
	attempts  INTEGER NOT NULL DEFAULT 1,
	last_seen INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (source, key)
) WITHOUT ROWID;
-- One row per frame (or per run of a frame's events sharing a raw object):
-- events holds each event's seq offset, event time, raw offset, raw
-- length and key (ledger.go, appendLogEvent).
CREATE TABLE frame_log (
	first_seq INTEGER PRIMARY KEY,
	last_seq  INTEGER NOT NULL,
	frame_id  INTEGER NOT NULL,
	source    TEXT    NOT NULL,
	raw_id    INTEGER NOT NULL,
	events    BLOB    NOT NULL
);
-- Per-event state, only for the exceptions. A dead event keeps its raw
-- reference here: it outlives its frame_log row.
CREATE TABLE event_marks (
	seq        INTEGER PRIMARY KEY,
	acked      INTEGER NOT NULL DEFAULT 0,
	dead       INTEGER NOT NULL DEFAULT 0,
	last_error TEXT    NOT NULL DEFAULT '',
	raw_id     INTEGER NOT NULL DEFAULT 0,
	raw_off    INTEGER NOT NULL DEFAULT 0,
	raw_len    INTEGER NOT NULL DEFAULT 0,
	event_time INTEGER NOT NULL DEFAULT 0
);
INSERT INTO meta(key, value) VALUES
	('seq_high', coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0)),
	('gen_cur', 0), ('gen_seq', 0), ('gen_since', 0);
`,
}

// goSteps run after the SQL of the migration of the same index, in its
// transaction.
var goSteps = map[int]func(tx *sql.Tx) error{9: migrateLedger}

// migrate brings the schema to the newest version, one transaction per step.
// It logs to log before a step that copies the ledger (v10), which takes
// about a second per 400,000 remembered events.
func migrate(db *sql.DB, log *slog.Logger) error {
	var v int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this binary knows (%d)", v, len(migrations))
	}
	if v > 0 && v <= 9 && log != nil {
		var events int64
		if err := db.QueryRow(`SELECT count(*) FROM events`).Scan(&events); err != nil {
			return fmt.Errorf("count the events to migrate: %w", err)
		}
		log.Info("upgrading the queue's ledger to generations: copying every remembered event once (about a second per 400,000)",
			"events", events, "from_schema", v, "to_schema", len(migrations))
	}
	return migrateTo(db, v, len(migrations))
}

// migrateTo applies the migrations from version v up to version to.
func migrateTo(db *sql.DB, v, to int) error {
	for ; v < to; v++ {
		tx, err := db.Begin()
		if err != nil {
			return fmt.Errorf("migrate to %d: %w", v+1, err)
		}
		if _, err := tx.Exec(migrations[v]); err != nil {
			return fmt.Errorf("migrate to %d: %w", v+1, errors.Join(err, tx.Rollback()))
		}
		if step := goSteps[v]; step != nil {
			if err := step(tx); err != nil {
				return fmt.Errorf("migrate to %d: %w", v+1, errors.Join(err, tx.Rollback()))
			}
		}
		if _, err := tx.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, v+1)); err != nil {
			return fmt.Errorf("migrate to %d: %w", v+1, errors.Join(err, tx.Rollback()))
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migrate to %d: %w", v+1, err)
		}
	}
	return nil
}
