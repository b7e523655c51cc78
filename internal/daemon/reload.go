package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/sources"
)

// defaultWatchInterval is how often watch_config reads the config file.
const defaultWatchInterval = 2 * time.Second

// ErrNoConfigFile is Reload's error for a daemon started on the embedded
// example config.
var ErrNoConfigFile = errors.New("the daemon runs on the embedded example config: there is no config file to reload (start it with -c FILE)")

// ReloadResult is what a reload did, or would do for a dry run.
type ReloadResult struct {
	// File names the config read: its paths (each -c, a file or a
	// directory read anew), joined with ", ".
	File string `json:"file"`
	// Paths are the paths read.
	Paths []string `json:"paths"`
	// Applied is false for a dry run.
	Applied bool `json:"applied"`
	config.Plan
}

// reloader serializes reloads with each other and with Shutdown, and
// keeps the reload metrics.
type reloader struct {
	mu       sync.Mutex
	stopped  bool // Shutdown began: no reload may start
	ok       prometheus.Gauge
	okAt     prometheus.Gauge
	attempts *prometheus.CounterVec

	stateMu sync.Mutex // guards last, read by /status during a reload
	last    ConfigStatus
}

// status returns the reload state of the running config cfg.
func (r *reloader) status(cfg *config.Config) ConfigStatus {
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	st := r.last
	st.File, st.Files = cfg.Name(), cfg.Files
	return st
}

// record notes the outcome of a reload tried at now (err nil: applied).
func (r *reloader) record(now time.Time, err error) {
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	r.last.LastReloadAt = &now
	r.last.LastReloadSuccessful = err == nil
	r.last.LastReloadError = ""
	if err != nil {
		r.last.LastReloadError = err.Error()
		r.ok.Set(0)
		r.attempts.WithLabelValues("refused").Inc()
		return
	}
	r.last.LastReloadSuccessAt = now
	r.ok.Set(1)
	r.okAt.Set(float64(now.UnixNano()) / 1e9)
	r.attempts.WithLabelValues("applied").Inc()
}

func newReloader(reg prometheus.Registerer) *reloader {
	r := &reloader{
		ok: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_config_last_reload_successful",
			Help: "1 if the last config reload (SIGHUP, POST /-/reload or watch_config) was applied, 0 if it was refused; 1 at start."}),
		okAt: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ingestor_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last config applied: the last successful reload, or the start."}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_config_reloads_total",
			Help: "Config reloads by result: applied, or refused (invalid file, or a setting that cannot change while the daemon runs)."},
			[]string{"result"}),
	}
	reg.MustRegister(r.ok, r.okAt, r.attempts)
	now := time.Now()
	r.last = ConfigStatus{LastReloadSuccessful: true, LastReloadSuccessAt: now}
	r.ok.Set(1)
	r.okAt.Set(float64(now.UnixNano()) / 1e9)
	r.attempts.WithLabelValues("applied")
	r.attempts.WithLabelValues("refused")
	return r
}

// ErrStopping is returned by a Reload asked for while the daemon stops.
var ErrStopping = errors.New("the daemon is stopping")

// Reload reads the daemon's config file again and applies it: sources
// added start, sources removed drain and stop, sources whose settings
// changed drain and start again from their durable cursor, and the others
// keep running untouched (see config.Plan). An invalid file, or one that
// changes a setting that cannot change while the daemon runs, is refused
// as a whole: the running config stays, the problems are logged with
// file:line and returned (as config.Errors), and
// ingestor_config_last_reload_successful drops to 0. With dryRun, Reload
// only says what it would do.
//
// Reload logs every outcome but two, which it only returns: ErrStopping
// and ErrNoConfigFile.
func (d *Daemon) Reload(ctx context.Context, dryRun bool) (ReloadResult, error) {
	r := d.reload
	r.mu.Lock()
	defer r.mu.Unlock()
	old := d.currentConfig()
	res := ReloadResult{File: old.Name(), Paths: old.Paths}
	if r.stopped {
		return res, ErrStopping
	}
	if len(old.Paths) == 0 {
		return res, ErrNoConfigFile
	}
	next, plan, err := config.LoadChange(old, old.Paths)
	if err == nil && !dryRun {
		err = d.apply(ctx, old, next, plan)
	}
	if err != nil && dryRun {
		return res, err
	}
	if err != nil {
		r.record(time.Now(), err)
		var errs config.Errors
		if errors.As(err, &errs) {
			for _, e := range errs {
				d.log.Error("config reload refused; the running config stays", "problem", e.Error())
			}
		} else {
			d.log.Error("config reload refused; the running config stays", "file", old.Name(), "err", err)
		}
		return res, err
	}
	res.Plan = plan
	if dryRun {
		return res, nil
	}
	res.Applied = true
	r.record(time.Now(), nil)
	d.log.Info("config reloaded", "file", old.Name(), "start", plan.Start, "stop", plan.Stop, "restart", plan.Restart, "stay", len(plan.Stay))
	return res, nil
}

// apply changes the running daemon from old to next as plan says: the
// push routes first, whose handlers are built before anything changes
// (a handler that cannot be built refuses the whole reload), then the
// polled sources.
func (d *Daemon) apply(ctx context.Context, old, next *config.Config, plan config.Plan) error {
	limiters := keepLimiters(old, next, d.limiters)
	if d.pushSrv != nil {
		if err := d.pushSrv.Apply(plan, next.Sources, limiters); err != nil {
			return err
		}
	}
	if d.coord != nil {
		if err := d.coord.reload(ctx, plan, next, limiters); err != nil {
			return fmt.Errorf("applying the reload: %w", err)
		}
		return nil
	}
	if err := d.pipeline.Apply(ctx, plan, next.Sources, limiters); err != nil {
		// Push routes and some sources may have changed already: the new
		// config is the closest description of what runs.
		d.cfgNow.Store(next)
		d.limiters = limiters
		return fmt.Errorf("applying the reload: %w", err)
	}
	d.cfgNow.Store(next)
	d.limiters = limiters
	return nil
}

// keepLimiters builds next's shared limiters, keeping the bucket of each
// one whose definition did not change, so that the sources naming it keep
// their pace across the reload.
func keepLimiters(old, next *config.Config, prev *sources.RateLimiters) *sources.RateLimiters {
	l := next.Limiters()
	for _, rl := range next.RateLimiters {
		for _, o := range old.RateLimiters {
			if o.Name == rl.Name && o.Rate == rl.Rate && o.Burst == rl.Burst && prev.Get(rl.Name) != nil {
				l.Share(rl.Name, prev)
			}
		}
	}
	return l
}

// currentConfig is the config the daemon runs: the one it started with,
// or the last one a reload applied. Only its sources, defaults and rate
// limiters can differ from the start's.
func (d *Daemon) currentConfig() *config.Config { return d.cfgNow.Load() }

// watchConfig reloads the config whenever its contents change
// (daemon.watch_config), reading its files every interval (a directory
// listed anew, so a file added or removed counts): a file replaced
// through a symlink, as a Kubernetes ConfigMap volume is, counts too. New
// contents are compared with the running config first (a dry run), so an
// edit that changes nothing the daemon runs (a comment) applies nothing,
// and a change made between loading the config and starting the watch is
// not missed. An edit that is refused is not tried again until the
// contents change again.
func (d *Daemon) watchConfig(ctx context.Context, interval time.Duration) {
	paths, name := d.cfg.Paths, d.cfg.Name()
	var last [32]byte // none yet: the first read is compared with the running config
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now, err := config.Fingerprint(paths)
		if err != nil {
			// A ConfigMap update swaps a symlink: a read may fall between.
			d.log.Debug("watch_config: cannot read the config", "file", name, "err", err)
			continue
		}
		if now == last {
			continue
		}
		last = now
		rctx, cancel := context.WithTimeout(ctx, d.cfg.Daemon.ShutdownGrace)
		if res, err := d.Reload(rctx, true); err != nil || res.Changes() {
			d.log.Info("config file changed; reloading", "file", name)
			// Reload logs its outcome; while the daemon stops there is
			// nothing more to watch.
			if _, err := d.Reload(rctx, false); errors.Is(err, ErrStopping) {
				cancel()
				return
			}
		}
		cancel()
	}
}

// registerReload adds POST /-/reload to mux through handle, which puts it
// behind the admin guard. ?dry_run=1 only says what a reload would do.
func (d *Daemon) registerReload(handle func(pattern string, h http.HandlerFunc)) {
	handle("POST /-/reload", func(w http.ResponseWriter, r *http.Request) {
		dry, _ := strconv.ParseBool(r.URL.Query().Get("dry_run"))
		// The reload goes on if the client goes away: stopping it halfway
		// would leave some sources drained and not started again.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), d.cfg.Daemon.ShutdownGrace)
		defer cancel()
		res, err := d.Reload(ctx, dry)
		var errs config.Errors
		switch {
		case errors.As(err, &errs):
			d.writeError(w, http.StatusUnprocessableEntity, fmt.Errorf("config reload refused; the running config stays:\n%w", err))
		case errors.Is(err, ErrNoConfigFile):
			d.writeError(w, http.StatusConflict, err)
		case err != nil:
			d.writeError(w, http.StatusInternalServerError, err)
		default:
			d.writeJSON(w, res)
		}
	})
}
