package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/durable"
	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/sources"
)

// Options select what to replay and how.
type Options struct {
	// Source is the NAME of the [source.NAME] block whose payloads are
	// replayed; the block may be disabled.
	Source string
	// From and To bound the fetch time of the payloads replayed:
	// From <= fetched < To. A zero bound is open.
	From, To time.Time
	// Force queues again the events that the queue remembers as acked or
	// dead-lettered (forced redelivery). Pending events are never queued
	// twice: they are delivered anyway.
	Force bool
	// DryRun parses and reports without taking the lock or opening the
	// queue: nothing is written.
	DryRun bool
	// DeadLetters also replays the payloads kept under deadletter/SOURCE/,
	// those that did not parse when they were fetched.
	DeadLetters bool
	// Report, when set, is called after each object.
	Report func(Object)
	// Logger receives the source's logs; nil discards them.
	Logger *slog.Logger
}

// Object is the outcome of replaying one raw object, or one page of a
// page segment.
type Object struct {
	// Key is the object's raw store key.
	Key string
	// Page is set for a page of a page segment; Off is then the offset
	// of the page's bytes in the segment.
	Page bool
	Off  int
	// FetchedAt is the original fetch time, from the key (the page's
	// record for a page).
	FetchedAt time.Time
	// Records is how many records the current parser finds.
	Records int
	// Queued is how many of them were queued; Duplicates how many were
	// already queued or remembered. Both are zero on a dry run.
	Queued, Duplicates int
	// Forgotten is how many remembered events a forced replay forgot
	// before queueing them again.
	Forgotten int64
	// Malformed is why the payload still does not parse, or why its bytes
	// cannot be trusted (a rawstore.CorruptError: "raw object corrupt:
	// ..."); the object was skipped. Empty when it parsed.
	Malformed string
}

// Summary totals a replay.
type Summary struct {
	// Objects counts the raw objects (pages, in a page segment) in range,
	// malformed ones included.
	Objects int
	// Records counts the records parsed.
	Records int
	// Queued counts the events queued; Duplicates those that were not.
	Queued, Duplicates int
	// Forgotten counts the remembered events a forced replay forgot.
	Forgotten int64
	// Malformed counts the objects that still do not parse or are corrupt.
	Malformed int
	// Ignored counts keys under the prefixes that are not raw payload keys
	// (<unix-nanos>-<hash>.json), which are left alone.
	Ignored int
}

// Run replays the raw objects of o.Source in cfg's raw store into the queue
// in cfg's data dir, parsing each with the source's current rules. A
// payload that does not parse is reported and skipped; any other failure
// (the raw store, the queue, the lock) ends the replay with an error, and
// the Summary covers what was done before it.
func Run(ctx context.Context, cfg *config.Config, o Options) (sum Summary, err error) {
	if !o.From.IsZero() && !o.To.IsZero() && !o.From.Before(o.To) {
		return sum, fmt.Errorf("replay: -from %s is not before -to %s", o.From.Format(time.RFC3339), o.To.Format(time.RFC3339))
	}
	sc, err := cfg.Source(o.Source)
	if err != nil {
		return sum, fmt.Errorf("replay: %w", err)
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	src, err := sc.Spec.Open(sources.Env{Name: sc.Name, Timeout: sc.Timeout, Logger: logger.With("source", sc.Name),
		Limiters: cfg.Limiters()})
	if err != nil {
		return sum, fmt.Errorf("replay: %w", err)
	}
	defer func() {
		if cerr := src.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("replay: close source %q: %w", sc.Name, cerr))
		}
	}()
	parser, ok := src.(sources.Parser)
	if !ok {
		return sum, fmt.Errorf("replay: source %q: kind %s cannot be replayed: it cannot parse a stored payload again", sc.Name, sc.Kind)
	}

	r := &replayer{source: sc.Name, parser: parser, opts: o}
	if !o.DryRun {
		unlock, err := lock(cfg.Daemon.DataDir)
		if err != nil {
			return sum, err
		}
		defer func() { err = errors.Join(err, unlock()) }()
	}
	if r.raw, err = rawstore.Open(ctx, rawstore.Options{URL: cfg.RawStore.URL, Endpoint: cfg.RawStore.Endpoint,
		Region: cfg.RawStore.Region, PathStyle: cfg.RawStore.PathStyle}); err != nil {
		return sum, fmt.Errorf("replay: %w", err)
	}
	if !o.DryRun {
		if r.queue, err = queue.Open(queue.Options{Path: filepath.Join(cfg.Daemon.DataDir, "queue.db"),
			Synchronous: cfg.Publish.Synchronous, EventsPerFrame: cfg.Publish.EventsPerFrame, Logger: logger}); err != nil {
			return sum, fmt.Errorf("replay: %w", err)
		}
		defer func() { err = errors.Join(err, r.queue.Close()) }()
		// The payloads are in the raw store already, and the daemon sends
		// the frames when it starts: only the commit step is replay's.
		r.ingest = ingest.New(ingest.Options{Queue: r.queue})
	}
	err = r.run(ctx, &sum)
	return sum, err
}

// lock creates the data dir if needed and takes its lock, turning "in use"
// into what the operator has to do.
func lock(dir string) (func() error, error) {
	if err := durable.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("replay: data dir: %w", err)
	}
	unlock, err := datadir.Lock(dir)
	if inUse := (*datadir.InUseError)(nil); errors.As(err, &inUse) {
		return nil, fmt.Errorf("replay: %w: stop the daemon first, replay runs with the daemon stopped "+
			"(the daemon sends what the replay queued when it starts again)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return unlock, nil
}

// replayer replays the objects of one source.
type replayer struct {
	source string
	parser sources.Parser
	raw    rawstore.Store
	queue  *queue.Queue   // nil on a dry run
	ingest *ingest.Ingest // commits over queue; nil on a dry run
	opts   Options
}

// run replays every object in range, the source's own first, then its
// dead letters.
func (r *replayer) run(ctx context.Context, sum *Summary) error {
	roots := []string{r.source + "/"}
	if r.opts.DeadLetters {
		roots = append(roots, "deadletter/"+r.source+"/")
	}
	for _, root := range roots {
		for _, prefix := range dayPrefixes(root, r.opts.From, r.opts.To) {
			err := r.raw.List(ctx, prefix, func(key string) error {
				at, ok := fetchTime(key)
				switch {
				case ok && rawstore.IsPageSegment(key):
					return r.segment(ctx, key, sum)
				case !ok:
					sum.Ignored++
					return nil
				case !r.opts.From.IsZero() && at.Before(r.opts.From), !r.opts.To.IsZero() && !at.Before(r.opts.To):
					return nil
				}
				return r.object(ctx, key, at, sum)
			})
			if err != nil {
				return fmt.Errorf("replay %s: %w", prefix, err)
			}
		}
	}
	return nil
}

// maxDayPrefixes bounds the per-day listings of a bounded range; a longer
// range lists the whole source.
const maxDayPrefixes = 400

// dayPrefixes narrows the listing of root to the day directories of
// [from, to) when both are set, since keys hold the UTC date of the fetch.
func dayPrefixes(root string, from, to time.Time) []string {
	if from.IsZero() || to.IsZero() {
		return []string{root}
	}
	var out []string
	from = from.UTC()
	for d := time.Date(from.Year(), from.Month(), from.Day(), 0, 0, 0, 0, time.UTC); d.Before(to); d = d.AddDate(0, 0, 1) {
		if len(out) == maxDayPrefixes {
			return []string{root}
		}
		out = append(out, fmt.Sprintf("%s%04d/%02d/%02d/", root, d.Year(), int(d.Month()), d.Day()))
	}
	return out
}

// fetchTime reads the fetch time from a raw payload key,
// .../<unix-nanos>-<hash>.json, or the open time from a page segment's,
// .../<unix-nanos>-pages.seg.
func fetchTime(key string) (time.Time, bool) {
	base := path.Base(key)
	nanos, rest, ok := strings.Cut(base, "-")
	if !ok || !strings.HasSuffix(rest, ".json") && !rawstore.IsPageSegment(base) {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(nanos, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, false
	}
	return time.Unix(0, n).UTC(), true
}

// segment replays the pages of a page segment fetched in range, each as
// an object. A page whose bytes no longer match their checksum is counted
// malformed and skipped; so is the rest of the segment after a record
// header that cannot be read.
func (r *replayer) segment(ctx context.Context, key string, sum *Summary) error {
	seg, err := r.raw.Get(ctx, key)
	if err != nil {
		return err
	}
	err = rawstore.ReadPages(key, seg, func(p rawstore.Page) error {
		if !r.opts.From.IsZero() && p.FetchedAt.Before(r.opts.From) || !r.opts.To.IsZero() && !p.FetchedAt.Before(r.opts.To) {
			return nil
		}
		if p.Err != nil {
			sum.Objects++
			sum.Malformed++
			r.report(Object{Key: key, Page: true, Off: p.Off, FetchedAt: p.FetchedAt, Malformed: p.Err.Error()})
			return nil
		}
		return r.payload(ctx, Object{Key: key, Page: true, Off: p.Off, FetchedAt: p.FetchedAt}, p.Body, sum)
	})
	if ce := (*rawstore.CorruptError)(nil); errors.As(err, &ce) {
		at, _ := fetchTime(key)
		sum.Objects++
		sum.Malformed++
		r.report(Object{Key: key, Page: true, Off: max(ce.Off, 0), FetchedAt: at, Malformed: ce.Error()})
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

// object replays one raw object of its own. One whose bytes no longer
// match the SHA-256 in its key is counted malformed and skipped.
func (r *replayer) object(ctx context.Context, key string, at time.Time, sum *Summary) error {
	body, err := r.raw.Get(ctx, key)
	if ce := (*rawstore.CorruptError)(nil); errors.As(err, &ce) {
		sum.Objects++
		sum.Malformed++
		r.report(Object{Key: key, FetchedAt: at, Malformed: ce.Error()})
		return nil
	}
	if err != nil {
		return err
	}
	return r.payload(ctx, Object{Key: key, FetchedAt: at}, body, sum)
}

// payload replays one fetched payload, body, at res.Off in res.Key's
// object: parse, then commit its events through ingest as one batch
// fetched at the original time, with no cursor change.
func (r *replayer) payload(ctx context.Context, res Object, body []byte, sum *Summary) error {
	key, at := res.Key, res.FetchedAt
	sum.Objects++
	b, err := r.parser.Parse(body, at)
	if err != nil {
		res.Malformed = err.Error()
		if m, ok := sources.AsMalformed(err); ok {
			res.Malformed = m.Reason
		}
		sum.Malformed++
		r.report(res)
		return nil
	}
	if b == nil {
		b = &sources.Batch{}
	}
	for i, rec := range b.Records {
		if rec.Off < 0 || rec.Len < 0 || rec.Off+rec.Len > len(body) {
			// A parser bug, not a bad payload; skipping keeps the replay going.
			res.Malformed = fmt.Sprintf("record %d (offset %d, length %d) is outside the %d-byte payload", i, rec.Off, rec.Len, len(body))
			sum.Malformed++
			r.report(res)
			return nil
		}
	}
	res.Records = len(b.Records)
	sum.Records += res.Records
	if r.queue == nil || len(b.Records) == 0 {
		r.report(res)
		return nil
	}
	if r.opts.Force {
		keys := make([]string, len(b.Records))
		for i, rec := range b.Records {
			keys[i] = rec.Key
		}
		if res.Forgotten, err = r.queue.Forget(ctx, r.source, keys); err != nil {
			return err
		}
		sum.Forgotten += res.Forgotten
	}
	frames, err := r.ingest.Commit(ctx, ingest.PageBatch(r.source, at, ingest.Ref{Key: key, Off: res.Off}, body, b.Records))
	if err != nil {
		return err
	}
	for _, f := range frames {
		res.Queued += len(f.Events)
	}
	res.Duplicates = res.Records - res.Queued
	sum.Queued += res.Queued
	sum.Duplicates += res.Duplicates
	r.report(res)
	return nil
}

func (r *replayer) report(o Object) {
	if r.opts.Report != nil {
		r.opts.Report(o)
	}
}
