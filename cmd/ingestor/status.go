package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ingestorhq/ingestor/actors"
	"github.com/ingestorhq/ingestor/internal/daemon"
)

// cmdStatus prints the running daemon's GET /status: a table, coloured on
// a terminal, or with -o json the daemon's JSON as it is.
func cmdStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	paths := configFlag(fs, "config: the daemon is reached at its daemon.http_addr")
	addr := fs.String("addr", "", "the daemon's ops address HOST:PORT (instead of -c)")
	output := fs.String("o", "table", "output: table or json")
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ingestor status: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "ingestor status: -o %q: want table or json\n", *output)
		return 2
	}
	target, where := *addr, "-addr"
	if target == "" {
		cfg, err := loadConfig(*paths)
		if err != nil {
			printConfigError(stderr, err)
			return 1
		}
		target, where = cfg.Daemon.HTTPAddr, "daemon.http_addr of "+cmp.Or(cfg.Name(), "the default config")
	}
	url := adminURL(target) + "/status"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := fetchStatus(ctx, url)
	if err != nil {
		fmt.Fprintf(stderr, "ingestor status: cannot read the daemon's status at %s (%s): %v\n", url, where, err)
		return 1
	}
	if *output == "json" {
		var out bytes.Buffer
		if err := json.Indent(&out, body, "", "  "); err != nil {
			fmt.Fprintf(stderr, "ingestor status: %s: %v\n", url, err)
			return 1
		}
		out.WriteByte('\n')
		if _, err := stdout.Write(out.Bytes()); err != nil {
			fmt.Fprintf(stderr, "ingestor status: %v\n", err)
			return 1
		}
		return 0
	}
	var st daemon.Status
	if err := json.Unmarshal(body, &st); err != nil {
		fmt.Fprintf(stderr, "ingestor status: %s: decode: %v\n", url, err)
		return 1
	}
	printStatus(stdout, st, isTerminal(stdout))
	return 0
}

// fetchStatus reads url, the daemon's GET /status.
func fetchStatus(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("is the daemon running? %w", err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("answered %s: %s", resp.Status, bytes.TrimSpace(body[:min(len(body), 200)]))
	}
	return body, nil
}

// isTerminal reports whether w is a terminal that takes colours: not a
// pipe or a file, and NO_COLOR unset.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("NO_COLOR") != "" || os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// ANSI colours of the states.
const (
	ansiReset  = "\x1b[0m"
	ansiRed    = "\x1b[31m"
	ansiGreen  = "\x1b[32m"
	ansiYellow = "\x1b[33m"
	ansiBlue   = "\x1b[34m"
	ansiDim    = "\x1b[2m"
)

func stateColour(state string) string {
	switch state {
	case actors.StatePolling, actors.StateReceiving:
		return ansiGreen
	case actors.StateWaiting:
		return ansiBlue
	case actors.StateFailing:
		return ansiRed
	case actors.StateStopped, actors.StateIdle:
		return ansiDim
	}
	return ""
}

// printStatus prints st: the pipeline's totals, a table of the sources
// and, under it, what the upstreams said and the last errors.
func printStatus(w io.Writer, st daemon.Status, colour bool) {
	pt := painter(colour)
	printStatusHead(w, st, pt)
	header := []string{"SOURCE", "KIND", "STATE", "WHY", "LAST POLL", "LAST SUCCESS", "LAG", "CURSOR", "REC/MIN", "BYTES/MIN", "PENDING", "DLQ", "RESTARTS"}
	rows := [][]string{header}
	colours := []string{""}
	var notes []string
	for _, s := range st.Sources {
		row, c := sourceRow(s, st.Time)
		rows, colours = append(rows, row), append(colours, c)
		notes = append(notes, sourceNotes(s, st.Time, pt)...)
	}
	printStatusTable(w, rows, colours, pt)
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
}

// painter colours text with ANSI codes when it is true.
type painter bool

// paint returns s in colour c, or s as it is.
func (p painter) paint(c, s string) string {
	if !p || c == "" {
		return s
	}
	return c + s + ansiReset
}

// printStatusHead prints the status's first lines: the daemon, its
// config, the queue and the processors.
func printStatusHead(w io.Writer, st daemon.Status, pt painter) {
	p := st.Pipeline
	draining := ""
	if p.Draining {
		draining = pt.paint(ansiYellow, ", draining")
	}
	fmt.Fprintf(w, "ingestor %s, %s%s\n", st.Version, st.Time.Local().Format(time.RFC3339), draining)
	if c := st.Config; c.File != "" {
		line := fmt.Sprintf("config: %s, applied %s", c.File, ago(c.LastReloadSuccessAt, st.Time))
		if !c.LastReloadSuccessful && c.LastReloadAt != nil {
			line = pt.paint(ansiRed, fmt.Sprintf("config: %s: the last reload (%s) was REFUSED; running the config applied %s:\n  %s",
				c.File, ago(*c.LastReloadAt, st.Time), ago(c.LastReloadSuccessAt, st.Time),
				strings.ReplaceAll(c.LastReloadError, "\n", "\n  ")))
		}
		fmt.Fprintln(w, line)
	}
	oldest := "none"
	if p.OldestPendingAgeSeconds > 0 {
		oldest = since(p.OldestPendingAgeSeconds)
	}
	lastAck := "never"
	if p.LastAck != nil {
		lastAck = ago(*p.LastAck, st.Time)
	}
	raw := pt.paint(ansiGreen, "up")
	if !p.RawStoreUp {
		raw = pt.paint(ansiRed, "DOWN")
	}
	pending := fmt.Sprintf("%d/%d", p.PendingEvents, p.MaxPendingEvents)
	if p.PendingEvents >= p.MaxPendingEvents {
		pending = pt.paint(ansiRed, pending+" (full)")
	}
	fmt.Fprintf(w, "queue: %s pending events, %d frames, %d in flight, oldest %s, %.1f acks/s, %d dead letters\n",
		pending, p.PendingFrames, p.InflightFrames, oldest, p.AcksPerSecond, p.DeadLetters)
	fmt.Fprintf(w, "processors: %d connected, last ack %s; raw store %s\n\n", p.ProcessorsConnected, lastAck, raw)
}

// sourceRow returns a source's row of the table and the colour of its
// name and state.
func sourceRow(s daemon.SourceStatus, now time.Time) ([]string, string) {
	name, c := s.Name, stateColour(s.State)
	if s.Late {
		name += " (late)"
		c = ansiYellow
	}
	why := s.Reason
	if s.Until != nil {
		why = strings.TrimSpace(why + " " + ago(*s.Until, now))
	}
	lastPoll, lag := "-", "-"
	switch {
	case s.LastPoll != nil:
		lastPoll = ago(*s.LastPoll, now)
	case s.LastRequest != nil: // a push source
		lastPoll = ago(*s.LastRequest, now)
	}
	lastSuccess := "never"
	if s.LastSuccess != nil {
		lastSuccess = ago(*s.LastSuccess, now)
	}
	if s.LagSeconds != nil {
		lag = since(*s.LagSeconds)
	}
	return []string{name, s.Kind, s.State, cmp.Or(why, "-"), lastPoll, lastSuccess, lag, clipCell(cmp.Or(s.Cursor, "-"), 24),
		strconv.FormatInt(s.RecordsLastMinute, 10), strconv.FormatInt(s.BytesLastMinute, 10),
		strconv.FormatInt(s.PendingEvents, 10), strconv.FormatInt(s.DeadLetters, 10), strconv.Itoa(s.Restarts)}, c
}

// sourceNotes returns the lines printed under the table about a source:
// its detail, its last error, its devices' gaps, its last panic.
func sourceNotes(s daemon.SourceStatus, now time.Time, pt painter) []string {
	var notes []string
	if s.Detail != "" {
		notes = append(notes, fmt.Sprintf("%s: %s", s.Name, s.Detail))
	}
	if s.LastError != "" && s.LastErrorAt != nil {
		note := fmt.Sprintf("%s: last error %s: %s", s.Name, ago(*s.LastErrorAt, now), s.LastError)
		if s.State == actors.StateFailing {
			note = pt.paint(ansiRed, note)
		}
		notes = append(notes, note)
	}
	if d := s.Devices; d != nil && (d.Gaps > 0 || d.Resets > 0 || len(d.Notable) > 0) {
		note := fmt.Sprintf("%s: %d devices, %d seq gaps (%d events lost before the daemon), %d resets", s.Name, d.Devices, d.Gaps, d.Lost, d.Resets)
		for _, dev := range d.Notable {
			note += fmt.Sprintf("; %s at seq %d", dev.Device, dev.LastSeq)
			if dev.Gaps > 0 {
				note += fmt.Sprintf(", %d gaps", dev.Gaps)
			}
			if len(dev.Missing) > 0 {
				note += fmt.Sprintf(", missing %v", dev.Missing)
			}
		}
		if d.Gaps > 0 {
			note = pt.paint(ansiYellow, note)
		}
		notes = append(notes, note)
	}
	if s.LastPanic != "" && s.LastPanicAt != nil {
		notes = append(notes, pt.paint(ansiRed, fmt.Sprintf("%s: last panic %s: %s", s.Name, ago(*s.LastPanicAt, now), s.LastPanic)))
	}
	return notes
}

// printStatusTable prints rows in columns, the numbers (from REC/MIN on)
// aligned right, each source's name and state in its colour.
func printStatusTable(w io.Writer, rows [][]string, colours []string, pt painter) {
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, cell := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	numeric := func(i int) bool { return i >= 8 }
	for n, r := range rows {
		var line strings.Builder
		for i, cell := range r {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			if numeric(i) && n > 0 {
				cell = pad + cell
			} else {
				cell += pad
			}
			if (i == 0 || i == 2) && n > 0 {
				cell = pt.paint(colours[n], cell)
			}
			line.WriteString(cell)
			if i < len(r)-1 {
				line.WriteString("  ")
			}
		}
		fmt.Fprintln(w, strings.TrimRight(line.String(), " "))
	}
}

// clipCell cuts s to n runes.
func clipCell(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-3]) + "..."
}

// ago says when t was (or will be) seen from now: "4s ago", "in 5m".
func ago(t, now time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		return "in " + since(-d.Seconds())
	}
	return since(d.Seconds()) + " ago"
}

// since renders secs seconds in the largest unit that keeps them short.
func since(secs float64) string {
	d := time.Duration(secs * float64(time.Second))
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < 2*time.Minute:
		return d.Round(time.Second).String()
	case d < 2*time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h"
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d"
}
