package queue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ReplayDeadLetters puts the events of the active event dead letters f
// selects back into the queue, in new frames of up to EventsPerFrame events
// per source with their delivery count reset, and marks the dead letters
// replayed (they stay readable by id, with a "replayed" history entry).
// It returns how many events it queued and their frames, for the sender.
//
// Selecting a payload dead letter by id is an error (ErrPayloadDeadLetter)
// and replays nothing; a filter without ids skips payload dead letters.
// An entry whose event was queued again by other means (a forced replay)
// is marked replayed without queuing anything.
//
// Each event's key moves into the current ledger generation with a new
// seq, keeping its attempts and last seen; its old seq keeps an acked
// mark, no longer dead.
func (q *Queue) ReplayDeadLetters(ctx context.Context, f DLQFilter) (int, []Frame, error) {
	var frames []Frame
	var n int
	r := &request{apply: func(tx *sql.Tx) error {
		frames, n = nil, 0
		now := time.Now()
		bySource, order, err := q.heldDeadLetters(tx, f, now)
		if err != nil || len(order) == 0 {
			return err
		}
		// Frame ids must never be reused and load() derives the next one
		// partly from the newest frame_log row: record the high mark, as
		// Forget does.
		if _, err := tx.Exec(`UPDATE meta SET value = max(value, ?) WHERE key = 'frame_high'`, q.nextFrame-1); err != nil {
			return err
		}
		for _, src := range order {
			hs := bySource[src]
			for start := 0; start < len(hs); start += q.opts.EventsPerFrame {
				fr, err := q.replayFrame(tx, src, hs[start:min(start+q.opts.EventsPerFrame, len(hs))], now)
				if err != nil {
					return err
				}
				n += len(fr.Events)
				frames = append(frames, fr)
			}
		}
		return nil
	}}
	committed := func() {
		q.pendingEvents.Add(int64(n))
		q.pendingFrames.Add(int64(len(frames)))
	}
	if err := q.submit(ctx, r, committed); err != nil {
		return 0, nil, fmt.Errorf("replay dead letters: %w", err)
	}
	return n, frames, nil
}

// heldDL is an active event dead letter to replay, with its event's
// ledger row and raw reference.
type heldDL struct {
	dl                    activeDL
	oldSeq, rawID, et     int64
	gen                   int
	off, length, attempts int
	lastSeen              int64
}

// heldDeadLetters reads the active event dead letters f selects, by
// source (in the order sources first appear). An entry whose event is no
// longer dead in the ledger is marked replayed without queuing anything;
// a payload dead letter named by id is an error.
func (q *Queue) heldDeadLetters(tx *sql.Tx, f DLQFilter, now time.Time) (map[string][]heldDL, []string, error) {
	sel, err := selectActive(tx, f)
	if err != nil {
		return nil, nil, err
	}
	bySource := map[string][]heldDL{}
	var order []string
	for _, a := range sel {
		if a.key == "" {
			if len(f.IDs) > 0 {
				return nil, nil, fmt.Errorf("dead letter %d: %w", a.id, ErrPayloadDeadLetter)
			}
			continue
		}
		h := heldDL{dl: a}
		k, ok, err := lookupKey(context.Background(), tx, a.source, a.key)
		if err == nil && ok {
			h.oldSeq, h.gen, h.attempts, h.lastSeen = k.seq, k.gen, int(k.attempts), k.lastSeen
			err = tx.QueryRow(`SELECT raw_id, event_time, raw_off, raw_len FROM event_marks WHERE seq = ? AND dead = 1`, k.seq).Scan(&h.rawID, &h.et, &h.off, &h.length)
		}
		if !ok || errors.Is(err, sql.ErrNoRows) {
			if _, err := tx.Exec(`UPDATE dead_letters SET replayed_at = ?, history = history || ? WHERE id = ?`,
				now.UnixNano(), historyLine(now, "replayed", "event already queued again by other means"), a.id); err != nil {
				return nil, nil, err
			}
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if _, ok := bySource[a.source]; !ok {
			order = append(order, a.source)
		}
		bySource[a.source] = append(bySource[a.source], h)
	}
	return bySource, order, nil
}

// rawCopy is the copy of a raw-object row a replayed event points at.
type rawCopy struct {
	id      int64
	key     string
	fetched int64
}

// copyRawObjects gives each raw object chunk's events point into a copy
// of its row above every current seq, so that pruning, which assumes raw
// ids grow with seqs, never deletes a row a replayed event uses. It
// returns the copies by original id.
func (q *Queue) copyRawObjects(tx *sql.Tx, src string, chunk []heldDL) (map[int64]rawCopy, error) {
	copies := map[int64]rawCopy{}
	for _, h := range chunk {
		if _, ok := copies[h.rawID]; ok {
			continue
		}
		var c rawCopy
		if err := tx.QueryRow(`SELECT key, fetched_at FROM raw_objects WHERE id = ?`, h.rawID).Scan(&c.key, &c.fetched); err != nil {
			return nil, fmt.Errorf("raw object of %s/%s: %w", src, h.dl.key, err)
		}
		res, err := tx.Exec(`INSERT INTO raw_objects(key, fetched_at, seq_floor) VALUES (?, ?, ?)`, c.key, c.fetched, q.highSeq+1)
		if err != nil {
			return nil, err
		}
		if c.id, err = res.LastInsertId(); err != nil {
			return nil, err
		}
		copies[h.rawID] = c
	}
	return copies, nil
}

// replayFrame queues chunk's events of source src again as one new frame:
// their keys move into the current generation with new seqs, one
// frame_log row per run of events sharing a raw copy, the frame's row, and
// each dead letter marked replayed.
func (q *Queue) replayFrame(tx *sql.Tx, src string, chunk []heldDL, now time.Time) (Frame, error) {
	copies, err := q.copyRawObjects(tx, src, chunk)
	if err != nil {
		return Frame{}, err
	}
	frameID := q.nextFrame
	q.nextFrame++
	fr := Frame{ID: frameID, Source: src, Committed: now}
	var logFirst, logRaw int64
	var log []byte
	flush := func() error {
		if log == nil {
			return nil
		}
		_, err := tx.Exec(`INSERT INTO frame_log(first_seq, last_seq, frame_id, source, raw_id, events) VALUES (?,?,?,?,?,?)`,
			logFirst, q.highSeq, frameID, src, logRaw, log)
		log = nil
		return err
	}
	for _, h := range chunk {
		// The old seq stays acked (its frame may still be pending) and is
		// no longer dead: its raw reference is released.
		for _, stmt := range []string{
			`DELETE FROM ` + ledgerTables[h.gen] + ` WHERE source = ? AND key = ?`,
			`UPDATE event_marks SET dead = 0 WHERE seq = ?3`,
			`INSERT INTO ` + ledgerTables[q.gens.cur] + `(source, key, seq, attempts, last_seen) VALUES (?1, ?2, ?4, ?5, ?6)`,
		} {
			if _, err := tx.Exec(stmt, src, h.dl.key, h.oldSeq, q.highSeq+1, h.attempts, h.lastSeen); err != nil {
				return Frame{}, err
			}
		}
		raw := copies[h.rawID]
		if raw.id != logRaw {
			if err := flush(); err != nil {
				return Frame{}, err
			}
		}
		q.highSeq++
		seq := q.highSeq
		if log == nil {
			logFirst, logRaw = seq, raw.id
		}
		log = appendLogEvent(log, logFirst, logEvent{seq: seq, eventTime: h.et, rawOff: h.off, rawLen: h.length, key: h.dl.key})
		e := Event{Seq: seq, Source: src, Key: h.dl.key, FetchedAt: time.Unix(0, raw.fetched).UTC(), RawKey: raw.key, RawOff: h.off, RawLen: h.length}
		if h.et != 0 {
			e.EventTime = time.Unix(0, h.et).UTC()
		}
		fr.Events = append(fr.Events, e)
		if _, err := tx.Exec(`UPDATE dead_letters SET replayed_at = ?, history = history || ? WHERE id = ?`,
			now.UnixNano(), historyLine(now, "replayed", fmt.Sprintf("queued again as seq %d in frame %d", seq, frameID)), h.dl.id); err != nil {
			return Frame{}, err
		}
	}
	if err := flush(); err != nil {
		return Frame{}, err
	}
	first, last := fr.Events[0].Seq, fr.Events[len(fr.Events)-1].Seq
	if _, err := tx.Exec(`INSERT INTO frames(id, source, n, first_seq, last_seq, created_at) VALUES (?,?,?,?,?,?)`,
		frameID, src, len(fr.Events), first, last, now.UnixNano()); err != nil {
		return Frame{}, err
	}
	return fr, nil
}
