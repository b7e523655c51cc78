package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/internal/sqliteuri"
)

// soakSample is one sample of the soak: sizes in bytes, RSS in bytes.
type soakSample struct {
	At               time.Duration `json:"at_ns"`
	RawBytes         int64         `json:"raw_bytes"`
	QueueBytes       int64         `json:"queue_bytes"`
	ProcessorDBBytes int64         `json:"processor_db_bytes"`
	ProcessorWAL     int64         `json:"processor_wal_bytes"`
	// DaemonRSS and ProcessorRSS are the peak RSS since the last sample.
	DaemonRSS    int64 `json:"daemon_peak_rss_bytes"`
	ProcessorRSS int64 `json:"processor_peak_rss_bytes"`
	DaemonFDs    int64 `json:"daemon_fds"`
	ProcessorFDs int64 `json:"processor_fds"`
	Goroutines   int64 `json:"daemon_goroutines"`
	// Events is the daemon's events committed so far (not checked).
	Events int64 `json:"events"`
	// DeviceRows is the devices whose seqs the queue tracks (rows of
	// device_seqs), checked against the load's devices (soakResult.check).
	DeviceRows int64 `json:"device_rows"`
}

// soakSeries are the series: name, unit, the value of a sample in that
// unit, and whether the flatness check applies. The processor database's
// WAL is drawn and printed but not checked: SQLite keeps a WAL file at the
// largest size it reached (a checkpoint that cannot finish while a
// transaction reads lets it grow past its 4 MiB checkpoint mark), so it
// steps up at random moments, bounded, and a few MiB of that decide
// nothing at this scale. The database file itself is checked: a key
// table without retention grows it.
var soakSeries = []struct {
	name, unit string
	value      func(s soakSample) float64
	unchecked  bool
}{
	{"raw store", "MiB", func(s soakSample) float64 { return mib(s.RawBytes) }, false},
	{"queue.db+wal", "MiB", func(s soakSample) float64 { return mib(s.QueueBytes) }, false},
	{"processor db", "MiB", func(s soakSample) float64 { return mib(s.ProcessorDBBytes) }, false},
	{"processor db wal", "MiB", func(s soakSample) float64 { return mib(s.ProcessorWAL) }, true},
	{"daemon peak RSS", "MiB", func(s soakSample) float64 { return mib(s.DaemonRSS) }, false},
	{"processor peak RSS", "MiB", func(s soakSample) float64 { return mib(s.ProcessorRSS) }, false},
	{"daemon fds", "", func(s soakSample) float64 { return float64(s.DaemonFDs) }, false},
	{"processor fds", "", func(s soakSample) float64 { return float64(s.ProcessorFDs) }, false},
	{"goroutines", "", func(s soakSample) float64 { return float64(s.Goroutines) }, false},
	// A few dozen rows move by whole devices: a ratio of such small
	// numbers decides nothing, so check bounds them per device instead.
	{"device rows", "", func(s soakSample) float64 { return float64(s.DeviceRows) }, true},
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// sample takes one sample and prints it as a line of progress.
func (r *soakRun) sample(ctx context.Context, at time.Duration, progress io.Writer) error {
	data := filepath.Join(r.dir, "data")
	s := soakSample{At: at}
	var err error
	if s.RawBytes, err = dirBytes(filepath.Join(data, "raw")); err != nil {
		return err
	}
	if s.QueueBytes, err = filesBytes(walFiles(filepath.Join(data, "queue.db"))...); err != nil {
		return err
	}
	if s.ProcessorDBBytes, err = filesBytes(r.procDB); err != nil {
		return err
	}
	if s.ProcessorWAL, err = filesBytes(r.procDB+"-wal", r.procDB+"-shm"); err != nil {
		return err
	}
	dpid, ppid := r.daemon.cmd.Process.Pid, r.procs.cmd.Process.Pid
	if s.DaemonRSS, err = procPeakRSSSince(dpid); err != nil {
		return err
	}
	if s.ProcessorRSS, err = procPeakRSSSince(ppid); err != nil {
		return err
	}
	if s.DaemonFDs, err = procFDs(dpid); err != nil {
		return err
	}
	if s.ProcessorFDs, err = procFDs(ppid); err != nil {
		return err
	}
	m, err := scrapeMetrics(ctx, r.metrics)
	if err != nil {
		return err
	}
	s.Goroutines, s.Events = int64(m.goroutines), int64(m.events)
	if s.DeviceRows, err = countRows(filepath.Join(data, "queue.db"), "device_seqs"); err != nil {
		return err
	}
	r.samples = append(r.samples, s)
	_, err = fmt.Fprintf(progress, "soak %6s: events %9d  raw %7.1f MiB  queue %6.1f MiB  processor db %6.1f + %4.1f MiB  peak RSS %6.1f / %6.1f MiB  fds %3d / %3d  goroutines %4d\n",
		at.Round(time.Second), s.Events, mib(s.RawBytes), mib(s.QueueBytes), mib(s.ProcessorDBBytes), mib(s.ProcessorWAL),
		mib(s.DaemonRSS), mib(s.ProcessorRSS), s.DaemonFDs, s.ProcessorFDs, s.Goroutines)
	return err
}

// countRows counts the rows of table in the SQLite database at path,
// opened read-only beside the daemon that writes it.
func countRows(path, table string) (int64, error) {
	dsn, err := sqliteuri.File(path, "mode=ro&_busy_timeout=5000")
	if err != nil {
		return 0, err
	}
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return 0, err
	}
	defer func() { _ = db.Close() }()
	var n int64
	if err := db.QueryRow(`SELECT count(*) FROM ` + table).Scan(&n); err != nil {
		return 0, fmt.Errorf("count %s in %s: %w", table, path, err)
	}
	return n, nil
}

// walFiles returns a SQLite database's file and its -wal and -shm.
func walFiles(db string) []string { return []string{db, db + "-wal", db + "-shm"} }

// procPeakRSSSince returns the peak resident set size of process pid since
// the last call (VmHWM, in bytes), and resets the peak to the current RSS
// (writing 5 to /proc/PID/clear_refs), so that a sample holds the highest
// RSS of its interval: a burst's peak is never missed between samples.
func procPeakRSSSince(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("RSS of process %d: %w", pid, err)
	}
	var peak int64 = -1
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			kib, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte(" kB"))), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("RSS of process %d: VmHWM %q: %w", pid, rest, err)
			}
			peak = kib << 10
		}
	}
	if peak < 0 {
		return 0, fmt.Errorf("RSS of process %d: no VmHWM in /proc/%d/status", pid, pid)
	}
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return 0, fmt.Errorf("reset the peak RSS of process %d: %w", pid, err)
	}
	return peak, nil
}

// procFDs returns the number of open file descriptors of process pid.
func procFDs(pid int) (int64, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, fmt.Errorf("open files of process %d: %w", pid, err)
	}
	return int64(len(fds)), nil
}

// soakResult is what -mode soak reports.
type soakResult struct {
	Samples []soakSample  `json:"samples"`
	Warmup  time.Duration `json:"warmup_ns"`
	Limit   float64       `json:"flat_limit"`
	KeepRaw bool          `json:"keep_raw"`
	// Sent is the events offered per source and stored (push sources:
	// answered stored; polled and streamed: released by the upstream).
	Sent map[string]int64 `json:"sent"`
	// Applied is what the exactly-once processor applied per source.
	Applied           map[string]int64 `json:"applied"`
	Refusals          int64            `json:"refusals"`
	DLQDrops          int              `json:"dlq_drops"`
	StreamConnections int64            `json:"stream_connections"`
	Flatness          []flatness       `json:"flatness"`
	// Late lists the sources /status reported late at the end, Restarts
	// counts their actors' restarts.
	Late     []string `json:"late"`
	Restarts int64    `json:"restarts"`
	// Devices is the load's devices, each taking a new id now and then:
	// after the warm-up the queue may track at most maxIDsPerDevice ids
	// of each (device_retention forgets the ones left).
	Devices int `json:"devices"`
}

// maxIDsPerDevice bounds the device ids tracked per soak device: the one
// in use and the one before it, within device_retention of its last
// envelope, and one more for a sweep that has not come yet.
const maxIDsPerDevice = 3

// total returns the events sent in all.
func (r *soakResult) total() int64 {
	var n int64
	for _, v := range r.Sent {
		n += v
	}
	return n
}

// flatness is one series' check.
type flatness struct {
	Series    string  `json:"series"`
	Unit      string  `json:"unit"`
	FirstMax  float64 `json:"first_third_max"`
	LastMax   float64 `json:"last_third_max"`
	Ratio     float64 `json:"ratio"`
	Flat      bool    `json:"flat"`
	Checked   bool    `json:"checked"`
	WarmupMax float64 `json:"warmup_max"`
}

// check computes the flatness of every series and returns an error naming
// each series that grew and each source whose count is off.
func (r *soakResult) check() error {
	var measured, warm []soakSample
	for _, s := range r.Samples {
		if s.At >= r.Warmup {
			measured = append(measured, s)
		} else {
			warm = append(warm, s)
		}
	}
	third := len(measured) / 3
	if third < 2 {
		return fmt.Errorf("%d samples after the warm-up: too few for thirds of at least 2", len(measured))
	}
	var problems []string
	r.Flatness = nil
	for _, series := range soakSeries {
		f := flatness{Series: series.name, Unit: series.unit,
			FirstMax: maxOf(measured[:third], series.value), LastMax: maxOf(measured[len(measured)-third:], series.value),
			WarmupMax: maxOf(warm, series.value)}
		// The reference is the highest value before the last third, the
		// warm-up's included: a peak series holds one burst per third, and
		// a burst's peak moves with the garbage collector's timing (226 to
		// 286 MiB for the same burst in one run), so a first-third burst
		// that happened to peak low must not make the last one look like
		// growth. A leak still shows: it grows past everything before.
		ref := max(f.FirstMax, f.WarmupMax)
		f.Ratio = round(f.LastMax/max(ref, 1e-9), 2)
		f.Flat = f.LastMax <= r.Limit*ref
		f.Checked = !series.unchecked
		if f.Checked && !f.Flat {
			problems = append(problems, fmt.Sprintf("%s grew: %.1f%s in the last third, %.2fx the highest before it, %.1f%s (limit %.2fx)",
				series.name, f.LastMax, series.unit, f.Ratio, ref, series.unit, r.Limit))
		}
		r.Flatness = append(r.Flatness, f)
	}
	deviceRows := maxOf(measured, func(s soakSample) float64 { return float64(s.DeviceRows) })
	if most := maxIDsPerDevice * r.Devices; r.Devices > 0 && deviceRows > float64(most) {
		problems = append(problems, fmt.Sprintf("device rows grew: %.0f device ids tracked after the warm-up, more than %d for %d devices",
			deviceRows, most, r.Devices))
	}
	for _, src := range slices.Sorted(maps.Keys(r.Sent)) {
		if r.Applied[src] != r.Sent[src] {
			problems = append(problems, fmt.Sprintf("source %s: %d events sent, the processor applied %d", src, r.Sent[src], r.Applied[src]))
		}
	}
	for src, n := range r.Applied {
		if _, ok := r.Sent[src]; !ok && n != 0 {
			problems = append(problems, fmt.Sprintf("source %s: nothing sent, the processor applied %d", src, n))
		}
	}
	if len(r.Late) > 0 || r.Restarts > 0 {
		problems = append(problems, fmt.Sprintf("sources late at the end: %v; actor restarts: %d", r.Late, r.Restarts))
	}
	if len(problems) > 0 {
		return fmt.Errorf("soak check failed:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

func maxOf(samples []soakSample, value func(soakSample) float64) float64 {
	m := 0.0
	for _, s := range samples {
		m = max(m, value(s))
	}
	return m
}

// printSoak prints the flatness table and the counts.
func printSoak(w io.Writer, r *soakResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "ingestor-bench -mode soak: %d samples, warm-up %v, flat when the last third's max <= %.2fx the highest before it (warm-up and first third)\n",
		len(r.Samples), r.Warmup, r.Limit)
	b.WriteString("| series | warm-up max | first third max | last third max | ratio | flat |\n|---|---|---|---|---|---|\n")
	for _, f := range r.Flatness {
		flat := fmt.Sprint(f.Flat)
		if !f.Checked {
			flat += " (not checked)"
		}
		fmt.Fprintf(&b, "| %s | %.1f %s | %.1f %s | %.1f %s | %.2f | %s |\n", f.Series, f.WarmupMax, f.Unit, f.FirstMax, f.Unit, f.LastMax, f.Unit, f.Ratio, flat)
	}
	b.WriteString("| source | sent | applied once |\n|---|---|---|\n")
	for _, src := range slices.Sorted(maps.Keys(r.Sent)) {
		fmt.Fprintf(&b, "| %s | %d | %d |\n", src, r.Sent[src], r.Applied[src])
	}
	fmt.Fprintf(&b, "push refusals resent: %d; dlq drops: %d; WebSocket feed connections: %d; sources late: %d; actor restarts: %d\n",
		r.Refusals, r.DLQDrops, r.StreamConnections, len(r.Late), r.Restarts)
	_, err := io.WriteString(w, b.String())
	return err
}
