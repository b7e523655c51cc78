package checksource

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers the sqlite3 driver

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/sqliteuri"
	"github.com/ingestorhq/ingestor/sources"
)

// Options tune a check.
type Options struct {
	// Cursor is the cursor to poll with when HasCursor is set (the -cursor
	// flag); otherwise the source's durable cursor is read from the queue.
	Cursor    string
	HasCursor bool
	// MaxPages bounds how many pages are fetched while the source reports
	// More. Default 10.
	MaxPages int
	// Verbose lists every record instead of the first ShownRecords.
	Verbose bool
}

// ShownRecords is how many records of a page are listed without Verbose.
const ShownRecords = 20

// sampleBytes caps the sample payload shown.
const sampleBytes = 200

// Result is what a check found.
type Result struct {
	// Pages counts the fetches made; Requests the upstream requests traced.
	Pages, Requests int
	// Records counts the records extracted over every page.
	Records int
	// Cursor is the cursor the daemon would store after the last page
	// (the starting cursor when no page moved it).
	Cursor string
	// More reports that the last page said more data is waiting.
	More bool
}

// Run polls the source name of cfg once (and its further pages) and
// prints to out what happened. It returns an error, already printed with
// a hint, when the poll failed; a poll that found nothing is a success.
func Run(ctx context.Context, cfg *config.Config, name string, out io.Writer, o Options) (Result, error) {
	var res Result
	if o.MaxPages <= 0 {
		o.MaxPages = 10
	}
	sc, err := cfg.Source(name)
	if err != nil {
		return res, err
	}
	p := &printer{w: out}
	state := "enabled"
	if !sc.Enabled {
		state = "disabled"
	}
	p.printf("source %q: kind %s, %s, timeout %s\n", sc.Name, sc.Kind, state, sc.Timeout)
	if !sc.Enabled && hasUnexpanded(sc.Spec) {
		p.printf("warning: ${ENV} references are not expanded for a disabled source: the values are used as written\n")
	}

	cursor, from, err := startCursor(ctx, cfg, sc.Name, o)
	if err != nil {
		p.printf("problem: %v\n", err)
		return res, err
	}
	p.printf("cursor: %q (%s)\n", cursor, from)
	res.Cursor = cursor

	// The source's own logs are the daemon's: the report is the trace
	// and the problems, so they are discarded.
	env := sources.Env{
		Name: sc.Name, Timeout: sc.Timeout, Logger: slog.New(slog.DiscardHandler), Limiters: cfg.Limiters(),
		Trace: p.trace,
	}
	src, err := sc.Spec.Open(env)
	if err != nil {
		p.printf("problem: %v\n", err)
		return res, err
	}
	defer func() {
		if cerr := src.Close(); cerr != nil {
			p.printf("close source: %v\n", cerr)
		}
	}()

	if err := p.fetchPages(ctx, src, sc, cursor, o, &res); err != nil {
		return res, err
	}
	res.Requests, _ = p.traced()
	p.printf("\nok: %d page(s), %d request(s), %d record(s), next cursor %q\n", res.Pages, res.Requests, res.Records, res.Cursor)
	return res, p.writeErr()
}

// fetchPages fetches pages from src, from cursor, until one says there is
// no more or -max-pages is reached, printing each and counting them in
// res. It returns the first failure (the request that failed is printed).
func (p *printer) fetchPages(ctx context.Context, src sources.Source, sc config.Source, cursor string, o Options, res *Result) error {
	for page := 1; ; page++ {
		p.printf("\npage %d (cursor %q)\n", page, cursor)
		fctx, cancel := context.WithTimeout(ctx, sc.Timeout)
		b, err := src.Fetch(fctx, cursor)
		cancel()
		res.Pages++
		if err != nil {
			requests, status := p.traced()
			res.Requests = requests
			p.problem(err, status, sc)
			return err // the source's errors name it
		}
		if b == nil {
			b = &sources.Batch{}
		}
		if ev := p.lastFailed(); ev != nil && len(b.Records) == 0 {
			// Nothing came and the last request failed: a websocket
			// handshake refused, say, which its reader retries in the
			// background while the fetch itself reports nothing.
			res.Requests, _ = p.traced()
			return p.failedRequest(ev, sc)
		}
		res.Records += b.RecordCount()
		p.records(b, o.Verbose)
		next := cursor
		if b.Cursor != "" {
			next = b.Cursor
		}
		res.Cursor, res.More = next, b.More
		p.printf("  next cursor: %q%s\n", next, unchanged(next == cursor))
		p.printf("  more: %v\n", b.More)
		if !b.More {
			return nil
		}
		if page == o.MaxPages {
			p.printf("\nstopped after %d pages (-max-pages); the daemon would go on fetching\n", page)
			return nil
		}
		cursor = next
	}
}

// startCursor returns the cursor the check starts from, and where it
// comes from: -cursor, else the durable cursor in the data dir's queue,
// else none (as on a first start).
func startCursor(ctx context.Context, cfg *config.Config, source string, o Options) (cursor, from string, err error) {
	if o.HasCursor {
		return o.Cursor, "from -cursor", nil
	}
	qpath := filepath.Join(cfg.Daemon.DataDir, "queue.db")
	cursor, ok, err := durableCursor(ctx, qpath, source)
	switch {
	case err != nil:
		return "", "", err
	case ok:
		return cursor, "durable cursor in " + qpath, nil
	case fileExists(qpath):
		return cursor, "no durable cursor in " + qpath, nil
	default:
		return cursor, "no queue at " + qpath + ": as on a first start", nil
	}
}

func unchanged(same bool) string {
	if same {
		return " (unchanged)"
	}
	return ""
}

// hasUnexpanded reports whether a spec still holds "${" in a string value
// (a field, a map key or value, a list element): the config package leaves
// ${ENV} as written in a disabled source.
func hasUnexpanded(spec sources.Spec) bool {
	return hasDollarBrace(reflect.ValueOf(spec), 0)
}

func hasDollarBrace(v reflect.Value, depth int) bool {
	if depth > 16 {
		return false
	}
	switch v.Kind() {
	case reflect.String:
		return strings.Contains(v.String(), "${")
	case reflect.Pointer, reflect.Interface:
		return !v.IsNil() && hasDollarBrace(v.Elem(), depth+1)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && hasDollarBrace(v.Field(i), depth+1) {
				return true
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if hasDollarBrace(v.Index(i), depth+1) {
				return true
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if hasDollarBrace(it.Key(), depth+1) || hasDollarBrace(it.Value(), depth+1) {
				return true
			}
		}
	}
	return false
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// durableCursor reads the cursor of source from the queue at qpath through
// a read-only connection; ok is false when there is no queue or no cursor.
// The queue is never opened with queue.Open, which migrates and writes.
func durableCursor(ctx context.Context, qpath, source string) (cursor string, ok bool, err error) {
	if _, err := os.Stat(qpath); errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	} else if err != nil {
		return "", false, fmt.Errorf("read durable cursor: %w", err)
	}
	abs, err := filepath.Abs(qpath)
	if err != nil {
		return "", false, fmt.Errorf("read durable cursor: %w", err)
	}
	// A running daemon keeps queue.db-wal (and -shm) open: a read-only
	// connection then reads through them without creating anything. With
	// no -wal, everything is in queue.db; read-only mode would create the
	// -wal and -shm files, so the file is opened as immutable instead,
	// which creates nothing and takes no lock.
	query := "mode=ro&_busy_timeout=5000"
	if !fileExists(abs + "-wal") {
		query += "&immutable=1"
	}
	dsn, err := sqliteuri.File(abs, query)
	if err != nil {
		return "", false, fmt.Errorf("read durable cursor from %s: %w", qpath, err)
	}
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return "", false, fmt.Errorf("read durable cursor from %s: %w", qpath, err)
	}
	defer func() {
		if cerr := db.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("read durable cursor from %s: %w", qpath, cerr))
		}
	}()
	err = db.QueryRowContext(ctx, `SELECT cursor FROM offsets WHERE source = ?`, source).Scan(&cursor)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read durable cursor from %s: %w", qpath, err)
	}
	return cursor, true, nil
}

// printer writes the report; Trace may be called from a source's own
// goroutine, so writes are serialized.
type printer struct {
	mu sync.Mutex
	w  io.Writer
	// requests counts the requests traced; status is the last one's, and
	// failed the last one when it failed.
	requests, status int
	failed           *sources.TraceEvent
	err              error // the first write error
}

// traced returns how many requests were traced and the last one's status.
func (p *printer) traced() (requests, status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests, p.status
}

// lastFailed returns the last request traced if it failed, else nil.
func (p *printer) lastFailed() *sources.TraceEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

func (p *printer) printf(format string, args ...any) {
	p.write(fmt.Sprintf(format, args...))
}

// write writes s, keeping the first write error for Run to return.
func (p *printer) write(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := io.WriteString(p.w, s); err != nil && p.err == nil {
		p.err = fmt.Errorf("write report: %w", err)
	}
}

// writeErr returns the first write error.
func (p *printer) writeErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// trace prints one upstream request:
//
//	GET https://api.example.com/events -> 200 in 35ms, 1234 bytes (note)
func (p *printer) trace(ev sources.TraceEvent) {
	var b strings.Builder
	fmt.Fprintf(&b, "  %s %s -> ", ev.Method, ev.URL)
	if ev.Status != 0 {
		fmt.Fprintf(&b, "%d", ev.Status)
	} else {
		b.WriteString("no response")
	}
	fmt.Fprintf(&b, " in %s, %d bytes", ev.Duration.Round(time.Millisecond), ev.Bytes)
	if ev.Note != "" {
		fmt.Fprintf(&b, " (%s)", ev.Note)
	}
	// A request that ends the fetch has its error on the problem line
	// that follows; one with a note (a websocket's "connection lost", say)
	// may not, so its error is shown here.
	if ev.Err != nil && ev.Note != "" {
		fmt.Fprintf(&b, ": %v", ev.Err)
	}
	b.WriteByte('\n')
	p.mu.Lock()
	p.requests++
	p.status = ev.Status
	p.failed = nil
	if ev.Err != nil {
		p.failed = &ev
	}
	p.mu.Unlock()
	p.write(b.String())
}

// records prints a page's records: key, cursor value and time, the first
// ShownRecords unless verbose, and one sample payload. Verbose, it reads
// the rest of a page kept in slices (Batch.Rest) too.
func (p *printer) records(b *sources.Batch, verbose bool) {
	total := b.RecordCount()
	p.printf("  %d record(s), %d bytes\n", total, len(b.Body))
	shown := 0
	show := func(recs []sources.Record) {
		for _, r := range recs {
			if !verbose && shown == ShownRecords {
				return
			}
			ts := "-"
			if !r.Time.IsZero() {
				ts = r.Time.UTC().Format(time.RFC3339Nano)
			}
			cur := r.Cursor
			if cur == "" {
				cur = "-"
			}
			p.printf("    id=%s cursor=%s time=%s\n", r.Key, cur, ts)
			shown++
		}
	}
	show(b.Records)
	for verbose && b.Rest != nil && b.Rest.Left() > 0 {
		recs, err := b.Rest.Next(sources.SliceRecords)
		if err != nil {
			p.printf("    %v\n", err)
			break
		}
		show(recs)
	}
	if more := total - shown; more > 0 {
		p.printf("    ... and %d more (-v lists them all)\n", more)
	}
	if len(b.Records) > 0 {
		r := b.Records[0]
		if r.Off >= 0 && r.Len >= 0 && r.Off+r.Len <= len(b.Body) {
			p.printf("  sample payload (id=%s): %s\n", r.Key, truncate(b.Body[r.Off:r.Off+r.Len]))
		}
	}
}

// truncate returns the first sampleBytes of b, saying how much was cut.
func truncate(b []byte) string {
	if len(b) <= sampleBytes {
		return string(b)
	}
	return fmt.Sprintf("%s... (%d bytes)", b[:sampleBytes], len(b))
}

// problem prints a failed fetch with what it means and what to check.
func (p *printer) problem(err error, status int, sc config.Source) {
	p.printf("  problem: %v\n", err)
	var (
		wait *sources.WaitError
		perm *sources.PermanentError
	)
	switch m, malformed := sources.AsMalformed(err); {
	case malformed:
		p.printf("  payload (%d bytes): %s\n", len(m.Body), truncate(m.Body))
		p.printf("  hint: the upstream answered, but not with what kind %s reads; the daemon would keep the payload under deadletter/%s/ and go on polling\n", sc.Kind, sc.Name)
	case errors.As(err, &wait):
		p.printf("  hint: the upstream asks to wait until %s (rate limited or unavailable); the daemon would not poll before then\n", wait.Until.UTC().Format(time.RFC3339))
	case errors.As(err, &perm):
		p.printf("  hint: %s\n", permanentHint(status, urlKey(sc.Kind)))
	case errors.Is(err, context.DeadlineExceeded):
		p.printf("  hint: no answer within the source's timeout (%s): check that the upstream is reachable, or raise timeout\n", sc.Timeout)
	default:
		p.printf("  hint: the daemon would retry with backoff; if it persists, check the upstream's address and the network\n")
	}
}

// failedRequest prints, and returns as the check's error, a fetch that
// brought nothing because its last request failed (ev), with a hint.
func (p *printer) failedRequest(ev *sources.TraceEvent, sc config.Source) error {
	answer := "no response"
	if ev.Status != 0 {
		answer = fmt.Sprintf("status %d", ev.Status)
	}
	err := fmt.Errorf("source %q: %s %s: %s: %w", sc.Name, ev.Method, ev.URL, answer, ev.Err)
	p.printf("  problem: %v\n", err)
	if ev.Status >= 400 && ev.Status < 500 && ev.Status != 408 && ev.Status != 429 {
		p.printf("  hint: %s\n", permanentHint(ev.Status, urlKey(sc.Kind)))
	} else {
		p.printf("  hint: the daemon would retry with backoff; if it persists, check the upstream's address and the network\n")
	}
	return err
}

// urlKey is the config key of a source kind's URL.
func urlKey(kind string) string {
	if kind == "websocket" || kind == "sse" {
		return "url"
	}
	return "poll_url"
}

// permanentHint says what to check for a failure retrying will not fix;
// key is the config key of the source's URL.
func permanentHint(status int, key string) string {
	switch {
	case status == 401 || status == 403:
		return fmt.Sprintf("%d: the upstream refused the credentials: check headers and credentials", status)
	case status == 404 || status == 410:
		return fmt.Sprintf("%d: nothing at that URL: check %s", status, key)
	case status >= 400 && status < 500:
		return fmt.Sprintf("%d: check %s, headers and credentials", status, key)
	default:
		return fmt.Sprintf("a configuration problem retrying will not fix: check the source's settings (%s, headers and credentials)", key)
	}
}
