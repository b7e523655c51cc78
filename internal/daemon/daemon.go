// Package daemon assembles the ingestor from a loaded config: raw store,
// write-ahead queue, ZeroMQ delivery, the actor pipeline and the HTTP ops
// endpoints, and shuts them down in order.
package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ingestorhq/ingestor/actors"
	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/buildinfo"
	"github.com/ingestorhq/ingestor/internal/cluster"
	"github.com/ingestorhq/ingestor/internal/curvekey"
	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/delivery"
	"github.com/ingestorhq/ingestor/internal/diskspace"
	"github.com/ingestorhq/ingestor/internal/durable"
	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/logattr"
	"github.com/ingestorhq/ingestor/internal/push"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawretention"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/tap"
	"github.com/ingestorhq/ingestor/internal/telemetry"
	"github.com/ingestorhq/ingestor/internal/telemetry/otlp"
	"github.com/ingestorhq/ingestor/sources"
)

// Options tune a Daemon beyond its config; the zero value is right for the
// ingestor binary.
type Options struct {
	// Logger defaults to one built from the config's log level and format.
	Logger *slog.Logger
	// OnAck is passed to the sender (benchmarks measure latency with it).
	OnAck func(fetchedAt time.Time, events int)
	// opsLimits replaces defaultOpsLimits when set (tests shorten them).
	opsLimits *opsLimits
	// watchInterval replaces defaultWatchInterval when set (tests shorten it).
	watchInterval time.Duration
	// tapKeepalive replaces defaultTapKeepalive when set (tests shorten it).
	tapKeepalive time.Duration
}

// Daemon is a running ingestor.
type Daemon struct {
	cfg      *config.Config // as started: see currentConfig for the sources
	cfgNow   atomic.Pointer[config.Config]
	limiters *sources.RateLimiters // the shared limiters of cfgNow
	reload   *reloader
	log      *slog.Logger
	reg      *prometheus.Registry
	// tracing is OpenTelemetry tracing ([telemetry]); off, a no-op.
	tracing *otlp.Tracing
	queue   *queue.Queue
	// devicesForgotten is when the prune loop last forgot each ws_ingress
	// source's silent devices, deadLettersExpired when it last expired
	// dead letters; only that loop uses them.
	devicesForgotten   map[string]time.Time
	deadLettersExpired time.Time
	raw                rawstore.Store
	zctx               *zmq.Context
	curve              *delivery.CurveServer // nil without CURVE
	sender             *delivery.Sender
	system             *actor.ActorSystem
	pipeline           *actors.Pipeline
	httpSrv            *opsServer   // serves daemon.http_addr
	adminSrv           *opsServer   // serves daemon.admin_addr when set
	inbox              *push.Inbox  // nil without an enabled push source
	pushSrv            *push.Server // serves push.addr when a push source is enabled
	coord              *clusterMode // nil outside cluster mode
	// clusterMetrics are registered in every daemon.
	clusterMetrics *cluster.Metrics
	ready          atomic.Bool
	// metrics, acks, acksRate and started feed GET /status (status.go).
	metrics  *actors.Metrics
	acks     *delivery.AckReceiver
	acksRate *settleRate
	started  time.Time

	// tap shows committed events to GET /tap sessions (tap.go), with an
	// empty line every tapKeepalive when idle.
	tap          *tap.Hub
	tapKeepalive time.Duration
	// disk pauses new work while disk space is low.
	disk *diskspace.Guard
	// stops stops what Start started, in reverse order (lifecycle.go).
	stops stops
}

// NewLogger builds the daemon's logger from its config, writing to
// stderr.
func NewLogger(d config.Daemon) *slog.Logger {
	return newLogger(d, os.Stderr)
}

// newLogger is NewLogger writing to w. JSON logs write durations in
// seconds (logattr.DurationSeconds).
func newLogger(d config.Daemon, w io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(d.LogLevel)); err != nil {
		level = slog.LevelInfo
	}
	ho := &slog.HandlerOptions{Level: level}
	if d.LogFormat == "json" {
		ho.ReplaceAttr = logattr.DurationSeconds
		return slog.New(telemetry.LogHandler(slog.NewJSONHandler(w, ho)))
	}
	return slog.New(telemetry.LogHandler(slog.NewTextHandler(w, ho)))
}

// Start opens every component and starts the pipeline, each component
// registering how it stops (lifecycle.go). On error, whatever was opened
// is stopped again, in reverse order.
func Start(ctx context.Context, cfg *config.Config, o Options) (d *Daemon, err error) {
	log := o.Logger
	if log == nil {
		log = NewLogger(cfg.Daemon)
	} else {
		log = slog.New(telemetry.LogHandler(log.Handler())) // trace ids, as NewLogger's
	}
	if msg := cfg.Daemon.AdminProblem(); msg != "" {
		return nil, fmt.Errorf("refusing to start: daemon.%s %s", adminKey(cfg.Daemon.AdminAddr), msg)
	}
	d = &Daemon{cfg: cfg, log: log, reg: prometheus.NewRegistry(), started: time.Now(), limiters: cfg.Limiters(),
		devicesForgotten: map[string]time.Time{}}
	d.cfgNow.Store(cfg)
	opened := d // the error returns below set d to nil
	defer func() {
		if err != nil {
			err = errors.Join(err, opened.close())
		}
	}()
	if err := d.startTracing(ctx); err != nil {
		return nil, err
	}
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoMetric())
	d.reload = newReloader(d.reg)
	d.clusterMetrics = cluster.NewMetrics(d.reg)
	d.metrics = actors.NewMetrics(d.reg)
	if err := d.openStores(ctx); err != nil {
		return nil, err
	}
	if err := d.startDelivery(o.OnAck); err != nil {
		return nil, err
	}
	limits := defaultOpsLimits
	if o.opsLimits != nil {
		limits = *o.opsLimits
	}
	d.newTap(o.tapKeepalive)
	if err := d.startHTTP(limits); err != nil {
		return nil, err
	}
	d.stops.addFunc("tap sessions", d.tap.Close) // before the listeners stop
	deps, err := d.startPipeline()
	if err != nil {
		return nil, err
	}
	d.startHousekeeping(o.watchInterval)
	// Last, as it takes work from outside: stopping starts with it.
	// Registered with or without a push source, like the CURVE counter.
	pm := push.NewMetrics(d.reg)
	if config.PushEnabled(cfg.Sources) {
		if err := d.startPush(deps, pm); err != nil {
			return nil, err
		}
	}
	d.ready.Store(true)
	d.logStarted()
	return d, nil
}

// openStores takes the data dir and opens the raw store, the disk guard
// and the queue.
func (d *Daemon) openStores(ctx context.Context) (err error) {
	cfg, log := d.cfg, d.log
	if err := durable.MkdirAll(cfg.Daemon.DataDir, 0o750); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	unlock, err := datadir.Lock(cfg.Daemon.DataDir)
	if err != nil {
		return err
	}
	d.stops.add("data dir lock", unlock)
	if d.raw, err = rawstore.Open(ctx, rawstore.Options{URL: cfg.RawStore.URL, Endpoint: cfg.RawStore.Endpoint,
		Region: cfg.RawStore.Region, PathStyle: cfg.RawStore.PathStyle,
		SegmentMaxAge: rawretention.SegmentMaxAge(cfg.RawStore.Retention)}); err != nil {
		return err
	}
	if app, ok := d.raw.(rawstore.Appender); ok {
		d.stops.add("raw store", app.Close)
	}
	if d.disk, err = diskspace.New(diskspace.Options{Paths: diskPaths(cfg), MinFree: cfg.Daemon.MinFreeBytes,
		Logger: log, Registerer: d.reg}); err != nil {
		return err
	}
	disk := d.disk
	d.stops.spawn("disk guard", func(ctx context.Context) { disk.Run(ctx.Done()) })
	qpath := filepath.Join(cfg.Daemon.DataDir, "queue.db")
	if d.queue, err = queue.Open(queue.Options{Path: qpath, Synchronous: cfg.Publish.Synchronous,
		EventsPerFrame: cfg.Publish.EventsPerFrame, DedupeWindow: cfg.Publish.DedupeWindow, Logger: log,
		TrackSettled: cfg.Cluster.Enabled}); err != nil {
		return damagedQueue(cfg, err)
	}
	d.stops.add("queue", d.queue.Close)
	if err := d.queue.QuickCheck(ctx); err != nil {
		return damagedQueue(cfg, err)
	}
	stats, err := d.queue.Stats(ctx)
	if err != nil {
		return err
	}
	var oldest any = "none"
	if !stats.OldestPending.IsZero() {
		oldest = time.Since(stats.OldestPending).Round(time.Millisecond)
	}
	log.Info("queue opened", "path", qpath, "pending_events", stats.PendingEvents, "pending_frames", stats.PendingFrames,
		"dead_letters", stats.DeadLetters, "oldest_pending_age", oldest, "raw_store", d.raw.String())
	d.registerQueueMetrics()
	d.acksRate = startSettleRate(d.queue.SettledEvents)
	d.stops.addFunc("settle rate", d.acksRate.Close)
	return nil
}

// startDelivery starts ZeroMQ delivery: the sender, the ack receiver and,
// with publish.curve_secret_key_file, CURVE.
func (d *Daemon) startDelivery(onAck func(fetchedAt time.Time, events int)) (err error) {
	cfg, log, pub := d.cfg, d.log, d.cfg.Publish
	if d.zctx, err = zmq.NewContext(); err != nil {
		return fmt.Errorf("zeromq context: %w", err)
	}
	d.stops.add("zeromq context", d.zctx.Term) // once every socket is closed; it stops the ZAP handler too
	if pub.CurveSecretKeyFile != "" {
		if d.curve, err = startCurve(d.zctx, pub, log); err != nil {
			return err
		}
	}
	// Registered with or without CURVE, so dashboards and alerts need no
	// second variant; it stays 0 without CURVE.
	curve := d.curve
	d.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ingestor_publish_curve_refused_total",
		Help: "Processor handshakes refused because their CURVE key is not authorized (0 without CURVE)."},
		func() float64 {
			if curve == nil {
				return 0
			}
			return float64(curve.Refused())
		}))
	member := "" // the frames' "member", in cluster mode
	if cfg.Cluster.Enabled {
		if member, err = cfg.Cluster.Member(); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	dm := delivery.NewMetrics(d.reg)
	if d.sender, err = delivery.NewSender(d.zctx, d.queue, d.raw, delivery.SenderOptions{
		Endpoint: pub.Endpoint, HighWaterMark: pub.HighWaterMark, AckTimeout: pub.AckTimeout,
		MaxInflight: pub.MaxInflightFrames, MaxDeliveries: pub.MaxDeliveries, Logger: log, Metrics: dm, OnAck: onAck,
		Curve: d.curve, Member: member, Tracer: d.tracer(), CacheBytes: pub.FrameCacheBytes,
	}); err != nil {
		return err
	}
	sender := d.sender
	d.stops.spawn("sender", func(ctx context.Context) {
		if err := sender.Run(ctx); err != nil {
			log.Error("sender stopped", "err", err)
		}
	})
	acks, err := delivery.NewAckReceiver(d.zctx, delivery.AckOptions{Endpoint: pub.AckEndpoint, HighWaterMark: pub.HighWaterMark,
		MaxMessageBytes: pub.AckMaxMessageBytes, Curve: d.curve, Logger: log, Metrics: dm}, d.queue, d.sender)
	if err != nil {
		return err
	}
	d.acks = acks
	d.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_processors_connected",
		Help: "Processors connected to the ack socket now (each processor's ack connection; a processor that connected only its events socket is not counted)."},
		func() float64 { return float64(acks.Connected()) }))
	d.stops.spawn("ack receiver", func(ctx context.Context) {
		// Run fails only when libzmq's poll does, which a new socket on the
		// same context would not cure; like the sender's, it is logged.
		if err := acks.Run(ctx); err != nil {
			log.Error("ack receiver stopped; acks are no longer received", "err", err)
		}
	})
	return nil
}

// startPipeline starts the actor system and the sources' actors, and in
// cluster mode the coordinator that places them. It returns the actors'
// shared components, which the push inbox shares.
func (d *Daemon) startPipeline() (*actors.Deps, error) {
	cfg, log := d.cfg, d.log
	d.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return log.With("lib", "protoactor")
	}))
	d.stops.addFunc("actor system", d.system.Shutdown)
	deps := &actors.Deps{
		Queue: d.queue, Ingest: ingest.New(ingest.Options{Queue: d.queue, Raw: d.raw, Sender: d.sender, Disk: d.disk,
			Tap: d.tap, Tracer: d.tracer()}),
		Metrics: d.metrics, Logger: log, MaxPendingEvents: cfg.Publish.MaxPendingEvents, RawWriters: 8,
		RawMaxAttempts: cfg.RawStore.MaxAttempts, SpillDir: cfg.RawStore.SpillDir, Tracing: d.tracingProvider(),
	}
	if cfg.Cluster.Enabled {
		coord, err := newClusterMode(d, cfg)
		if err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		d.coord = coord
		// Shutdown leaves the cluster after its drain; this stop is for a
		// Start that fails after joining, and does nothing after that.
		d.stops.add("cluster member", func() error {
			lctx, cancel := context.WithTimeout(context.Background(), cfg.Cluster.LeaseTTL)
			defer cancel()
			return coord.shutdown(lctx)
		})
		deps.Member, deps.Placed, deps.Fence = coord.coord.Name(), true, coord.coord.Fence
	}
	var err error
	if d.pipeline, err = actors.Start(d.system, deps, cfg.Sources, d.limiters); err != nil {
		return nil, err
	}
	d.stops.add("actor pipeline", d.pipeline.Stop)
	if d.coord != nil {
		d.coord.coord.Start()
	}
	return deps, nil
}

// startHousekeeping starts the queue's and the raw store's retention and,
// with daemon.watch_config, the config file's watch.
func (d *Daemon) startHousekeeping(watchInterval time.Duration) {
	pruner := d.rawPruner()
	d.stops.spawn("retention", func(ctx context.Context) { d.prune(ctx, pruner) })
	if !d.cfg.Daemon.WatchConfig {
		return
	}
	if len(d.cfg.Paths) == 0 {
		d.log.Warn("daemon.watch_config is set, but the daemon runs on the embedded example config: there is no file to watch")
		return
	}
	interval := cmp.Or(watchInterval, defaultWatchInterval)
	d.stops.spawn("config watch", func(ctx context.Context) { d.watchConfig(ctx, interval) })
}

// logStarted logs what the daemon runs and where it listens.
func (d *Daemon) logStarted() {
	enabled := 0
	for _, s := range d.cfg.Sources {
		if s.Enabled {
			enabled++
		}
	}
	if enabled == 0 {
		d.log.Warn("no source is enabled; the daemon only delivers what is already queued")
	}
	pub := d.cfg.Publish
	d.log.Info("ingestor started", "sources", enabled, "publish", pub.Endpoint, "acks", pub.AckEndpoint,
		"curve", d.curve != nil, "http", d.HTTPAddr(), "admin", d.AdminAddr(), "admin_token", d.cfg.Daemon.AdminToken != "",
		"push", d.PushAddr())
}

// buildInfoMetric is ingestor_build_info: 1, labelled with the build's
// version, commit and Go version, to join with other series or to see a
// rollout's progress.
func buildInfoMetric() prometheus.Gauge {
	in := buildinfo.Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_build_info",
		Help:        "Always 1; its labels say the build running: version, the commit it was built from, and the Go that built it.",
		ConstLabels: prometheus.Labels{"version": in.Version, "revision": in.Revision, "goversion": in.GoVersion}})
	g.Set(1)
	return g
}

// damagedQueue adds to a *queue.DamagedError what the operator can do.
func damagedQueue(cfg *config.Config, err error) error {
	if d := (*queue.DamagedError)(nil); !errors.As(err, &d) {
		return err
	}
	file := cmp.Or(cfg.Args(), "-c FILE")
	return fmt.Errorf("%w: refusing to start on it. Keep a copy of the data dir as it is, run `ingestor doctor %s` "+
		"for a full report, then restore queue.db from a backup, or move queue.db, queue.db-wal and queue.db-shm aside "+
		"and queue the stored payloads again with `ingestor replay %s -source NAME` (docs/operations.md: a damaged or foreign data dir)",
		err, file, file)
}

// startCurve reads the CURVE key files of pub and starts the ZAP handler
// of zctx; it stops when zctx is terminated.
func startCurve(zctx *zmq.Context, pub config.Publish, log *slog.Logger) (*delivery.CurveServer, error) {
	secret, err := curvekey.ReadSecret(pub.CurveSecretKeyFile)
	if err != nil {
		return nil, fmt.Errorf("publish.curve_secret_key_file: %w", err)
	}
	authorized, err := curvekey.ReadKeys(pub.CurveAuthorizedKeysFile)
	if err != nil {
		return nil, fmt.Errorf("publish.curve_authorized_keys_file: %w", err)
	}
	curve, err := delivery.NewCurveServer(zctx, secret, authorized, log)
	if err != nil {
		return nil, err
	}
	log.Info("curve security enabled: only authorized processors can connect", "authorized_keys", len(authorized))
	return curve, nil
}

// startPush starts the push inbox and listener; their events count on
// the pipeline's per-source metrics, and a push source's rate_limiter is
// the same bucket as the polled sources naming it.
func (d *Daemon) startPush(deps *actors.Deps, pm *push.Metrics) error {
	m := deps.Metrics
	d.inbox = push.NewInbox(push.InboxOptions{Queue: d.queue, Ingest: deps.Ingest,
		MaxPendingEvents: d.cfg.Publish.MaxPendingEvents, Logger: d.log, Metrics: pm, Tracer: d.tracer(),
		OnCommit: func(source string, s push.CommitStats) { m.Pushed(source, s.New, s.Duplicates, s.Bytes, s.Newest) }})
	d.stops.addFunc("push inbox", d.inbox.Close)
	srv, err := push.Start(push.ServerOptions{Push: d.cfg.Push, Sources: d.cfg.Sources, Inbox: d.inbox,
		Logger: d.log, Metrics: pm, Registry: d.reg, Limiters: d.limiters, OnRequest: m.PushRequest, Tracing: d.tracingProvider()})
	if err != nil {
		return err
	}
	d.pushSrv = srv
	// Shutdown answers push senders first, with its grace; this stop is
	// for a Start that fails later, and does nothing after Shutdown's.
	d.stops.add("push listener", func() error { return shutdownWithin(srv.Shutdown, 2*time.Second) })
	return nil
}

// shutdownWithin calls shutdown with a context that ends after d.
func shutdownWithin(shutdown func(context.Context) error, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return shutdown(ctx)
}

// PushAddr returns the address the push listener is bound to ("" if none).
func (d *Daemon) PushAddr() string {
	if d.pushSrv == nil {
		return ""
	}
	return d.pushSrv.Addr()
}

// HTTPAddr returns the address /metrics, /healthz and /readyz listen on
// ("" if none).
func (d *Daemon) HTTPAddr() string {
	if d.httpSrv == nil {
		return ""
	}
	return d.httpSrv.ln.Addr().String()
}

// AdminAddr returns the address the admin endpoints listen on: the admin
// listener's (a socket path for a Unix socket) or else HTTPAddr.
func (d *Daemon) AdminAddr() string {
	if d.adminSrv == nil {
		return d.HTTPAddr()
	}
	return d.adminSrv.ln.Addr().String()
}

// Registry returns the daemon's metrics registry.
func (d *Daemon) Registry() *prometheus.Registry { return d.reg }

// Queue returns the daemon's queue, for tests and benchmarks.
func (d *Daemon) Queue() *queue.Queue { return d.queue }

// rawPruner returns the raw store's retention, nil when [raw_store]
// retention is 0 (keep everything).
func (d *Daemon) rawPruner() *rawretention.Pruner {
	r := d.cfg.RawStore.Retention
	if r == 0 {
		return nil
	}
	st, ok := d.raw.(rawretention.Store)
	if !ok {
		d.log.Warn("raw_store.retention is set, but this raw store cannot list or delete: nothing is pruned", "store", d.raw.String())
		return nil
	}
	return rawretention.New(rawretention.Options{Store: st, Queue: d.queue, Retention: r, MinAge: config.MinRawRetention,
		Logger: d.log, Registerer: d.reg})
}

// prune forgets remembered events past the dedupe window every
// prune_interval (a switch of the ledger's generations, which forgets a
// window's events at once: queue.Prune), and deletes the dead letters
// inactive past their retention and the seq rows of devices silent past
// theirs. Beside it, raw (when not nil)
// deletes the raw payloads past [raw_store] retention that the queue
// does not need. It returns once both have stopped.
func (d *Daemon) prune(ctx context.Context, raw *rawretention.Pruner) {
	var running sync.WaitGroup
	defer running.Wait()
	if raw != nil {
		running.Go(func() { raw.Run(ctx) })
	}
	t := time.NewTicker(d.cfg.Publish.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := d.queue.Prune(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			d.log.Warn("prune queue", "err", err)
		case n > 0:
			d.log.Info("queue ledger: forgot a generation of remembered events", "events", n, "dedupe_window", d.cfg.Publish.DedupeWindow)
		}
		d.expireDeadLetters(ctx)
		d.forgetDevices(ctx)
	}
}

// forgetDevices deletes the seq tracking of the devices of each ws_ingress
// source that stored nothing for its device_retention (none when it is 0),
// looking at most every tenth of that retention.
func (d *Daemon) forgetDevices(ctx context.Context) {
	now := time.Now()
	for _, sc := range d.currentConfig().Sources {
		spec, ok := sc.Spec.(*sources.WSIngressSpec)
		keep := time.Duration(0)
		if ok {
			keep = spec.DeviceKeep()
		}
		if keep <= 0 || now.Before(d.devicesForgotten[sc.Name].Add(keep/10)) {
			continue
		}
		d.devicesForgotten[sc.Name] = now
		n, unreported, err := d.queue.ForgetDevices(ctx, sc.Name, now.Add(-keep))
		switch {
		case err != nil && ctx.Err() == nil:
			d.log.Warn("forget silent devices", "source", sc.Name, "err", err)
		case unreported > 0:
			d.log.Warn("devices: forgot the devices silent past their retention; they still missed seqs never reported lost",
				"source", sc.Name, "devices", n, "unreported_seqs", unreported, "device_retention", keep)
		case n > 0:
			d.log.Info("devices: forgot the devices silent past their retention", "source", sc.Name, "devices", n, "device_retention", keep)
		}
	}
}

// expireDeadLetters deletes the dead letters replayed or resolved more
// than [publish] dead_letter_retention ago (none when it is 0), looking at
// most every tenth of that retention.
func (d *Daemon) expireDeadLetters(ctx context.Context) {
	keep, now := d.cfg.Publish.DeadLetterRetention, time.Now()
	if keep <= 0 || now.Before(d.deadLettersExpired.Add(keep/10)) {
		return
	}
	d.deadLettersExpired = now
	n, err := d.queue.ExpireDeadLetters(ctx, now.Add(-keep))
	switch {
	case err != nil && ctx.Err() == nil:
		d.log.Warn("expire dead letters", "err", err)
	case n > 0:
		d.log.Info("dead letters: deleted the replayed and resolved ones past their retention", "deleted", n, "dead_letter_retention", keep)
	}
}

// Shutdown drains and stops the daemon: sources cancel a fetch in progress
// (its batch is not durable, so nothing is lost) and commit what they
// fetched before, in-flight frames get the rest of the grace period to
// be acked, then actors, sockets and the queue close. Whatever is not acked
// stays queued and is resent on the next start.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.ready.Store(false)
	// A reload in progress finishes first, and none starts after.
	d.reload.mu.Lock()
	d.reload.stopped = true
	d.reload.mu.Unlock()
	d.log.Info("draining", "grace", d.cfg.Daemon.ShutdownGrace)
	var errs []error
	// Push senders are answered first: the listener stops taking requests
	// and those in progress get their commit's answer.
	if d.pushSrv != nil {
		errs = append(errs, d.pushSrv.Shutdown(ctx))
	}
	if d.coord != nil {
		// Cluster mode: the member stays one (processors keep acking it)
		// while it drains; then its sources are handed over with their
		// settled cursors, and it leaves.
		d.coord.coord.Drain(ctx)
	}
	if err := d.pipeline.Drain(ctx); err != nil {
		errs = append(errs, err)
	}
	wait := time.NewTicker(20 * time.Millisecond)
	for d.sender.Delivering() && ctx.Err() == nil {
		select {
		case <-wait.C:
		case <-ctx.Done():
		}
	}
	wait.Stop()
	if n := d.sender.Inflight(); n > 0 {
		d.log.Warn("grace period over with frames unacked; they stay queued and are resent on the next start", "frames", n)
	}
	if d.coord != nil {
		lctx, cancel := context.WithTimeout(context.Background(), d.cfg.Cluster.LeaseTTL)
		errs = append(errs, d.coord.shutdown(lctx))
		cancel()
	}
	errs = append(errs, d.close())
	d.log.Info("stopped", "pending_events", d.pendingOnStop())
	return errors.Join(errs...)
}

func (d *Daemon) pendingOnStop() int64 {
	if d.queue == nil {
		return 0
	}
	return d.queue.PendingEvents()
}

// close stops whatever Start started, in reverse order (lifecycle.go).
func (d *Daemon) close() error {
	return d.stops.run()
}

// diskPaths are the directories whose file systems the daemon fills: the
// data dir (queue, WAL), a file raw store's directory and the spill dir.
func diskPaths(cfg *config.Config) []string {
	paths := []string{cfg.Daemon.DataDir}
	if dir, ok := strings.CutPrefix(cfg.RawStore.URL, "file://"); ok {
		paths = append(paths, dir)
	}
	if cfg.RawStore.SpillDir != "" {
		paths = append(paths, cfg.RawStore.SpillDir)
	}
	return paths
}
