// Command processor is the example processor: it connects to an ingestor
// daemon, acknowledges every event it receives, counts them per source and
// logs its progress. Counts are of deliveries: an event the daemon
// redelivers is counted again.
//
// Usage:
//
//	processor [-connect tcp://127.0.0.1:5557] [-ack tcp://127.0.0.1:5558] [-log-every 2s] [-log-format text|json]
//	          [-workers N] [-gomaxprocs N] [-sqlite PATH [-sqlite-count] [-retention D]] [-record FILE] [-count-out FILE] [-drop-acks P] [-fail-keys REGEX]
//	          [-fail-retryable-keys REGEX]
//	          [-curve-server-key FILE -curve-secret-key FILE]
//	          [-etcd URL[,URL...] [-cluster NAME] [-etcd-ca FILE] [-etcd-cert FILE -etcd-key FILE]]
//
// With -etcd it follows a cluster of daemons (their [cluster] mode) instead
// of one daemon: it reads the members of cluster NAME (default "ingestor")
// from etcd and connects to each member's endpoints, starting and stopping
// as members join and leave, acking each frame to the member that sent it
// (processor.RunCluster); -connect and -ack are then not used. With
// -sqlite the members share the database, so an event two members send
// (fetched again after a failover) is applied once. -etcd-ca verifies
// etcd's server certificates against a CA file instead of the system's
// roots; -etcd-cert and -etcd-key, both or neither, present a client
// certificate to an etcd that requires one (--client-cert-auth).
//
// With -curve-server-key (the daemon's public key file, e.g. daemon.pub) and
// -curve-secret-key (this processor's secret key file, e.g. processor.key,
// not readable by every user), both sockets use ZeroMQ CURVE, for a daemon
// with publish.curve_secret_key_file set; `ingestor curve-keygen` makes
// the files, and the processor's public key goes in the daemon's
// publish.curve_authorized_keys_file.
//
// With -sqlite it writes every event exactly once into the table events of
// the SQLite database at PATH, with processor.Client.RunTx: each row
// commits together with the event's processed key, and a redelivered event
// is skipped. The insert is a plain INSERT, so an event applied twice would
// fail on the primary key; such failures are bugs, logged and counted as
// double_applications. The summary reports the table's row count. With
// -sqlite-count it adds one to the source's row of the table applied
// instead, so that the database stays small over a long run (the soak of
// ingestor-bench uses it); the summary then reports the sum.
//
// It runs Go code on as many threads as -workers (up to the CPUs), unless
// -gomaxprocs or $GOMAXPROCS says otherwise, and keeps the C allocator from
// handing libzmq's freed frames back to the system (unless
// $GLIBC_TUNABLES is set): both save CPU per event (docs/performance.md).
//
// With -record it appends a line "SOURCE KEY DELIVERY" to FILE for every
// event handed to its handler (in -sqlite mode, a redelivery already
// applied is skipped before the handler and not recorded), before the
// event is acked, so that ops can compare what arrived with an upstream's
// own list of ids. SOURCE and KEY are percent-encoded (url.PathEscape: a
// space is %20, a newline %0A, a percent sign %25), so a line is always
// one event with three space-separated fields; DELIVERY is 1 the first
// time and higher on redeliveries. Each line is one write to the file,
// opened for appending, so it survives a kill.
//
// With -count-out it counts the distinct keys (per source) of the events
// handed to its handler and, when it stops, writes {"events": N,
// "distinct_keys": D, "redeliveries": R} to FILE, so that a bench can
// check that every event arrived exactly once (ingestor-bench -mode real).
// Keys that end in a number ("ev-17") cost one bit each.
//
// -drop-acks, -fail-keys and -fail-retryable-keys are for chaos and poison
// tests: they drop whole ack messages with probability P, and fail the
// events whose key matches permanently (the daemon dead-letters them) or
// retryably (the daemon redelivers them).
//
// SIGINT or SIGTERM stops it gracefully: it sends its pending acks and logs
// a summary.
package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mattn/go-sqlite3"

	ingestorconfig "github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/buildinfo"
	"github.com/ingestorhq/ingestor/internal/cluster"
	"github.com/ingestorhq/ingestor/internal/cpuprofile"
	"github.com/ingestorhq/ingestor/internal/curvekey"
	"github.com/ingestorhq/ingestor/internal/logattr"
	"github.com/ingestorhq/ingestor/internal/malloctune"
	"github.com/ingestorhq/ingestor/internal/sqliteuri"
	"github.com/ingestorhq/ingestor/internal/telemetry/otlp"
	"github.com/ingestorhq/ingestor/processor"
	"github.com/ingestorhq/ingestor/processor/etcdmembers"
)

func main() {
	// ZeroMQ's message buffers are reused, not faulted in again.
	malloctune.Apply()
	// run reports the errors of the flags.
	if cfg, err := parseFlags(os.Args[1:], io.Discard); err == nil {
		runtime.GOMAXPROCS(cfg.goMaxProcs(runtime.NumCPU(), os.Getenv("GOMAXPROCS")))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "processor:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	connect   string
	ack       string
	logEvery  time.Duration
	logFormat string
	workers   int
	// maxProcs is -gomaxprocs, 0 for the default.
	maxProcs int
	sqlite   string
	// sqliteCount keeps a count per source instead of a row per event.
	sqliteCount bool
	record      string
	memProfile  string
	countOut    string
	dropAcks    float64
	retention   time.Duration
	// failKeys and failRetryableKeys match the keys to fail; nil matches
	// none.
	failKeys, failRetryableKeys *regexp.Regexp
	// curveServerKey and curveSecretKey are the CURVE key files, or "".
	curveServerKey, curveSecretKey string
	// etcd lists the etcd endpoints of a cluster to follow ("" for one
	// daemon), cluster its name, etcdCA the CA file for https, and
	// etcdCert and etcdKey the client certificate and its key, or "".
	etcd, cluster, etcdCA, etcdCert, etcdKey string
	// otlpEndpoint is where the handler's "process" spans are exported
	// (an OTLP URL), "" for none; otlpProtocol as [telemetry]'s protocol.
	otlpEndpoint, otlpProtocol string
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("processor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.connect, "connect", "tcp://127.0.0.1:5557", "the daemon's event endpoint (its publish.endpoint) to connect to")
	fs.StringVar(&c.ack, "ack", "tcp://127.0.0.1:5558", "the daemon's ack endpoint (its publish.ack_endpoint) to connect to")
	fs.DurationVar(&c.logEvery, "log-every", 2*time.Second, "interval between progress logs")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.IntVar(&c.workers, "workers", 1, "frames processed at once")
	fs.IntVar(&c.maxProcs, "gomaxprocs", 0, "threads running Go code at once (Go's GOMAXPROCS; default: $GOMAXPROCS when set, else -workers up to the CPUs)")
	fs.StringVar(&c.sqlite, "sqlite", "", "write every event exactly once into the table events of this SQLite database")
	fs.BoolVar(&c.sqliteCount, "sqlite-count", false,
		"with -sqlite: instead of a row per event, add one to its source's row of the table applied (source, n), so the database stays small however long the run")
	fs.DurationVar(&c.retention, "retention", processor.DefaultDedupeRetention,
		"with -sqlite: forget a processed key this long after it was applied, counted in running time (negative: never)")
	fs.StringVar(&c.memProfile, "memprofile", "", "on exit, write a heap profile to this file (go tool pprof FILE; a development aid)")
	fs.StringVar(&c.record, "record", "", "append \"SOURCE KEY DELIVERY\" (percent-encoded) to this file for every event received")
	fs.StringVar(&c.countOut, "count-out", "", "on exit, write the events received and their distinct keys as JSON to this file")
	fs.Float64Var(&c.dropAcks, "drop-acks", 0, "probability (0..1) of dropping a whole ack message, for chaos tests")
	fs.StringVar(&c.curveServerKey, "curve-server-key", "", "file of the daemon's CURVE public key (enables CURVE, with -curve-secret-key)")
	fs.StringVar(&c.curveSecretKey, "curve-secret-key", "", "file of this processor's CURVE secret key (enables CURVE, with -curve-server-key)")
	fs.StringVar(&c.etcd, "etcd", "", "follow a cluster of daemons: its etcd endpoints, comma-separated (instead of -connect and -ack)")
	fs.StringVar(&c.cluster, "cluster", "ingestor", "with -etcd: the cluster's name (the daemons' cluster.name)")
	fs.StringVar(&c.etcdCA, "etcd-ca", "", "with -etcd: PEM file of the CAs etcd's certificates are verified against (default: the system's)")
	fs.StringVar(&c.etcdCert, "etcd-cert", "", "with -etcd: PEM file of the client certificate presented to etcd (with -etcd-key)")
	fs.StringVar(&c.etcdKey, "etcd-key", "", "with -etcd: PEM file of the client certificate's private key (with -etcd-cert)")
	fs.StringVar(&c.otlpEndpoint, "otlp-endpoint", "", `export a "process" span for every event the daemon traced to this OTLP receiver (http://HOST:PORT plaintext, https:// TLS), in the event's trace`)
	fs.StringVar(&c.otlpProtocol, "otlp-protocol", "grpc", "with -otlp-endpoint: grpc or http/protobuf")
	failKeys := fs.String("fail-keys", "", "fail events whose key matches this regular expression permanently, for poison tests")
	failRetryable := fs.String("fail-retryable-keys", "", "fail events whose key matches this regular expression retryably")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	var errs []error
	for _, re := range []struct {
		flag, expr string
		dst        **regexp.Regexp
	}{{"-fail-keys", *failKeys, &c.failKeys}, {"-fail-retryable-keys", *failRetryable, &c.failRetryableKeys}} {
		if re.expr == "" {
			continue
		}
		var err error
		if *re.dst, err = regexp.Compile(re.expr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", re.flag, err))
		}
	}
	if c.sqliteCount && c.sqlite == "" {
		errs = append(errs, errors.New("-sqlite-count needs -sqlite"))
	}
	if c.maxProcs < 0 {
		errs = append(errs, fmt.Errorf("-gomaxprocs must not be negative, not %d", c.maxProcs))
	}
	if c.workers < 1 {
		errs = append(errs, fmt.Errorf("-workers must be at least 1, not %d", c.workers))
	}
	if !(c.dropAcks >= 0 && c.dropAcks <= 1) {
		errs = append(errs, fmt.Errorf("-drop-acks must be between 0 and 1, not %v", c.dropAcks))
	}
	if (c.curveServerKey == "") != (c.curveSecretKey == "") {
		errs = append(errs, errors.New("-curve-server-key and -curve-secret-key go together"))
	}
	if (c.etcdCert == "") != (c.etcdKey == "") {
		errs = append(errs, errors.New("-etcd-cert and -etcd-key go together"))
	}
	if c.etcd == "" && (c.etcdCA != "" || c.etcdCert != "" || c.etcdKey != "") {
		errs = append(errs, errors.New("-etcd-ca, -etcd-cert and -etcd-key need -etcd"))
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if c.logEvery <= 0 {
		errs = append(errs, fmt.Errorf("-log-every must be positive, not %v", c.logEvery))
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		errs = append(errs, fmt.Errorf("-log-format must be text or json, not %q", c.logFormat))
	}
	if c.otlpProtocol != "grpc" && c.otlpProtocol != "http/protobuf" {
		errs = append(errs, fmt.Errorf("-otlp-protocol must be grpc or http/protobuf, not %q", c.otlpProtocol))
	}
	if u, err := url.Parse(c.otlpEndpoint); c.otlpEndpoint != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		errs = append(errs, fmt.Errorf("-otlp-endpoint must be http://HOST:PORT or https://HOST:PORT, not %q", c.otlpEndpoint))
	}
	return c, errors.Join(errs...)
}

// run runs the processor until ctx is cancelled, logging to logOut. With
// $INGESTOR_PROCESSOR_CPUPROFILE set it writes a CPU profile of the run
// there (a development aid: ingestor-bench -mode real
// -processor-cpuprofile).
func run(ctx context.Context, args []string, logOut io.Writer) (err error) {
	cfg, err := parseFlags(args, logOut)
	if err != nil {
		return err
	}
	stopProfile, err := cpuprofile.Start(cpuprofile.ProcessorEnv)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopProfile()) }()
	var h slog.Handler = slog.NewTextHandler(logOut, nil)
	if cfg.logFormat == "json" {
		h = slog.NewJSONHandler(logOut, &slog.HandlerOptions{ReplaceAttr: logattr.DurationSeconds})
	}
	log := slog.New(h)
	o, stopTracing, err := clientOptions(ctx, &cfg, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	var clients clientSet
	var members processor.Members
	if cfg.etcd != "" {
		ec, err := cluster.Dial(ingestorconfig.Cluster{EtcdEndpoints: strings.Split(cfg.etcd, ","), EtcdCAFile: cfg.etcdCA,
			EtcdCertFile: cfg.etcdCert, EtcdKeyFile: cfg.etcdKey})
		if err != nil {
			return fmt.Errorf("-etcd %s: %w", cfg.etcd, err)
		}
		defer ec.Close()
		members = etcdmembers.New(ec, cfg.cluster, log)
	} else {
		client, err := processor.New(o)
		if err != nil {
			return err
		}
		clients.add(client)
	}
	var rec *recorder
	if cfg.record != "" {
		if rec, err = openRecorder(cfg.record); err != nil {
			return err
		}
	}
	counts := &counter{bySource: make(map[string]int64)}
	if cfg.countOut != "" {
		counts.keys = make(map[string]*keySet)
	}
	start := time.Now()
	reportCtx, stopReport := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { report(reportCtx, log, clients.stats, counts, cfg.logEvery) })
	store, runOne, err := cfg.handler(ctx, rec, counts, log)
	switch {
	case err != nil:
	case members != nil:
		err = processor.RunCluster(ctx, o, members, func(ctx context.Context, c *processor.Client) error {
			clients.add(c)
			return runOne(ctx, c)
		})
	default:
		err = runOne(ctx, clients.list[0])
	}
	stopReport()
	wg.Wait()
	return errors.Join(err, cfg.summarize(ctx, log, time.Since(start), counts, clients.stats(), store, rec))
}

// clientOptions returns the processor clients' options for cfg, and a
// function that flushes the last spans when tracing is on.
func clientOptions(ctx context.Context, cfg *config, log *slog.Logger) (processor.Options, func(), error) {
	o := processor.Options{
		Endpoint: cfg.connect, AckEndpoint: cfg.ack, Logger: log,
		Workers: cfg.workers, DropAcks: cfg.dropAcks, DedupeRetention: cfg.retention,
		// No handler here keeps an Event or its Payload (the store's
		// insert copies it), so frames are received into reused memory.
		RecycleFrames: true,
	}
	var err error
	if cfg.curveServerKey != "" {
		if o.CurveServerKey, err = processor.ReadCurveKey(cfg.curveServerKey); err != nil {
			return o, nil, fmt.Errorf("-curve-server-key: %w", err)
		}
		if o.CurveSecretKey, err = curvekey.ReadSecret(cfg.curveSecretKey); err != nil {
			return o, nil, fmt.Errorf("-curve-secret-key: %w", err)
		}
	}
	if cfg.otlpEndpoint == "" {
		return o, func() {}, nil
	}
	// Sampling follows the daemon: only events it traced get a span.
	tr, err := otlp.Start(ctx, ingestorconfig.Telemetry{Endpoint: cfg.otlpEndpoint, Protocol: cfg.otlpProtocol,
		SamplingRatio: 1, ServiceName: "ingestor-processor", ExportTimeout: 10 * time.Second}, buildinfo.Read().String(), log)
	if err != nil {
		return o, nil, fmt.Errorf("-otlp-endpoint: %w", err)
	}
	o.TracerProvider = tr.Provider()
	return o, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(sctx); err != nil {
			log.Warn("tracing: exporting the last spans failed", "err", err)
		}
	}, nil
}

// handler returns how a client runs: counting each event, and with
// -sqlite inserting it into the store in the ack's transaction; rec (if
// any) records each event first, and -fail-keys and -fail-retryable-keys
// apply.
func (cfg *config) handler(ctx context.Context, rec *recorder, counts *counter, log *slog.Logger) (
	*eventStore, func(context.Context, *processor.Client) error, error) {
	received := func(ev *processor.Event) error {
		if rec != nil {
			if err := rec.record(ev); err != nil {
				return err
			}
		}
		return cfg.injectFailure(ev)
	}
	if cfg.sqlite == "" {
		return nil, func(ctx context.Context, c *processor.Client) error {
			return c.Run(ctx, func(ctx context.Context, ev *processor.Event) error {
				if err := received(ev); err != nil {
					return err
				}
				counts.count(ev)
				return nil
			})
		}, nil
	}
	store, err := openEventStore(ctx, cfg.sqlite, cfg.sqliteCount, log)
	if err != nil {
		return nil, nil, err
	}
	return store, func(ctx context.Context, c *processor.Client) error {
		return c.RunTx(ctx, store.db, func(ctx context.Context, tx *sql.Tx, ev *processor.Event) error {
			if err := received(ev); err != nil {
				return err
			}
			if err := store.insert(ctx, tx, ev); err != nil {
				return err
			}
			counts.count(ev)
			return nil
		})
	}, nil
}

// summarize closes the store and the recorder, writes -count-out and
// -memprofile, and logs the run's summary.
func (cfg *config) summarize(ctx context.Context, log *slog.Logger, elapsed time.Duration, counts *counter, st processor.Stats,
	store *eventStore, rec *recorder) error {
	var err error
	total, bySource := counts.snapshot()
	attrs := []any{"elapsed", elapsed.Round(time.Millisecond), "events", total,
		"events_per_sec", rate(total, elapsed), sources(bySource),
		"frames", st.Frames, "acked", st.Acked, "failed", st.Failed, "permanent", st.Permanent,
		"duplicates", st.Duplicates, "redeliveries", st.Redeliveries, "malformed", st.Malformed,
		"acks_dropped", st.AcksDropped}
	if store != nil {
		rows, cerr := store.count(context.WithoutCancel(ctx))
		if cerr != nil {
			err = errors.Join(err, cerr)
		}
		attrs = append(attrs, "exactly_once_rows", rows, "double_applications", store.doubles.Load())
		if cerr := store.db.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close %s: %w", cfg.sqlite, cerr))
		}
	}
	if rec != nil {
		err = errors.Join(err, rec.close())
	}
	if cfg.countOut != "" {
		err = errors.Join(err, writeCounts(cfg.countOut, counts.counts(st.Redeliveries)))
	}
	if cfg.memProfile != "" {
		err = errors.Join(err, writeHeapProfile(cfg.memProfile))
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	attrs = append(attrs, "heap_inuse_bytes", ms.HeapInuse, "go_sys_bytes", ms.Sys)
	log.Info("summary", attrs...)
	return err
}

// goMaxProcs returns the GOMAXPROCS to run with: -gomaxprocs, else
// $GOMAXPROCS (env) when it is a number, else -workers up to cpus. One
// thread per worker is enough to keep the workers busy (receiving and
// decoding are lighter than a handler, and take turns with it), and a
// second thread for a single worker only adds wake-ups: each frame handed
// from the receiving goroutine to the worker woke an idle thread to look
// for work, ~15% of the processor's CPU (docs/performance.md).
func (c config) goMaxProcs(cpus int, env string) int {
	if c.maxProcs > 0 {
		return c.maxProcs
	}
	if n, err := strconv.Atoi(env); err == nil && n > 0 {
		return n
	}
	return max(1, min(c.workers, cpus))
}

// injectFailure returns the failure -fail-keys or -fail-retryable-keys asks
// for ev, if any.
func (c config) injectFailure(ev *processor.Event) error {
	switch {
	case c.failKeys != nil && c.failKeys.MatchString(ev.Key):
		return processor.Permanent(fmt.Errorf("key %q matches -fail-keys", ev.Key))
	case c.failRetryableKeys != nil && c.failRetryableKeys.MatchString(ev.Key):
		return fmt.Errorf("key %q matches -fail-retryable-keys", ev.Key)
	}
	return nil
}

// eventsSchema has a plain primary key: applying an event twice fails.
const eventsSchema = `CREATE TABLE IF NOT EXISTS events (
	source TEXT NOT NULL,
	key TEXT NOT NULL,
	seq INTEGER NOT NULL,
	payload BLOB,
	PRIMARY KEY (source, key)
)`

// appliedSchema is the table of -sqlite-count: events applied per source.
const appliedSchema = `CREATE TABLE IF NOT EXISTS applied (
	source TEXT PRIMARY KEY,
	n INTEGER NOT NULL
)`

// eventStore is the -sqlite database.
type eventStore struct {
	path string
	db   *sql.DB
	log  *slog.Logger
	// counting is -sqlite-count: applied holds a count per source, events
	// stays empty. A double application then shows as a count above the
	// events sent, not as a failed insert.
	counting bool
	// doubles counts inserts that failed because the event was already
	// there: bugs in exactly-once delivery.
	doubles atomic.Int64
}

func openEventStore(ctx context.Context, path string, counting bool, log *slog.Logger) (*eventStore, error) {
	dsn, err := sqliteuri.File(path, "_journal_mode=WAL&_synchronous=FULL&_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	for _, schema := range []string{eventsSchema, appliedSchema} {
		if _, err := db.ExecContext(context.WithoutCancel(ctx), schema); err != nil {
			return nil, errors.Join(fmt.Errorf("%s: create tables: %w", path, err), db.Close())
		}
	}
	return &eventStore{path: path, db: db, log: log, counting: counting}, nil
}

// insert writes ev into events with a plain INSERT, or with -sqlite-count
// adds one to its source's count.
func (s *eventStore) insert(ctx context.Context, tx *sql.Tx, ev *processor.Event) error {
	if s.counting {
		_, err := tx.ExecContext(ctx, `INSERT INTO applied (source, n) VALUES (?, 1) ON CONFLICT (source) DO UPDATE SET n = n + 1`, ev.Source)
		if err != nil {
			return fmt.Errorf("%s: count event %s/%s: %w", s.path, ev.Source, ev.Key, err)
		}
		return nil
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO events (source, key, seq, payload) VALUES (?, ?, ?, ?)`,
		ev.Source, ev.Key, ev.Seq, ev.Data())
	var se sqlite3.Error
	if errors.As(err, &se) && (se.ExtendedCode == sqlite3.ErrConstraintPrimaryKey || se.ExtendedCode == sqlite3.ErrConstraintUnique) {
		s.doubles.Add(1)
		s.log.Error("BUG: event applied twice; exactly-once delivery failed", "source", ev.Source, "key", ev.Key, "seq", ev.Seq, "err", err)
		return processor.Permanent(fmt.Errorf("event %s/%s applied twice: %w", ev.Source, ev.Key, err))
	}
	if err != nil {
		return fmt.Errorf("%s: insert event %s/%s: %w", s.path, ev.Source, ev.Key, err)
	}
	return nil
}

// count returns the number of events applied: the rows in events, plus
// the counts in applied.
func (s *eventStore) count(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM events) + (SELECT coalesce(sum(n), 0) FROM applied)`).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: count events: %w", s.path, err)
	}
	return n, nil
}

// report logs progress every interval until ctx is done.
func report(ctx context.Context, log *slog.Logger, stats func() processor.Stats, counts *counter, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last, lastAt := int64(0), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			total, bySource := counts.snapshot()
			st := stats()
			log.Info("progress", "events_per_sec", rate(total-last, now.Sub(lastAt)), "events", total,
				sources(bySource), "redeliveries", st.Redeliveries, "duplicates", st.Duplicates, "malformed", st.Malformed,
				"acks_dropped", st.AcksDropped)
			last, lastAt = total, now
		}
	}
}

// rate returns n per second over d, to one decimal.
func rate(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return math.Round(float64(n)/d.Seconds()*10) / 10
}

// sources returns per-source counts as a log group sorted by source.
func sources(bySource map[string]int64) slog.Attr {
	attrs := make([]any, 0, len(bySource))
	for _, s := range slices.Sorted(maps.Keys(bySource)) {
		attrs = append(attrs, slog.Int64(cmp.Or(s, `""`), bySource[s]))
	}
	return slog.Group("sources", attrs...)
}

// counter counts events in total and per source, and with -count-out
// their distinct keys.
type counter struct {
	mu       sync.Mutex
	total    int64
	bySource map[string]int64
	// keys holds each source's distinct keys; nil unless -count-out.
	keys map[string]*keySet
}

// count counts one event.
func (c *counter) count(ev *processor.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total++
	c.bySource[ev.Source]++
	if c.keys != nil {
		set := c.keys[ev.Source]
		if set == nil {
			set = newKeySet()
			c.keys[ev.Source] = set
		}
		set.add(ev.Key)
	}
}

// counts returns what -count-out writes.
func (c *counter) counts(redeliveries int64) counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := counts{Events: c.total, Redeliveries: redeliveries}
	for _, set := range c.keys {
		out.DistinctKeys += set.n
	}
	return out
}

func (c *counter) snapshot() (int64, map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total, maps.Clone(c.bySource)
}

// clientSet is the Clients of a run: one, or one per cluster member
// followed (a member that left keeps its counts).
type clientSet struct {
	mu   sync.Mutex
	list []*processor.Client
}

func (s *clientSet) add(c *processor.Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, c)
}

// stats sums the Clients' counters.
func (s *clientSet) stats() processor.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	var t processor.Stats
	for _, c := range s.list {
		st := c.Stats()
		t.Frames += st.Frames
		t.Events += st.Events
		t.Acked += st.Acked
		t.Failed += st.Failed
		t.Permanent += st.Permanent
		t.Duplicates += st.Duplicates
		t.Malformed += st.Malformed
		t.Redeliveries += st.Redeliveries
		t.AcksDropped += st.AcksDropped
	}
	return t
}

// writeHeapProfile writes a heap profile of what is live now to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("-memprofile: %w", err)
	}
	runtime.GC() // the profile then shows what is live, not what was last collected
	if err := errors.Join(pprof.WriteHeapProfile(f), f.Close()); err != nil {
		return fmt.Errorf("-memprofile: %w", err)
	}
	return nil
}
