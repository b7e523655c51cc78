package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/ingestorhq/ingestor/internal/checksource"
)

// cmdCheckSource is `ingestor check-source NAME -c FILE`: one dry-run poll
// of a source, printed; nothing is written.
func cmdCheckSource(args []string, stdout, stderr io.Writer) int {
	sc := newSubcommand("check-source", "usage: ingestor check-source NAME -c FILE [-cursor VALUE] [-max-pages N] [-v]\n\n"+
		"Polls source NAME once (enabled or not), following its pages, and prints each request, the\n"+
		"records, the next cursor and any problem. Writes nothing: the raw store, the queue and the\n"+
		"cursors are untouched; it is safe while the daemon runs.\n\n",
		"config `file` (required)", stderr)
	fs := sc.fs
	cursor := fs.String("cursor", "", "poll with this cursor `value` instead of the source's durable one")
	maxPages := fs.Int("max-pages", 10, "fetch at most `n` pages while the upstream reports more")
	verbose := fs.Bool("v", false, "list every record, not just the first 20")
	names, code, done := sc.parse(args)
	if done {
		return code
	}
	if !sc.hasPath() || len(names) != 1 || *maxPages < 1 {
		sc.fail("one source NAME and -c FILE are required; -max-pages must be at least 1")
		fs.Usage()
		return 2
	}
	o := checksource.Options{Cursor: *cursor, MaxPages: *maxPages, Verbose: *verbose}
	fs.Visit(func(f *flag.Flag) { o.HasCursor = o.HasCursor || f.Name == "cursor" })

	cfg := sc.load()
	if cfg == nil {
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if _, err := checksource.Run(ctx, cfg, names[0], stdout, o); err != nil {
		fmt.Fprintf(stderr, "ingestor check-source: %v\n", err)
		return 1
	}
	return 0
}

// parseInterspersed parses flags that may come before or after the
// positional arguments (`check-source NAME -c FILE` and `check-source -c
// FILE NAME`), and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}
