package queue

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// A push device may number its events (ws_ingress "seq", which ingestor
// edge fills): a per-device counter that grows by one per event. The queue
// keeps, per source and device, the highest seq stored and the ranges
// below it not stored yet, in the transaction that stores the events, so
// that a number the device skipped (its outbox lost events) is found even
// across restarts. A range is reported lost once it stayed missing for the
// source's grace, when the device next stores an event: events of one
// device may arrive out of order (a window of envelopes in flight, a
// retry), and a late one fills its range before the grace ends. A seq
// below the highest that fills no range means the device's counter went
// back (its outbox was reset): that is reported too, and counting starts
// again from it. Only new events count; a duplicate's seq was counted when
// it was first stored. Numbers below the first seq stored of a device are
// never reported lost (see missingRange).

// SeqFinding is what a batch's device seqs revealed.
type SeqFinding struct {
	Device string
	// Reset is false for a gap: From to To (inclusive) were never stored
	// within the grace. It is true when the seq went back from From to To.
	Reset    bool
	From, To int64
}

// deviceSeq is one new event's device and seq.
type deviceSeq struct {
	device string
	seq    int64
}

// maxMissingRanges bounds the ranges kept per device: beyond it the
// oldest is reported at once.
const maxMissingRanges = 64

// missingRange is a range of seqs not stored yet, since a time. A quiet
// range lies below the first seq stored of a device: the numbers before
// it may have been sent to another daemon, or before this ledger, so it
// is there only for late envelopes to fill, and expires unreported.
type missingRange struct {
	From, To, Since int64
	Quiet           bool
}

func (r missingRange) MarshalJSON() ([]byte, error) {
	quiet := 0
	if r.Quiet {
		quiet = 1
	}
	return json.Marshal([4]int64{r.From, r.To, r.Since, int64(quiet)})
}

func (r *missingRange) UnmarshalJSON(b []byte) error {
	var a [4]int64
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	r.From, r.To, r.Since, r.Quiet = a[0], a[1], a[2], a[3] == 1
	return nil
}

// deviceState is one device_seqs row.
type deviceState struct {
	high               int64
	missing            []missingRange
	gaps, lost, resets int64
}

// trackSeqs updates the device_seqs rows of source with the seqs of a
// batch's new events, at now (unix nanoseconds), and returns the gaps and
// resets found.
func trackSeqs(tx *sql.Tx, source string, seqs []deviceSeq, grace time.Duration, now int64) ([]SeqFinding, error) {
	slices.SortStableFunc(seqs, func(a, b deviceSeq) int {
		if a.device != b.device {
			if a.device < b.device {
				return -1
			}
			return 1
		}
		return int(min(max(a.seq-b.seq, -1), 1))
	})
	var findings []SeqFinding
	for start := 0; start < len(seqs); {
		end := start
		for end < len(seqs) && seqs[end].device == seqs[start].device {
			end++
		}
		device := seqs[start].device
		st, known, err := loadDevice(tx, source, device)
		if err != nil {
			return nil, err
		}
		for _, s := range seqs[start:end] {
			if !known {
				// The first seq stored of the device: envelopes below it
				// still in flight fill the quiet range below it.
				st.high, known = s.seq, true
				if s.seq > 1 {
					st.missing = []missingRange{{From: 1, To: s.seq - 1, Since: now, Quiet: true}}
				}
				continue
			}
			findings = st.add(device, s.seq, now, findings)
		}
		findings = st.expire(device, now-int64(grace), findings)
		if err := st.store(tx, source, device, now); err != nil {
			return nil, err
		}
		start = end
	}
	return findings, nil
}

// add records seq, appending a reset to findings when it went back.
func (st *deviceState) add(device string, seq, now int64, findings []SeqFinding) []SeqFinding {
	switch {
	case seq > st.high:
		if seq > st.high+1 {
			st.missing = append(st.missing, missingRange{From: st.high + 1, To: seq - 1, Since: now})
		}
		st.high = seq
	case seq < st.high:
		i := slices.IndexFunc(st.missing, func(r missingRange) bool { return r.From <= seq && seq <= r.To })
		if i < 0 {
			st.resets++
			findings = append(findings, SeqFinding{Device: device, Reset: true, From: st.high, To: seq})
			st.high, st.missing = seq, nil
			break
		}
		r := st.missing[i]
		var split []missingRange
		if r.From < seq {
			split = append(split, missingRange{From: r.From, To: seq - 1, Since: r.Since, Quiet: r.Quiet})
		}
		if seq < r.To {
			split = append(split, missingRange{From: seq + 1, To: r.To, Since: r.Since, Quiet: r.Quiet})
		}
		st.missing = slices.Replace(st.missing, i, i+1, split...)
	}
	return findings
}

// expire reports the ranges missing since before cutoff, and the oldest
// beyond maxMissingRanges, as gaps.
func (st *deviceState) expire(device string, cutoff int64, findings []SeqFinding) []SeqFinding {
	kept := st.missing[:0]
	over := len(st.missing) - maxMissingRanges
	for i, r := range st.missing {
		if (r.Since <= cutoff || i < over) && r.Quiet {
			continue // expires unreported
		}
		if r.Since <= cutoff || i < over {
			st.gaps++
			st.lost += r.To - r.From + 1
			findings = append(findings, SeqFinding{Device: device, From: r.From, To: r.To})
			continue
		}
		kept = append(kept, r)
	}
	st.missing = kept
	return findings
}

// loadDevice reads the row of source's device; known is false when there
// is none.
func loadDevice(tx *sql.Tx, source, device string) (st deviceState, known bool, err error) {
	var missing string
	err = tx.QueryRow(`SELECT high, missing, gaps, lost, resets FROM device_seqs WHERE source = ? AND device = ?`, source, device).
		Scan(&st.high, &missing, &st.gaps, &st.lost, &st.resets)
	if errors.Is(err, sql.ErrNoRows) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("read the seq of device %q: %w", device, err)
	}
	if err := json.Unmarshal([]byte(missing), &st.missing); err != nil {
		return st, false, fmt.Errorf("read the seq of device %q: missing ranges: %w", device, err)
	}
	return st, true, nil
}

// store writes the row of source's device.
func (st *deviceState) store(tx *sql.Tx, source, device string, now int64) error {
	missing, err := json.Marshal(st.missing)
	if err != nil {
		return fmt.Errorf("store the seq of device %q: %w", device, err)
	}
	if st.missing == nil {
		missing = []byte("[]")
	}
	_, err = tx.Exec(`INSERT INTO device_seqs(source, device, high, missing, gaps, lost, resets, updated_at) VALUES (?,?,?,?,?,?,?,?)
		ON CONFLICT(source, device) DO UPDATE SET high = excluded.high, missing = excluded.missing, gaps = excluded.gaps,
			lost = excluded.lost, resets = excluded.resets, updated_at = excluded.updated_at`,
		source, device, st.high, string(missing), st.gaps, st.lost, st.resets, now)
	if err != nil {
		return fmt.Errorf("store the seq of device %q: %w", device, err)
	}
	return nil
}

// DeviceSeqs sums up the seq tracking of a source's devices: how many are
// tracked and, of those with a gap, a reset or a range still missing (up
// to limit of them, the most recently updated first), each one's state.
type DeviceSeqs struct {
	Devices int64 `json:"devices"`
	// Gaps, Lost and Resets are the sums over every device of the source.
	Gaps   int64 `json:"gaps"`
	Lost   int64 `json:"lost"`
	Resets int64 `json:"resets"`
	// Notable lists devices with gaps, resets or missing seqs not yet
	// reported (within the grace).
	Notable []DeviceSeq `json:"notable,omitempty"`
}

// DeviceSeq is the seq state of one device.
type DeviceSeq struct {
	Device string `json:"device"`
	// LastSeq is the highest seq stored.
	LastSeq int64 `json:"last_seq"`
	// Gaps counts the ranges reported lost and Lost the seqs in them;
	// Resets the times the seq went back.
	Gaps   int64 `json:"gaps"`
	Lost   int64 `json:"lost"`
	Resets int64 `json:"resets"`
	// Missing are the ranges below LastSeq not stored yet, [from, to]
	// inclusive, that are reported lost if they stay missing past the
	// source's seq_gap_grace (the numbers below a device's first seq
	// are not counted).
	Missing   [][2]int64 `json:"missing,omitempty"`
	UpdatedAt time.Time  `json:"updated_at"`
}

// DeviceSeqs returns the seq tracking of source's devices; see DeviceSeqs.
func (q *Queue) DeviceSeqs(ctx context.Context, source string, limit int) (DeviceSeqs, error) {
	var s DeviceSeqs
	err := q.rdb.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(gaps), 0), coalesce(sum(lost), 0), coalesce(sum(resets), 0)
		FROM device_seqs WHERE source = ?`, source).Scan(&s.Devices, &s.Gaps, &s.Lost, &s.Resets)
	if err != nil {
		return s, fmt.Errorf("device seqs of %q: %w", source, err)
	}
	rows, err := q.rdb.QueryContext(ctx, `SELECT device, high, missing, gaps, lost, resets, updated_at FROM device_seqs
		WHERE source = ? AND (gaps > 0 OR resets > 0 OR missing <> '[]') ORDER BY updated_at DESC`, source)
	if err != nil {
		return s, fmt.Errorf("device seqs of %q: %w", source, err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() && len(s.Notable) < limit {
		var d DeviceSeq
		var missing string
		var at int64
		if err := rows.Scan(&d.Device, &d.LastSeq, &missing, &d.Gaps, &d.Lost, &d.Resets, &at); err != nil {
			return s, fmt.Errorf("device seqs of %q: %w", source, err)
		}
		var ranges []missingRange
		if err := json.Unmarshal([]byte(missing), &ranges); err != nil {
			return s, fmt.Errorf("device seqs of %q: device %q: missing ranges: %w", source, d.Device, err)
		}
		for _, r := range ranges {
			if !r.Quiet {
				d.Missing = append(d.Missing, [2]int64{r.From, r.To})
			}
		}
		if d.Gaps == 0 && d.Resets == 0 && len(d.Missing) == 0 {
			continue // only the quiet range below its first seq
		}
		d.UpdatedAt = time.Unix(0, at).UTC()
		s.Notable = append(s.Notable, d)
	}
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("device seqs of %q: %w", source, err)
	}
	return s, nil
}

// ForgetDevices deletes the rows of source's devices that stored nothing
// since before: a device silent that long is taken as gone, so that a
// fleet whose devices come and go keeps rows for the live ones only. One
// that comes back starts again as a new device (the numbers below its
// next seq are a quiet range, never reported). It returns how many it
// forgot, and how many seqs they still missed and never reported (the
// device sent nothing after the grace that would have reported them).
func (q *Queue) ForgetDevices(ctx context.Context, source string, before time.Time) (devices, unreported int64, err error) {
	r := &request{apply: func(tx *sql.Tx) error {
		devices, unreported = 0, 0
		err := tx.QueryRow(`SELECT count(*), coalesce(sum((SELECT coalesce(sum(json_extract(m.value, '$[1]') - json_extract(m.value, '$[0]') + 1), 0)
			FROM json_each(d.missing) m WHERE json_extract(m.value, '$[3]') = 0)), 0)
			FROM device_seqs d WHERE d.source = ?1 AND d.updated_at < ?2`, source, before.UnixNano()).Scan(&devices, &unreported)
		if err != nil || devices == 0 {
			return err
		}
		_, err = tx.Exec(`DELETE FROM device_seqs WHERE source = ?1 AND updated_at < ?2`, source, before.UnixNano())
		return err
	}}
	if err := q.submit(ctx, r, nil); err != nil {
		return 0, 0, fmt.Errorf("forget devices of %q: %w", source, err)
	}
	return devices, unreported, nil
}
