package daemon

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/ingestorhq/ingestor/actors"
	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/buildinfo"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/sources"
)

// Status is the answer of GET /status: every configured source and the
// pipeline's totals. docs/operations.md, "Status", documents each field.
type Status struct {
	// Time is when the status was taken.
	Time time.Time `json:"time"`
	// Version is the daemon's build: its module version, or the VCS
	// revision of a development build.
	Version  string         `json:"version"`
	Config   ConfigStatus   `json:"config"`
	Pipeline PipelineStatus `json:"pipeline"`
	Sources  []SourceStatus `json:"sources"`
}

// ConfigStatus is the config the daemon runs and how its last reload went.
type ConfigStatus struct {
	// File names the config: its paths (each -c, a file or a directory),
	// joined with ", "; "" for the embedded example.
	File string `json:"file"`
	// Files are the files read, in order: the paths with each directory
	// replaced by its *.toml files.
	Files []string `json:"files,omitempty"`
	// LastReloadSuccessful is false when the last reload was refused: the
	// daemon then runs on the config applied at LastReloadSuccessAt (the
	// last applied reload, or the start), and LastReloadError says why.
	LastReloadSuccessful bool      `json:"last_reload_successful"`
	LastReloadSuccessAt  time.Time `json:"last_reload_success_at"`
	LastReloadError      string    `json:"last_reload_error,omitempty"`
	// LastReloadAt is when the last reload was tried (absent: never).
	LastReloadAt *time.Time `json:"last_reload_at,omitempty"`
}

// PipelineStatus holds the totals of the queue and of delivery.
type PipelineStatus struct {
	PendingEvents    int64 `json:"pending_events"`
	PendingFrames    int64 `json:"pending_frames"`
	MaxPendingEvents int64 `json:"max_pending_events"`
	// InflightFrames are sent and not yet acked nor expired.
	InflightFrames int64 `json:"inflight_frames"`
	// OldestPendingAgeSeconds is the age of the oldest pending frame, 0
	// when nothing is pending.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	DeadLetters             int64   `json:"dead_letters"`
	// AcksPerSecond is the events acked or dead-lettered per second over
	// the last 10 seconds.
	AcksPerSecond float64 `json:"acks_per_second"`
	// ProcessorsConnected counts the processors' ack connections open now;
	// LastAck is when the last ack message arrived.
	ProcessorsConnected int64      `json:"processors_connected"`
	LastAck             *time.Time `json:"last_ack,omitempty"`
	RawStoreUp          bool       `json:"raw_store_up"`
	// Draining is true while the daemon stops.
	Draining bool `json:"draining"`
}

// SourceStatus is one source on the status page. Times are absent when
// they never happened.
type SourceStatus struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Enabled bool   `json:"enabled"`
	// State is polling, waiting, failing or stopped (polled sources), or
	// receiving, idle or stopped (push sources).
	State string `json:"state"`
	// Reason says what a waiting source waits for (interval, next_page,
	// retry_after, rate_limit, queue_full, disk_full, window, starting,
	// not_owner), why a failing one waits (backoff, restart) and why a
	// stopped one is (disabled, draining, elsewhere). Until is when the
	// wait ends; Detail what the upstream said (or which disk is low, or
	// the member a source is placed on).
	Reason string     `json:"reason,omitempty"`
	Until  *time.Time `json:"until,omitempty"`
	Detail string     `json:"detail,omitempty"`
	// Late is set for an enabled polled source whose last successful
	// fetch (one that found nothing new counts: a quiet source is healthy)
	// is older than 3 intervals (at least 5 minutes), as the
	// IngestorSourceStale alert says: its polls are failing or not
	// happening.
	Late bool `json:"late"`
	// LastError is the last failed fetch's error, kept after a recovery;
	// Failures is the current streak of failures.
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	Failures    int        `json:"failures,omitempty"`
	// IntervalSeconds is the configured interval of a polled source.
	IntervalSeconds float64    `json:"interval_seconds,omitempty"`
	LastPoll        *time.Time `json:"last_poll,omitempty"`
	// LastRequest is when a push source last got a request, answered or
	// refused (for ws_ingress, a handshake).
	LastRequest *time.Time `json:"last_request,omitempty"`
	LastSuccess *time.Time `json:"last_success,omitempty"`
	// LagSeconds is now minus the newest record time committed.
	LagSeconds *float64 `json:"lag_seconds,omitempty"`
	// Cursor is the cursor of the next fetch.
	Cursor            string `json:"cursor,omitempty"`
	RecordsLastMinute int64  `json:"records_last_minute"`
	BytesLastMinute   int64  `json:"bytes_last_minute"`
	// EventsPerSecond holds the new events committed in each of the last
	// 60 seconds, the oldest first.
	EventsPerSecond []int64    `json:"events_per_second"`
	PendingEvents   int64      `json:"pending_events"`
	DeadLetters     int64      `json:"dead_letters"`
	Restarts        int        `json:"restarts"`
	LastPanic       string     `json:"last_panic,omitempty"`
	LastPanicAt     *time.Time `json:"last_panic_at,omitempty"`
	// Devices sums up the seq numbers of a ws_ingress source's devices:
	// gaps (events lost before they reached the daemon), resets, and the
	// devices with either or with numbers still missing.
	Devices *queue.DeviceSeqs `json:"devices,omitempty"`
}

// maxNotableDevices caps the devices listed in a source's Devices.
const maxNotableDevices = 20

// staleAfter is the least time without a successful fetch that makes a
// polled source late.
const staleAfter = 5 * time.Minute

// late reports whether a polled source whose last fetch succeeded at
// lastSuccess is late at now: as IngestorSourceStale says, after 3
// intervals and at least staleAfter. A source that never had one is
// judged from since, when it started.
func late(interval time.Duration, lastSuccess, since, now time.Time) bool {
	if lastSuccess.IsZero() {
		lastSuccess = since
	}
	return now.Sub(lastSuccess) > max(3*interval, staleAfter)
}

// status gathers the daemon's status. The per-source counts of the queue
// are one grouped query over the pending frames and one over the active
// dead letters; a failure of it leaves them at 0 and is logged.
func (d *Daemon) status(ctx context.Context) Status {
	now := time.Now()
	cfg := d.currentConfig()
	p := PipelineStatus{
		PendingEvents:       d.queue.PendingEvents(),
		PendingFrames:       d.queue.PendingFrames(),
		MaxPendingEvents:    cfg.Publish.MaxPendingEvents,
		InflightFrames:      int64(d.sender.Inflight()),
		AcksPerSecond:       d.acksRate.perSecond(),
		ProcessorsConnected: d.acks.Connected(),
		LastAck:             timePtr(d.acks.LastAck()),
		RawStoreUp:          d.metrics.RawStoreUp(),
		Draining:            !d.ready.Load(),
	}
	if oldest, err := d.queue.OldestPending(ctx); err != nil {
		d.log.Warn("status: oldest pending frame", "err", err)
	} else if !oldest.IsZero() {
		p.OldestPendingAgeSeconds = now.Sub(oldest).Seconds()
	}
	counts, err := d.queue.CountsBySource(ctx)
	if err != nil {
		d.log.Warn("status: per-source counts", "err", err)
	}
	for _, c := range counts {
		p.DeadLetters += c.DeadLetters
	}
	st := Status{Time: now, Version: Version(), Config: d.reload.status(cfg), Pipeline: p,
		Sources: make([]SourceStatus, 0, len(cfg.Sources))}
	for _, src := range cfg.Sources {
		s := sourceStatus(src, d.metrics, d.started, now)
		if d.coord != nil {
			d.coord.placedStatus(src, &s)
		}
		s.PendingEvents, s.DeadLetters = counts[src.Name].PendingEvents, counts[src.Name].DeadLetters
		if _, ok := src.Spec.(*sources.WSIngressSpec); ok {
			if devs, err := d.queue.DeviceSeqs(ctx, src.Name, maxNotableDevices); err != nil {
				d.log.Warn("status: device seqs", "source", src.Name, "err", err)
			} else {
				s.Devices = &devs
			}
		}
		st.Sources = append(st.Sources, s)
	}
	return st
}

// sourceStatus is src's status at now from what its actor or the push
// inbox reported to m; since is when the daemon started, the start of a
// source's wait for a first success unless it started later.
func sourceStatus(src config.Source, m *actors.Metrics, since, now time.Time) SourceStatus {
	_, push := src.Spec.(sources.PushSpec)
	a, known := m.SourceStatus(src.Name)
	s := SourceStatus{
		Name: src.Name, Kind: src.Kind, Enabled: src.Enabled,
		State: a.State, Reason: a.Reason, Until: timePtr(a.Until), Detail: a.Detail,
		LastError: a.LastError, LastErrorAt: timePtr(a.LastErrorAt), Failures: a.Failures,
		LastPoll: timePtr(a.LastPoll), LastRequest: timePtr(a.LastRequest), LastSuccess: timePtr(a.LastSuccess), Cursor: a.Cursor,
		RecordsLastMinute: a.RecordsLastMinute, BytesLastMinute: a.BytesLastMinute, EventsPerSecond: a.EventsPerSecond,
		Restarts: a.Restarts, LastPanic: a.LastPanic, LastPanicAt: timePtr(a.LastPanicAt),
	}
	if s.EventsPerSecond == nil {
		s.EventsPerSecond = make([]int64, 60)
	}
	if !a.NewestRecord.IsZero() {
		lag := now.Sub(a.NewestRecord).Seconds()
		s.LagSeconds = &lag
	}
	if !push {
		s.IntervalSeconds = src.Interval.Seconds()
	}
	switch {
	case !src.Enabled:
		s.State, s.Reason, s.Until, s.Detail = actors.StateStopped, actors.ReasonDisabled, nil, ""
	case push:
		// A push source has no polls: it receives, or it is idle.
		s.State, s.Reason, s.Until, s.Detail = actors.StateIdle, "", nil, ""
		if !a.LastSuccess.IsZero() && now.Sub(a.LastSuccess) < time.Minute {
			s.State = actors.StateReceiving
		}
	case !known || s.State == "":
		s.State, s.Reason = actors.StateWaiting, actors.ReasonStarting
	default:
		if !a.Since.IsZero() {
			since = a.Since // a source added after the daemon started
		}
		s.Late = late(src.Interval, a.LastSuccess, since, now)
	}
	return s
}

// timePtr returns &t, or nil for the zero time (absent in JSON).
func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Version returns the binary's version and the commit it was built from,
// such as "devel 1a2b3c4d5e6f" (internal/buildinfo).
func Version() string {
	return buildinfo.Read().String()
}

// handleStatus serves GET /status.
func (d *Daemon) handleStatus(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	w.Header().Set("Cache-Control", "no-store")
	d.writeJSON(w, d.status(ctx))
}

// settleRate measures the queue's acks per second: it samples the
// settled-event count once a second and keeps the last ten seconds.
type settleRate struct {
	settled func() int64
	mu      sync.Mutex
	samples []settleSample // the oldest first
	stop    context.CancelFunc
	done    chan struct{}
}

type settleSample struct {
	at time.Time
	n  int64
}

// rateWindow is how far back acks per second are measured.
const rateWindow = 10 * time.Second

// startSettleRate starts sampling settled until Close.
func startSettleRate(settled func() int64) *settleRate {
	ctx, stop := context.WithCancel(context.Background())
	r := &settleRate{settled: settled, stop: stop, done: make(chan struct{})}
	r.sample(time.Now())
	go func() {
		defer close(r.done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				r.sample(now)
			}
		}
	}()
	return r
}

func (r *settleRate) sample(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, settleSample{at: now, n: r.settled()})
	i := 0
	for i < len(r.samples)-1 && now.Sub(r.samples[i].at) > rateWindow {
		i++
	}
	r.samples = r.samples[i:]
}

// perSecond returns the settled events per second from the oldest sample
// kept to now.
func (r *settleRate) perSecond() float64 {
	now, n := time.Now(), r.settled()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.samples) == 0 {
		return 0
	}
	first := r.samples[0]
	dt := now.Sub(first.at).Seconds()
	if dt < 0.5 {
		return 0
	}
	return float64(n-first.n) / dt
}

// Close stops the sampling.
func (r *settleRate) Close() {
	r.stop()
	<-r.done
}
