package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
)

// cmdDoctor is `ingestor doctor`: check the queue database and the raw
// bytes it references, with the daemon stopped.
func cmdDoctor(args []string, stdout, stderr io.Writer) int {
	sc := newSubcommand("doctor", "usage: ingestor doctor -c FILE\n\n"+
		"Checks the data dir of FILE with the daemon stopped: PRAGMA integrity_check on queue.db, then every raw\n"+
		"object and page that pending and dead-lettered events reference exists and matches its checksum.\n"+
		"Prints a report; exit 0 when all is sound, 1 on a problem or when the check cannot run.\n\n",
		"config `file` (required)", stderr)
	pos, code, done := sc.parse(args)
	if done {
		return code
	}
	if !sc.hasPath() || len(pos) > 0 {
		sc.fail("-c FILE is required, and nothing else")
		sc.fs.Usage()
		return 2
	}
	cfg := sc.load()
	if cfg == nil {
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	problems, err := doctor(ctx, cfg, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "ingestor doctor: %v\n", err)
		return 1
	}
	if problems > 0 {
		fmt.Fprintf(stdout, "\n%d problem(s) found. See docs/operations.md, a damaged or foreign data dir.\n", problems)
		return 1
	}
	fmt.Fprintln(stdout, "\nno problem found")
	return 0
}

// doctor checks cfg's data dir and raw store, printing each finding to w,
// and returns how many problems it found. An error means the check could
// not run (the data dir is in use, the raw store unreachable).
func doctor(ctx context.Context, cfg *config.Config, w io.Writer) (problems int, err error) {
	dir := cfg.Daemon.DataDir
	qpath := filepath.Join(dir, "queue.db")
	if _, err := os.Stat(qpath); err != nil {
		return 0, fmt.Errorf("no queue in data dir %s: %w", dir, err)
	}
	unlock, err := datadir.Lock(dir)
	if inUse := (*datadir.InUseError)(nil); errors.As(err, &inUse) {
		return 0, fmt.Errorf("%w: stop it first, doctor runs with the daemon stopped", err)
	}
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, unlock()) }()
	fmt.Fprintf(w, "queue %s: PRAGMA integrity_check\n", qpath)
	var found []string
	in, err := queue.OpenInspector(qpath)
	if d := (*queue.DamagedError)(nil); errors.As(err, &d) {
		found = d.Problems
	} else if err != nil {
		return 0, err
	} else {
		defer func() { err = errors.Join(err, in.Close()) }()
		if found, err = in.IntegrityCheck(ctx); err != nil {
			return 0, err
		}
	}
	for _, p := range found {
		fmt.Fprintf(w, "  PROBLEM: %s\n", p)
	}
	if len(found) > 0 {
		// The references cannot be trusted, nor perhaps read: restoring
		// or rebuilding the queue comes first.
		return len(found), nil
	}
	fmt.Fprintln(w, "  ok")

	raw, err := rawstore.Open(ctx, rawstore.Options{URL: cfg.RawStore.URL, Endpoint: cfg.RawStore.Endpoint,
		Region: cfg.RawStore.Region, PathStyle: cfg.RawStore.PathStyle})
	if err != nil {
		return 0, err
	}
	if app, ok := raw.(rawstore.Appender); ok {
		defer func() { err = errors.Join(err, app.Close()) }()
	}
	fmt.Fprintf(w, "raw store %s: the objects and pages that pending and dead-lettered events reference\n", raw)
	c := &rawChecker{raw: raw, w: w}
	if err := in.RawRefs(ctx, func(r queue.RawRef) error { return c.check(ctx, r) }); err != nil {
		return c.problems, err
	}
	c.flush()
	if c.problems == 0 {
		fmt.Fprintf(w, "  ok: %d objects, %d pages, %d references\n", c.objects, c.pages, c.refs)
	}
	return c.problems, nil
}

// rawChecker checks the raw references of the queue, in key and offset
// order: each object (Get checks the SHA-256 in its key) and each page of
// a page segment (its CRC-32C) is read once, and the events that the same
// problem affects are counted on one line.
type rawChecker struct {
	raw   rawstore.Store
	w     io.Writer
	index rawstore.PageIndex
	// key and page are the object and page read last; body their bytes,
	// bad the problem found with them ("" when sound).
	key  string
	page rawstore.PageRef
	body []byte
	bad  string
	// pending and dead count the references the problem bad affects.
	pending, dead int

	objects, pages, refs, problems int
}

// check checks one reference.
func (c *rawChecker) check(ctx context.Context, r queue.RawRef) error {
	c.refs++
	pr, paged := c.raw.(rawstore.PageReader)
	paged = paged && rawstore.IsPageSegment(r.Key) && r.Len > 0
	same := r.Key == c.key && (!paged || r.Off >= c.page.Off && r.Off < c.page.Off+c.page.Len)
	if !same {
		c.flush()
		c.key, c.page, c.body, c.bad = r.Key, rawstore.PageRef{}, nil, ""
		var err error
		if paged {
			if c.page, err = pr.FindPage(ctx, r.Key, r.Off, &c.index); err == nil {
				c.pages++
				c.body, err = pr.ReadPage(ctx, r.Key, c.page)
			} else {
				// The segment cannot be read up to r's page, nor past it.
				c.page = rawstore.PageRef{Off: r.Off, Len: math.MaxInt - r.Off}
			}
		} else {
			c.objects++
			c.body, err = c.raw.Get(ctx, r.Key)
		}
		var ce *rawstore.CorruptError
		switch {
		case errors.Is(err, fs.ErrNotExist):
			c.bad = "raw object missing: " + r.Key
		case errors.As(err, &ce):
			c.bad = ce.Error()
		case err != nil:
			return err
		}
	}
	base := 0
	if paged {
		base = c.page.Off
	}
	if c.bad == "" && (r.Off < base || r.Off-base+r.Len > len(c.body)) {
		c.problems++
		fmt.Fprintf(c.w, "  PROBLEM: the bytes [%d,+%d) of an event (dead-lettered: %t) are not in %s (%d bytes from %d)\n",
			r.Off, r.Len, r.Dead, r.Key, len(c.body), base)
		return nil
	}
	if c.bad != "" {
		if r.Dead {
			c.dead++
		} else {
			c.pending++
		}
	}
	return nil
}

// flush prints the problem of the object or page read last, if any.
func (c *rawChecker) flush() {
	if c.bad == "" {
		return
	}
	c.problems++
	fmt.Fprintf(c.w, "  PROBLEM: %s (events: %d pending, %d dead-lettered)\n", c.bad, c.pending, c.dead)
	c.bad, c.pending, c.dead = "", 0, 0
}
