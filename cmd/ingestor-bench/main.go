// Command ingestor-bench measures the whole ingestion pipeline on this
// machine: demo sources -> raw store (file://, fsync) -> SQLite queue ->
// ZeroMQ (ipc://) -> in-process processors -> acks committed back to the
// queue. It runs the real daemon and the real processor client in one
// process, in a temporary directory.
//
// Usage:
//
//	ingestor-bench [-mode throughput|processor-down|rehydrate|webhook|real|compare|memory|overload] [-events N] [-duration D]
//	               [-sources K] [-events-per-tick N] [-event-size B]
//	               [-processors P] [-synchronous full|normal]
//	               [-events-per-frame N] [-backlog N] [-dir DIR] [-json] [-v]
//	               [-clients C] [-cpuprofile FILE] [-bin DIR] [-page-size N] [-half-events N]
//	               [-baseline DIR] [-runs N] [-memory-batches LIST]
//
// Mode throughput (the default) runs until -events events are acked and
// reports throughput, fetch-to-ack latency, CPU time and peak RSS. Mode
// processor-down first runs the daemon with no processor until -backlog
// events are queued on disk, then starts the processors and also reports
// how fast that backlog drains and the RSS before and after. Mode rehydrate
// writes -backlog events (default 1000000) straight into a queue, then
// starts the daemon on it with no source and no processor and reports the
// time until it is ready and the RSS and Go heap it then holds. Mode
// webhook starts the daemon with a webhook source and no demo source, and
// -clients keep-alive HTTP clients POST -events requests (default 200000),
// one event each; it reports durable requests/s and the request-to-answer
// latency (webhook.go).
//
// Mode real measures the real path through the built binaries, each in its
// own process (real.go): this executable re-executed as a firehose
// upstream (-mode firehose, firehose.go: pages of -page-size events of
// about -event-size bytes, default 500, with the cursor in the query),
// bin/ingestor run with one http_poll source polling it back to back
// (raw store file://, fsynced; synchronous = full; frames of 100), and
// bin/processor acking with -count-out. It releases -events events at
// once, then -half-events more (default a quarter of -events) paced to half
// the rate measured, and prints one table: events/s, CPU seconds per 1M
// events of the daemon and of the processor (/proc/PID/stat), their peak
// RSS (VmHWM), fetch-to-ack p50/p99 of each phase from the daemon's
// histogram, the queue's and the raw store's size after the first phase,
// and whether the processor received every event exactly once (it fails
// otherwise). -cpuprofile there profiles the daemon (INGESTOR_CPUPROFILE).
//
// Mode compare (compare.go) runs mode real -runs times (default 3) with
// this build's binaries (-bin) and as often with a baseline's (-baseline
// DIR; make bench-baseline builds them), interleaved, and prints a row per
// run, the medians of each build and their ratios.
//
// Mode memory (memory.go) runs mode real once per -memory-batches setting
// of the source's inflight_batches (default 2,4,8) and prints, for each,
// the daemon's and the processor's peak RSS beside what the memory
// formula of docs/performance.md predicts for that run's parameters.
//
// Mode overload (overload.go) runs -devices devices on a ws_ingress source
// and -clients webhook senders against the built daemon, after an unloaded
// phase that measures its commit rate, and fails unless goodput stays at
// 80% of that rate in every 5-second window, every device finishes and no
// sender starves.
//
// Mode soak (soak.go) runs the built daemon and the built exactly-once
// processor for -duration (default 20m) with every kind of source at once
// and retentions of about a minute, samples the stores, RSS, open files and
// goroutines every -sample, and fails unless each series is flat after the
// warm-up and every event sent was applied exactly once.
//
// In the other modes, which run the daemon and the processors in this
// process, acks are counted, and latency measured, when the daemon's sender
// learns of them (daemon.Options.OnAck). CPU time is the whole process's
// (getrusage), so it includes the in-process processors. A run that makes
// no progress for 30s fails.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"syscall"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/daemon"
	"github.com/ingestorhq/ingestor/internal/malloctune"
)

func main() {
	malloctune.Apply() // as the daemon and the processor do, for the in-process modes
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // the first signal shuts down gracefully; a second one kills
	}()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "ingestor-bench:", err)
		os.Exit(1)
	}
}

// Modes.
const (
	modeThroughput    = "throughput"
	modeProcessorDown = "processor-down"
	modeRehydrate     = "rehydrate"
)

// options is the command line.
type options struct {
	exactlyOnce         bool
	processorCPUProfile string
	traceRatio          float64
	mode                string
	events              int64
	duration            time.Duration
	sources             int
	eventsPerTick       int
	eventSize           int
	processors          int
	synchronous         string
	eventsPerFrame      int
	backlog             int64
	dir                 string
	json                bool
	verbose             bool
	cpuProfile          string
	clients             int
	signature           string
	// Modes real and firehose.
	addr       string
	pageSize   int
	bin        string
	halfEvents int64
	// publishExtra and sourceExtra are TOML added to the real mode's
	// [publish] section and source block.
	publishExtra, sourceExtra string
	// dedupeWindow, when set, is the real mode's dedupe_window, with
	// prune_interval a third of it: prune then runs within the run.
	dedupeWindow time.Duration
	// members is the cluster mode's largest cluster: it runs 1..members.
	members int
	// soak holds the flags of mode soak.
	soak soakOptions
	// devices is the overload mode's -devices (soak mode's flag).
	devices int
	// baseline is the compare mode's directory of the baseline binaries,
	// runs its runs of each build.
	baseline string
	runs     int
	// ceilingRounds is webhook-ceiling's rounds: -runs when given, else 2.
	ceilingRounds int
	// memoryBatches is the memory mode's -memory-batches: the source's
	// inflight_batches of each run.
	memoryBatches []int
	// gaugeEvery is how often a real run samples the daemon's in-flight
	// frames and frame cache (0: only when it scrapes for progress).
	gaugeEvery time.Duration
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("ingestor-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.mode, "mode", modeThroughput, "throughput; processor-down: queue -backlog events with no processor, then measure the drain; rehydrate: measure a start on a queue of -backlog events; webhook: -clients HTTP clients POST -events webhook requests; real: the built binaries in their own processes, polling a firehose process (firehose: that process); compare: -mode real (its flags apply to every run) -runs times with the binaries of -bin and as often with those of -baseline DIR, interleaved, then a table of every run, the medians and their ratios new/baseline; memory: -mode real once per -memory-batches setting, then the memory formula of docs/performance.md against each run's peak RSS; soak: every kind of source at once for -duration (default 20m) with short retentions, failing when a store, RSS, fds or goroutines grow or an event is lost; webhook-ceiling: the least a durable webhook server can do (net/http, one raw append + fsync and one SQLite transaction per group) under the webhook load, alternating with -mode webhook, and the ratio; overload: -devices devices and -clients webhook senders push at once, failing when goodput drops below 80% of the unloaded rate; cluster: the real path on 1..-members member processes; cluster-scale: -members (default 20) in-process members share -sources (default 10000) stub sources on one etcd for -duration (default 10m), then one is killed, failing when etcd writes, its size, the spread or the re-own time miss their targets")
	fs.StringVar(&o.bin, "bin", "", "real mode: directory of the built ingestor and processor binaries (default: this executable's directory)")
	fs.StringVar(&o.baseline, "baseline", "", "compare mode: directory of the baseline's ingestor and processor binaries (make bench-baseline builds them into .bench/baseline-COMMIT)")
	fs.IntVar(&o.runs, "runs", compareRuns, "compare mode: runs of each build; webhook-ceiling: rounds of a ceiling run and a daemon run (default 2)")
	memoryBatches := fs.String("memory-batches", defaultMemoryBatches, "memory mode: the http_poll source's inflight_batches of each run, comma-separated")
	fs.IntVar(&o.pageSize, "page-size", 1000, "real mode: events per firehose page")
	fs.StringVar(&o.publishExtra, "publish-extra", "", "real mode: TOML lines added to [publish], e.g. 'max_inflight_frames = 128'")
	fs.StringVar(&o.sourceExtra, "source-extra", "", "real mode: TOML lines added to the http_poll source's block, e.g. 'inflight_batches = 4'")
	fs.DurationVar(&o.dedupeWindow, "dedupe-window", 0, "real mode: the daemon's dedupe_window (prune_interval a third of it), short enough for Prune to delete as many events as are queued during the run: the cost of a daemon that has run longer than its window (default: the daemon's, 1h, so nothing is pruned)")
	fs.Float64Var(&o.traceRatio, "trace-ratio", -1, "real mode: turn the daemon's OpenTelemetry tracing on with this sampling_ratio (0 to 1), exporting to an OTLP receiver in the bench; -1: off")
	fs.Int64Var(&o.halfEvents, "half-events", 0, "real mode: events of the half-load phase (default: a quarter of -events, at least one page)")
	fs.StringVar(&o.addr, "addr", "127.0.0.1:0", "firehose mode: address to listen on")
	fs.IntVar(&o.members, "members", 3, "cluster mode: run on 1, 2, ... this many members (-sources sources of -events events each, default 6 of 200000)")
	fs.IntVar(&o.clients, "clients", 64, "webhook mode: concurrent keep-alive HTTP clients")
	fs.StringVar(&o.signature, "signature", "", `webhook mode: "github" to sign every request (X-Hub-Signature-256) and have the daemon verify it; "" for none`)
	fs.Int64Var(&o.events, "events", 2_000_000, "stop once this many events are acked")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long even if fewer events were acked (0: no cap)")
	fs.IntVar(&o.sources, "sources", 2, "demo sources")
	fs.IntVar(&o.eventsPerTick, "events-per-tick", 1000, "events per demo fetch")
	fs.IntVar(&o.eventSize, "event-size", 256, "approximate event size in bytes (real mode: default 500)")
	fs.IntVar(&o.processors, "processors", 2, "in-process processor clients, each on its own goroutine")
	fs.StringVar(&o.synchronous, "synchronous", "full", "SQLite synchronous mode of the queue: full or normal")
	fs.IntVar(&o.eventsPerFrame, "events-per-frame", 100, "events packed into one ZeroMQ frame")
	fs.Int64Var(&o.backlog, "backlog", 200_000, "processor-down mode: events queued before the processors start; rehydrate mode: events queued before the daemon starts (default 1000000)")
	fs.StringVar(&o.dir, "dir", "", "empty directory for the queue, raw store and sockets, kept afterwards (default: a temporary directory, removed)")
	fs.BoolVar(&o.json, "json", false, "print the result as one JSON line")
	fs.BoolVar(&o.exactlyOnce, "exactly-once", false, "processors write every event into a SQLite table exactly once (processor.RunTx) instead of only reading it")
	fs.StringVar(&o.processorCPUProfile, "processor-cpuprofile", "", "real mode: write a CPU profile of the processor process to this file (go tool pprof FILE)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof FILE); real mode: of the daemon process")
	fs.BoolVar(&o.verbose, "v", false, "log the daemon and processors at info level (default: warnings only)")
	soakFlags(fs, &o.soak)
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.mode == modeRehydrate && !set["backlog"] {
		o.backlog = rehydrateBacklog
	}
	if (o.mode == modeWebhook || o.mode == modeWebhookCeiling) && !set["events"] {
		o.events = webhookRequests
	}
	o.ceilingRounds = 2
	if set["runs"] {
		o.ceilingRounds = o.runs
	}
	realLike := o.mode == modeReal || o.mode == modeCompare || o.mode == modeMemory
	if (realLike || o.mode == modeFirehose || o.mode == modeCluster) && !set["event-size"] {
		o.eventSize = realEventSize
	}
	if o.mode == modeCluster && !set["events"] {
		o.events = clusterEventsPerSource
	}
	if o.mode == modeCluster && !set["sources"] {
		o.sources = clusterSources
	}
	if o.mode == modeClusterScale {
		if !set["members"] {
			o.members = scaleMembers
		}
		if !set["sources"] {
			o.sources = scaleSources
		}
		if !set["duration"] {
			o.duration = scaleDuration
		}
	}
	if realLike && !set["half-events"] {
		o.halfEvents = max(o.events/4, int64(o.pageSize))
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if !slices.Contains([]string{modeThroughput, modeProcessorDown, modeRehydrate, modeWebhook, modeWebhookCeiling, modeReal, modeCompare, modeMemory, modeFirehose, modeCluster, modeClusterScale, modeSoak, modeOverload}, o.mode) {
		errs = append(errs, fmt.Errorf("-mode must be %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s or %s, not %q",
			modeThroughput, modeProcessorDown, modeRehydrate, modeWebhook, modeWebhookCeiling, modeReal, modeCompare, modeMemory, modeFirehose, modeCluster, modeClusterScale, modeSoak, modeOverload, o.mode))
	}
	errs = append(errs, overloadFlags(&o, set)...)
	errs = append(errs, compareFlags(&o, set)...)
	errs = append(errs, memoryFlags(&o, set, *memoryBatches)...)
	if o.mode == modeSoak {
		if !set["duration"] {
			o.duration = soakDuration
		}
		errs = append(errs, o.soak.check(o.duration))
	}
	if o.mode == modeCluster && o.members < 1 || o.mode == modeClusterScale && o.members < 2 {
		errs = append(errs, fmt.Errorf("-members must be at least 1 (cluster-scale: 2), not %d", o.members))
	}
	if (realLike || o.mode == modeFirehose) && (o.pageSize < 1 || o.eventSize < 1) {
		errs = append(errs, fmt.Errorf("-page-size and -event-size must be at least 1, not %d and %d", o.pageSize, o.eventSize))
	}
	if realLike && o.halfEvents < 1 {
		errs = append(errs, fmt.Errorf("-half-events must be at least 1, not %d", o.halfEvents))
	}
	if o.signature != "" && o.signature != webhookSignature {
		errs = append(errs, fmt.Errorf("-signature must be %q or empty, not %q", webhookSignature, o.signature))
	}
	if o.synchronous != "full" && o.synchronous != "normal" {
		errs = append(errs, fmt.Errorf("-synchronous must be full or normal, not %q", o.synchronous))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"events", o.events}, {"sources", int64(o.sources)}, {"processors", int64(o.processors)}, {"backlog", o.backlog}, {"clients", int64(o.clients)}} {
		if f.v < 1 {
			errs = append(errs, fmt.Errorf("-%s must be at least 1, not %d", f.name, f.v))
		}
	}
	if o.duration < 0 {
		errs = append(errs, fmt.Errorf("-duration must not be negative, not %v", o.duration))
	}
	// events-per-tick, event-size and events-per-frame are checked by the
	// config package, which knows their ranges.
	return o, errors.Join(errs...)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.mode == modeFirehose {
		return runFirehose(ctx, o, os.Stdin, stdout)
	}
	dir, cleanup, err := benchDir(o.dir)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	if runMode, ok := ownProcessModes[o.mode]; ok {
		return runMode(ctx, o, dir, stdout, stderr)
	}
	return runInProcess(ctx, o, dir, stdout, stderr)
}

// ownProcessModes are the modes that start their processes themselves (or
// run in their own way); the others run the daemon in this process
// (runInProcess).
var ownProcessModes = map[string]func(ctx context.Context, o options, dir string, stdout, stderr io.Writer) error{
	modeSoak:         runSoak,
	modeOverload:     runOverload,
	modeCompare:      runCompare,
	modeMemory:       runMemory,
	modeClusterScale: runClusterScale,
	modeCluster:      runClusterMode,
	modeReal:         runRealMode,
}

// runClusterMode runs -mode cluster and prints its runs.
func runClusterMode(ctx context.Context, o options, dir string, stdout, stderr io.Writer) error {
	runs, err := benchCluster(ctx, o, dir, stderr)
	if err != nil {
		return err
	}
	if o.json {
		return printJSONLine(stdout, runs)
	}
	return printCluster(stdout, o, runs)
}

// runRealMode runs -mode real, prints it and fails unless the processor
// received every event exactly once.
func runRealMode(ctx context.Context, o options, dir string, stdout, stderr io.Writer) error {
	res, err := benchReal(ctx, o, dir, stderr)
	if err != nil {
		return err
	}
	if o.json {
		if err := printJSONLine(stdout, res); err != nil {
			return err
		}
	} else if err := printReal(stdout, res); err != nil {
		return err
	}
	if !res.exactlyOnce() {
		return fmt.Errorf("exactly-once check failed: the processor received %d events with %d distinct keys, want %d of each",
			res.Received.Events, res.Received.DistinctKeys, res.Events+res.HalfEvents)
	}
	return nil
}

// runInProcess runs the modes whose daemon runs in this process, with
// the in-process processors: the default (polled) mode, rehydrate,
// webhook and webhook-ceiling.
func runInProcess(ctx context.Context, o options, dir string, stdout, stderr io.Writer) (err error) {
	co := o
	if o.mode == modeRehydrate || o.mode == modeWebhook || o.mode == modeWebhookCeiling {
		co.sources = 0 // the daemon only opens the backlog, or takes webhooks
	}
	cfg, err := benchConfig(co, dir)
	if err != nil {
		return err
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if o.cpuProfile != "" {
		stopProfile, err := startCPUProfile(o.cpuProfile)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, stopProfile()) }()
	}
	switch o.mode {
	case modeRehydrate:
		res, err := rehydrate(ctx, o, cfg, log, stderr)
		if err != nil {
			return err
		}
		return printRehydrate(stdout, res, o.json)
	case modeWebhookCeiling:
		return runWebhookCeiling(ctx, o, dir, log, stdout)
	case modeWebhook:
		res, err := benchWebhook(ctx, o, cfg, log)
		if err != nil {
			return err
		}
		return printWebhook(stdout, res, o.json)
	}
	res, err := bench(ctx, o, cfg, log, stderr)
	if err != nil {
		return err
	}
	if o.json {
		return printJSON(stdout, res)
	}
	printText(stdout, res)
	return nil
}

// startCPUProfile starts profiling into path and returns the function that
// stops it and closes the file.
func startCPUProfile(path string) (func() error, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", errors.Join(err, f.Close()))
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		return nil
	}, nil
}

// benchDir returns the directory to run in and a function that removes it
// if it was made here. A given directory must be empty or absent: the bench
// needs a fresh queue.
func benchDir(dir string) (string, func() error, error) {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "ingestor-bench-")
		if err != nil {
			return "", nil, fmt.Errorf("temp dir: %w", err)
		}
		return tmp, func() error { return os.RemoveAll(tmp) }, nil
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return "", nil, fmt.Errorf("-dir: %w", err)
		}
	case err != nil:
		return "", nil, fmt.Errorf("-dir: %w", err)
	case len(entries) > 0:
		return "", nil, fmt.Errorf("-dir %s is not empty: the bench needs a fresh queue", dir)
	}
	return dir, func() error { return nil }, nil
}

// bench runs the daemon and the processors and measures them. It reports
// the phases of a processor-down run to progress.
func bench(ctx context.Context, o options, cfg *config.Config, log *slog.Logger, progress io.Writer) (*result, error) {
	capCtx, cancelCap := context.WithCancel(ctx)
	if o.duration > 0 {
		capCtx, cancelCap = context.WithTimeout(ctx, o.duration)
	}
	defer cancelCap()
	rec := newRecorder(o.events)
	res := &result{Mode: o.mode, Target: o.events, Sources: o.sources, EventsPerTick: o.eventsPerTick,
		EventSize: o.eventSize, Processors: o.processors, Synchronous: o.synchronous, EventsPerFrame: o.eventsPerFrame}

	u0, err := getUsage()
	if err != nil {
		return nil, err
	}
	daemonStart := time.Now()
	d, err := daemon.Start(ctx, cfg, daemon.Options{Logger: log, OnAck: rec.onAck})
	if err != nil {
		return nil, fmt.Errorf("start daemon: %w", err)
	}
	procs := &processors{log: log, endpoint: cfg.Publish.Endpoint, ack: cfg.Publish.AckEndpoint}
	if o.exactlyOnce {
		procs.sinkDB = filepath.Join(cfg.Daemon.DataDir, "sink.db")
	}
	defer func() {
		// Normally already stopped; this covers an early return.
		if err := procs.stop(); err != nil {
			log.Error("processors", "err", err)
		}
	}()
	pending := func() int64 { return d.Queue().PendingEvents() }
	acked := func() int64 { return rec.acked.Load() }
	w := &watchdog{ctx: ctx, capCtx: capCtx, stall: stallLimit, state: func() string {
		return fmt.Sprintf("%d of %d events acked, %d pending in the queue", rec.acked.Load(), o.events, pending())
	}}

	// start is when the processors start; throughput is measured from it.
	var start time.Time
	var waitErr error
	if o.mode == modeProcessorDown {
		start, waitErr = fillBacklog(w, o, res, rec, pending, daemonStart, progress)
	}
	if waitErr == nil {
		if start.IsZero() {
			start = time.Now()
		}
		waitErr = procs.start(o.processors)
	}
	if waitErr == nil && res.Backlog != nil {
		waitErr = drainBacklog(w, res, rec, acked, start, u0)
	}
	if waitErr == nil {
		waitErr = w.wait("acking events", func() bool { return isClosed(rec.reached) }, acked)
	}
	end, ackedAtEnd := time.Now(), rec.acked.Load()
	if isClosed(rec.reached) {
		end, ackedAtEnd = rec.reachedAt, rec.reachedAcked // acks come only after the processors start
	}
	if start.IsZero() {
		start = end
	}
	u1, uerr := getUsage()

	// Shut down while the processors still run, so in-flight frames get
	// acked; then stop them.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Daemon.ShutdownGrace)
	shutErr := d.Shutdown(sctx)
	cancel()
	procErr := procs.stop()

	switch {
	case errors.Is(waitErr, errCapped):
		res.Capped = true
	case waitErr != nil:
		return nil, errors.Join(waitErr, shutErr, procErr)
	}
	if err := errors.Join(uerr, shutErr, procErr); err != nil {
		return nil, err
	}
	res.finish(rec, ackedAtEnd, end.Sub(start), u0, u1, pending(), procs.totals())
	return res, nil
}

// fillBacklog waits, with no processor running, until -backlog events
// are queued, records the backlog in res and returns the time the
// processors start.
func fillBacklog(w *watchdog, o options, res *result, rec *recorder, pending func() int64, daemonStart time.Time, progress io.Writer) (time.Time, error) {
	if err := w.wait("queueing the backlog with no processor running",
		func() bool { return pending() >= o.backlog }, pending); err != nil {
		return time.Time{}, err
	}
	size := pending() // every one of these was fetched before start
	start := time.Now()
	res.Backlog = &backlogResult{Events: size, FillSeconds: round(start.Sub(daemonStart).Seconds(), 3),
		RSSQueuedMiB: round(currentRSSMiB(), 1)}
	rec.watchBacklog(start, size)
	fmt.Fprintf(progress, "ingestor-bench: %d events queued with no processor in %.2f s, RSS %.1f MiB; starting %d processors\n",
		size, res.Backlog.FillSeconds, res.Backlog.RSSQueuedMiB, o.processors)
	return start, nil
}

// drainBacklog waits until the processors have acked the backlog and
// records how long that took, the CPU since u0 and the RSS.
func drainBacklog(w *watchdog, res *result, rec *recorder, acked func() int64, start time.Time, u0 usage) error {
	if err := w.wait("draining the backlog", func() bool { return isClosed(rec.drained) }, acked); err != nil {
		return err
	}
	u, err := getUsage()
	if err != nil {
		return err
	}
	res.Backlog.setDrain(rec.drainedAt.Sub(start), u.user+u.sys-u0.user-u0.sys, currentRSSMiB())
	return nil
}

// printJSONLine prints v as one line of JSON.
func printJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
