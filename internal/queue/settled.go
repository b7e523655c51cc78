package queue

import (
	"context"
	"fmt"
	"sync"
)

// A settled cursor is a cursor whose events are all settled: acked, or
// dead-lettered. Cluster mode checkpoints it to etcd instead of the
// committed cursor, so that a member whose disk is lost with its queue
// loses nothing its upstream still has: the next owner fetches the
// unsettled tail again, under the same keys, which processors dedupe.
//
// With Options.TrackSettled the queue remembers, for each source, a mark
// per commit that moved its cursor: the cursor and the highest seq of the
// source's events at that commit. A mark is settled once no pending frame
// of the source starts at or below its seq. Marks live in memory: after a
// restart each stored cursor starts as one mark at the highest seq ever
// given, so it settles once every event queued before the restart has.
// A source keeps one mark per commit that added events and is not
// settled yet, plus one, and at most maxMarks: past that every second
// mark between the oldest and the newest is dropped, which only makes the
// settled cursor found coarser (older), never newer than it may be.

// maxMarks bounds the marks of one source (a backlog of many small
// commits while no processor acks): about 20 KiB a source at most.
const maxMarks = 256

// mark is one commit's cursor and the highest seq of the source's events
// when it committed.
type mark struct {
	seq    int64
	cursor string
}

// settledMarks are the marks of every source, guarded by mu.
type settledMarks struct {
	mu sync.Mutex
	// marks holds each source's marks in commit order.
	marks map[string][]mark
	// high is the highest seq of each source's events seen since the
	// queue opened.
	high map[string]int64
}

// record adds the mark of a commit whose last event of source has seq
// last (0 when it added none); globalHigh stands in for the source's
// highest seq when none was seen since the queue opened. A commit that added no event since the
// source's last mark replaces that mark: both cover the same events.
func (s *settledMarks) record(source string, last int64, cursor string, globalHigh int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if last > 0 {
		s.high[source] = max(s.high[source], last)
	}
	seq, ok := s.high[source]
	if !ok {
		seq = globalHigh
	}
	ms := s.marks[source]
	if n := len(ms); n > 0 && ms[n-1].seq == seq {
		ms[n-1].cursor = cursor
		return
	}
	ms = append(ms, mark{seq: seq, cursor: cursor})
	if len(ms) > maxMarks {
		ms = thin(ms)
	}
	s.marks[source] = ms
}

// thin drops every second mark between the oldest and the newest.
func thin(ms []mark) []mark {
	out := ms[:1]
	for i := 2; i < len(ms)-1; i += 2 {
		out = append(out, ms[i])
	}
	return append(out, ms[len(ms)-1])
}

// reset makes cursor the source's only mark, at seq.
func (s *settledMarks) reset(source string, seq int64, cursor string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.marks[source] = []mark{{seq: seq, cursor: cursor}}
}

// snapshot copies the marks of sources.
func (s *settledMarks) snapshot(sources []string) map[string][]mark {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]mark, len(sources))
	for _, src := range sources {
		if ms := s.marks[src]; len(ms) > 0 {
			out[src] = append([]mark(nil), ms...)
		}
	}
	return out
}

// trim drops the source's marks older than the settled mark at seq: it
// stays, as the base the next ones settle from.
func (s *settledMarks) trim(source string, seq int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ms := s.marks[source]
	i := 0
	for i < len(ms) && ms[i].seq < seq {
		i++
	}
	if i > 0 {
		s.marks[source] = append(ms[:0], ms[i:]...)
	}
}

// forget drops source's marks.
func (s *settledMarks) forget(source string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.marks, source)
	delete(s.high, source)
}

// loadSettled starts the marks at open: each stored cursor as one mark at
// the highest seq ever given.
func (q *Queue) loadSettled() error {
	q.marks = &settledMarks{marks: map[string][]mark{}, high: map[string]int64{}}
	if !q.opts.TrackSettled {
		return nil
	}
	rows, err := q.wdb.Query(`SELECT source, cursor FROM offsets`)
	if err != nil {
		return fmt.Errorf("load cursors: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var source, cursor string
		if err := rows.Scan(&source, &cursor); err != nil {
			return fmt.Errorf("load cursors: %w", err)
		}
		q.marks.reset(source, q.highSeq, cursor)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load cursors: %w", err)
	}
	return nil
}

// SettledCursors returns, for each of sources that has one, its newest
// settled cursor: every event committed up to that cursor is acked or
// dead-lettered. A source whose every mark still waits for events (or
// whose cursor was never stored) is absent. It needs
// Options.TrackSettled; without it the map is empty.
func (q *Queue) SettledCursors(ctx context.Context, sources []string) (map[string]string, error) {
	out := map[string]string{}
	if !q.opts.TrackSettled || len(sources) == 0 {
		return out, nil
	}
	// The marks are read before the frames: a mark is recorded after its
	// commit, so every frame of a mark read here is visible below.
	snap := q.marks.snapshot(sources)
	if len(snap) == 0 {
		return out, nil
	}
	low, err := q.lowestPending(ctx)
	if err != nil {
		return nil, err
	}
	for source, ms := range snap {
		i := len(ms) - 1
		if l, pending := low[source]; pending {
			for i >= 0 && ms[i].seq >= l {
				i--
			}
		}
		if i < 0 {
			continue
		}
		out[source] = ms[i].cursor
		q.marks.trim(source, ms[i].seq)
	}
	return out, nil
}

// lowestPending returns the lowest first seq of each source's pending
// frames.
func (q *Queue) lowestPending(ctx context.Context) (map[string]int64, error) {
	rows, err := q.rdb.QueryContext(ctx, `SELECT source, min(first_seq) FROM frames GROUP BY source`)
	if err != nil {
		return nil, fmt.Errorf("read the pending frames: %w", err)
	}
	defer rows.Close()
	low := map[string]int64{}
	for rows.Next() {
		var source string
		var seq int64
		if err := rows.Scan(&source, &seq); err != nil {
			return nil, fmt.Errorf("read the pending frames: %w", err)
		}
		low[source] = seq
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the pending frames: %w", err)
	}
	return low, nil
}

// ForgetSettled drops what the queue remembers of source's settled
// cursors: cluster mode calls it when the source leaves this member.
func (q *Queue) ForgetSettled(source string) {
	if q.opts.TrackSettled {
		q.marks.forget(source)
	}
}
