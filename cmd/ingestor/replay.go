package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/replay"
)

// cmdReplay is `ingestor replay`: re-ingest stored raw payloads of one
// source through its current parser, with the daemon stopped.
func cmdReplay(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: ingestor replay -c FILE -source NAME [-from RFC3339] [-to RFC3339] [-force] [-dry-run] [-include-deadletters]\n\n"+
			"Parses the raw payloads of NAME fetched in [-from, -to) again with the source's current rules and\n"+
			"queues their events; events already queued or remembered are duplicates. Run it with the daemon\n"+
			"stopped: the daemon delivers what was queued when it starts.\n\n")
		fs.PrintDefaults()
	}
	paths := configFlag(fs, "config (required)")
	source := fs.String("source", "", "`name` of the source whose payloads are replayed (required)")
	from := fs.String("from", "", "replay payloads fetched at or after this RFC 3339 `time`")
	to := fs.String("to", "", "replay payloads fetched before this RFC 3339 `time`")
	force := fs.Bool("force", false, "queue again events already delivered and acked (forced redelivery)")
	dryRun := fs.Bool("dry-run", false, "parse and report only; write nothing")
	deadLetters := fs.Bool("include-deadletters", false, "also replay the payloads under deadletter/NAME/ (those that failed to parse)")
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	if len(*paths) == 0 || *source == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "ingestor replay: -c FILE and -source NAME are required, and nothing else")
		fs.Usage()
		return 2
	}
	o := replay.Options{Source: *source, Force: *force, DryRun: *dryRun, DeadLetters: *deadLetters}
	var err error
	if o.From, err = parseTime("-from", *from); err != nil {
		fmt.Fprintf(stderr, "ingestor replay: %v\n", err)
		return 2
	}
	if o.To, err = parseTime("-to", *to); err != nil {
		fmt.Fprintf(stderr, "ingestor replay: %v\n", err)
		return 2
	}
	cfg, err := config.LoadPaths(*paths, config.Options{})
	if err != nil {
		printConfigError(stderr, err)
		return 1
	}
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	o.Report = func(obj replay.Object) { printObject(stdout, obj, o) }

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(stdout, "replaying source %q from %s, fetched %s\n", o.Source, cfg.RawStore.URL, describeRange(o.From, o.To))
	fmt.Fprintln(stdout, replayableRange(cfg.RawStore.Retention, o.From, time.Now()))
	sum, err := replay.Run(ctx, cfg, o)
	if err == nil || sum.Objects > 0 {
		printSummary(stdout, sum, o)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ingestor %v\n", err) // err starts with "replay: "
		return 1
	}
	return 0
}

// parseTime parses an RFC 3339 flag value; empty is the zero time.
func parseTime(flagName, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q: want an RFC 3339 time such as 2024-03-05T10:00:00Z", flagName, s)
	}
	return t, nil
}

func describeRange(from, to time.Time) string {
	switch {
	case from.IsZero() && to.IsZero():
		return "at any time"
	case to.IsZero():
		return "from " + from.UTC().Format(time.RFC3339Nano)
	case from.IsZero():
		return "before " + to.UTC().Format(time.RFC3339Nano)
	}
	return "from " + from.UTC().Format(time.RFC3339Nano) + " to before " + to.UTC().Format(time.RFC3339Nano)
}

// printObject prints one line per raw object, or per page of a page
// segment (KEY@OFFSET).
func printObject(w io.Writer, obj replay.Object, o replay.Options) {
	at := obj.FetchedAt.Format(time.RFC3339Nano)
	if obj.Page {
		obj.Key += "@" + strconv.Itoa(obj.Off)
	}
	switch {
	case obj.Malformed != "":
		fmt.Fprintf(w, "%s (fetched %s): malformed, skipped: %s\n", obj.Key, at, obj.Malformed)
	case o.DryRun:
		fmt.Fprintf(w, "%s (fetched %s): %d records\n", obj.Key, at, obj.Records)
	case obj.Forgotten > 0:
		fmt.Fprintf(w, "%s (fetched %s): %d records, %d new, %d duplicates (%d of them acked before: forgotten and queued again)\n",
			obj.Key, at, obj.Records, obj.Queued, obj.Duplicates, obj.Forgotten)
	default:
		fmt.Fprintf(w, "%s (fetched %s): %d records, %d new, %d duplicates\n", obj.Key, at, obj.Records, obj.Queued, obj.Duplicates)
	}
}

func printSummary(w io.Writer, s replay.Summary, o replay.Options) {
	fmt.Fprintf(w, "\nsummary: %d objects, %d records, %d queued, %d duplicates, %d malformed", s.Objects, s.Records, s.Queued, s.Duplicates, s.Malformed)
	if o.Force {
		fmt.Fprintf(w, ", %d forgotten and queued again", s.Forgotten)
	}
	if s.Ignored > 0 {
		fmt.Fprintf(w, ", %d other keys ignored", s.Ignored)
	}
	fmt.Fprintln(w)
	switch {
	case o.DryRun:
		fmt.Fprintln(w, "dry run: nothing was written")
	case s.Queued > 0:
		fmt.Fprintf(w, "%d events are queued: start the daemon to deliver them\n", s.Queued)
	}
}

// replayableRange says which payloads the raw store still holds under
// retention, and warns when from asks for older ones.
func replayableRange(retention time.Duration, from, now time.Time) string {
	if retention == 0 {
		return "raw_store.retention is 0: every payload ever fetched is kept and can be replayed"
	}
	since := now.Add(-retention)
	msg := fmt.Sprintf("raw_store.retention is %v: payloads last written before %s were deleted unless a pending event or a dead letter kept them; those after can be replayed",
		retention, since.UTC().Format(time.RFC3339))
	if !from.IsZero() && from.Before(since) {
		msg += fmt.Sprintf("\nwarning: -from %s is older than that: what was fetched before %s is likely gone",
			from.UTC().Format(time.RFC3339), since.UTC().Format(time.RFC3339))
	}
	return msg
}
