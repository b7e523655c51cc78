package actors

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ingestorhq/ingestor/sources"
)

// The states of a source on the status page (GET /status).
const (
	// StatePolling: a fetch is in progress.
	StatePolling = "polling"
	// StateWaiting: the next fetch waits for Reason until Until.
	StateWaiting = "waiting"
	// StateFailing: the last fetch failed (LastError); the next one goes
	// out at Until, after a backoff, or the source crashed and the
	// supervisor restarts it at Until.
	StateFailing = "failing"
	// StateStopped: the source does not run (disabled, or draining).
	StateStopped = "stopped"
	// StateReceiving: a push source committed events in the last minute.
	StateReceiving = "receiving"
	// StateIdle: a push source committed nothing in the last minute.
	StateIdle = "idle"
)

// The reasons of a waiting, failing or stopped source.
const (
	// ReasonStarting: the source reads its durable cursor.
	ReasonStarting = "starting"
	// ReasonInterval: the next poll is due after interval (with jitter).
	ReasonInterval = "interval"
	// ReasonNextPage: the next page goes out as soon as the window allows.
	ReasonNextPage = "next_page"
	// ReasonRetryAfter: the upstream answered Retry-After (kept across a
	// restart).
	ReasonRetryAfter = sources.WaitRetryAfter
	// ReasonRateLimit: the upstream's rate-limit headers, or the source's
	// rate limiter.
	ReasonRateLimit = sources.WaitRateLimit
	// ReasonBackoff: a failed or malformed fetch is retried after a capped
	// exponential backoff.
	ReasonBackoff = "backoff"
	// ReasonQueueFull: the queue holds publish.max_pending_events.
	ReasonQueueFull = "queue_full"
	// ReasonDiskFull: disk space is below daemon.min_free_bytes, or a
	// write failed for lack of space and space has not come back yet
	// (Detail says which).
	ReasonDiskFull = "disk_full"
	// ReasonWindow: inflight_batches fetched batches wait for the raw store
	// or the queue.
	ReasonWindow = "window"
	// ReasonRestart: the source crashed; the supervisor restarts it.
	ReasonRestart = "restart"
	// ReasonDraining: the daemon is stopping and the source drains.
	ReasonDraining = "draining"
	// ReasonDisabled: enabled = false.
	ReasonDisabled = "disabled"
	// ReasonElsewhere: cluster mode; the source is placed on another
	// member (Detail names it), or on none yet.
	ReasonElsewhere = "elsewhere"
	// ReasonNotOwner: cluster mode; this member's hold on the source
	// lapsed (its lease is not valid), so it does not poll until the
	// cluster decides where the source runs.
	ReasonNotOwner = "not_owner"
)

// statusWindow is how far back the per-second counts of a source reach.
const statusWindow = 60

// maxStatusText caps the error and panic texts a status keeps.
const maxStatusText = 1024

// SourceStatus is a snapshot of one source for the status page.
type SourceStatus struct {
	// State is one of the State constants, Reason one of the Reason
	// constants (empty while polling) and Until when the wait ends.
	State, Reason string
	Until         time.Time
	// Detail is what the upstream said about a wait, if anything.
	Detail string
	// LastError is the last failed fetch's error, at LastErrorAt; it stays
	// after the source recovers. Failures counts the current streak.
	LastError   string
	LastErrorAt time.Time
	Failures    int
	// LastPoll is when the last fetch began; LastSuccess when a fetch last
	// succeeded (found nothing new, or its batch committed) or a push group
	// last committed; NewestRecord the newest
	// record time committed; LastRequest when a push source last got a
	// request, answered or refused.
	LastPoll, LastSuccess, NewestRecord, LastRequest time.Time
	// Cursor is the cursor of the next fetch (it may be ahead of the
	// durable one while batches commit).
	Cursor string
	// Restarts counts the crashes of the source's actor; LastPanic is the
	// last one's reason, at LastPanicAt.
	Restarts    int
	LastPanic   string
	LastPanicAt time.Time
	// Since is when the source first reported, as its actor first
	// started: the start of its wait for a first success.
	Since time.Time
	// RecordsLastMinute and BytesLastMinute count the records and payload
	// bytes committed in the last minute, duplicates included.
	RecordsLastMinute, BytesLastMinute int64
	// EventsPerSecond holds the new events committed in each of the last
	// 60 seconds, the oldest first and the current second last.
	EventsPerSecond []int64
}

// sourceStatus is what a source reports of its state, under mu.
type sourceStatus struct {
	mu                     sync.Mutex
	st                     SourceStatus
	records, bytes, events secondRing
	// lastRequest is when a push source last got a request (unix nanos).
	lastRequest atomic.Int64
}

// secondRing counts per second over the last statusWindow seconds.
type secondRing struct {
	sec [statusWindow]int64 // the unix second each slot counts
	n   [statusWindow]int64
}

func (r *secondRing) add(now time.Time, n int64) {
	s := now.Unix()
	i := s % statusWindow
	if r.sec[i] != s {
		r.sec[i], r.n[i] = s, 0
	}
	r.n[i] += n
}

// series returns the counts of the statusWindow seconds up to now, the
// oldest first.
func (r *secondRing) series(now time.Time) []int64 {
	out := make([]int64, statusWindow)
	s := now.Unix()
	for k := range int64(statusWindow) {
		if i := (s - k) % statusWindow; r.sec[i] == s-k {
			out[statusWindow-1-k] = r.n[i]
		}
	}
	return out
}

func (r *secondRing) sum(now time.Time) int64 {
	var t int64
	for _, n := range r.series(now) {
		t += n
	}
	return t
}

// clip cuts s to maxStatusText bytes, dropping a rune cut in two.
func clip(s string) string {
	if len(s) <= maxStatusText {
		return s
	}
	return strings.ToValidUTF8(s[:maxStatusText], "") + "..."
}

func (s *sourceStatus) set(state, reason string, until time.Time, detail, cursor string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.State, s.st.Reason, s.st.Until, s.st.Detail, s.st.Cursor = state, reason, until, clip(detail), cursor
	if s.st.Since.IsZero() {
		s.st.Since = time.Now()
	}
	if state != StateFailing {
		s.st.Failures = 0
	}
}

func (s *sourceStatus) failed(reason string, until time.Time, err error, failures int, cursor string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.State, s.st.Reason, s.st.Until, s.st.Detail, s.st.Cursor = StateFailing, reason, until, "", cursor
	s.st.LastError, s.st.LastErrorAt, s.st.Failures = clip(err.Error()), time.Now(), failures
}

func (s *sourceStatus) polling(now time.Time, cursor string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.State, s.st.Reason, s.st.Until, s.st.Detail, s.st.Cursor, s.st.LastPoll = StatePolling, "", time.Time{}, "", cursor, now
}

func (s *sourceStatus) committed(now time.Time, records, events, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records.add(now, int64(records))
	s.events.add(now, int64(events))
	s.bytes.add(now, int64(bytes))
}

// source returns the status of the actor's source.
func (a *SourceActor) status() *sourceStatus {
	return &a.deps.Metrics.ages.state(a.cfg.Name).status
}

// wait shows the source waiting for reason and schedules its next poll
// after d. Detail is what the upstream said, if anything.
func (a *SourceActor) wait(ctx actor.Context, reason string, d time.Duration, detail string) {
	if a.drainer == nil {
		a.status().set(StateWaiting, reason, time.Now().Add(d), detail, a.cursor)
	}
	a.schedule(ctx, d)
}

// failing shows the source failing with err and schedules its next poll
// after d; a.failures is the streak so far.
func (a *SourceActor) failing(ctx actor.Context, err error, d time.Duration) {
	a.runPages = 0
	if a.drainer == nil {
		a.status().failed(ReasonBackoff, time.Now().Add(d), err, a.failures, a.cursor)
	}
	a.schedule(ctx, d)
}

// crashed records a crash of the actor named actorName (a source's is
// "source-NAME") and the restart after wait.
func (m *Metrics) crashed(actorName string, reason any, wait time.Duration) {
	name, ok := strings.CutPrefix(actorName, "source-")
	if !ok {
		return
	}
	s := &m.ages.state(name).status
	s.mu.Lock()
	defer s.mu.Unlock()
	now, why := time.Now(), clip(fmt.Sprint(reason))
	s.st.State, s.st.Reason, s.st.Until, s.st.Detail = StateFailing, ReasonRestart, now.Add(wait), ""
	s.st.LastError, s.st.LastErrorAt = "crashed: "+why, now
	s.st.Restarts++
	s.st.LastPanic, s.st.LastPanicAt = why, now
}

// SourceStatus returns the status of source name as its actor or the push
// inbox last reported it; ok is false when nothing was reported yet.
func (m *Metrics) SourceStatus(name string) (st SourceStatus, ok bool) {
	m.ages.mu.Lock()
	state, ok := m.ages.states[name]
	m.ages.mu.Unlock()
	if !ok {
		return st, false
	}
	now := time.Now()
	state.status.mu.Lock()
	st = state.status.st
	st.RecordsLastMinute = state.status.records.sum(now)
	st.BytesLastMinute = state.status.bytes.sum(now)
	st.EventsPerSecond = state.status.events.series(now)
	state.status.mu.Unlock()
	if t := state.lastSuccess.Load(); t != 0 {
		st.LastSuccess = time.Unix(0, t)
	}
	if t := state.newestRecord.Load(); t != 0 {
		st.NewestRecord = time.Unix(0, t)
	}
	if t := state.status.lastRequest.Load(); t != 0 {
		st.LastRequest = time.Unix(0, t)
	}
	return st, true
}

// PushRequest records a request to push source name (package internal/push
// calls it for each).
func (m *Metrics) PushRequest(name string) {
	m.ages.state(name).status.lastRequest.Store(time.Now().UnixNano())
}

// ForgetSource drops everything kept about source name: its status and
// its per-source metric series. Call it once the source is removed and
// its actor stopped (a source that comes back starts afresh).
func (m *Metrics) ForgetSource(name string) {
	m.ages.mu.Lock()
	delete(m.ages.states, name)
	m.ages.mu.Unlock()
	src := prometheus.Labels{"source": name}
	m.polls.DeletePartialMatch(src)
	for _, v := range []*prometheus.MetricVec{m.pollDuration.MetricVec, m.events.MetricVec, m.duplicates.MetricVec,
		m.bytes.MetricVec, m.malformed.MetricVec, m.lastSuccess.MetricVec, m.interval.MetricVec, m.paused.MetricVec} {
		v.Delete(src)
	}
	m.restarts.DeleteLabelValues("source-" + name)
}

// initPolled exports every counter of the polled source name at 0 before
// its first event, so that increase() and rate() see its first poll,
// malformed payload or restart (a series born at 1 counts as no
// increase), and alerts on them need no absent().
func (m *Metrics) initPolled(name string) {
	for _, result := range []string{"ok", "error", "malformed", "wait"} {
		m.polls.WithLabelValues(name, result)
	}
	for _, v := range []*prometheus.CounterVec{m.events, m.duplicates, m.bytes, m.malformed} {
		v.WithLabelValues(name)
	}
	m.paused.WithLabelValues(name)
	m.restarts.WithLabelValues("source-" + name)
}

// initPushed exports the counters a push source shares with polled ones
// (events, duplicates, bytes) at 0 before its first request, as
// initPolled does.
func (m *Metrics) initPushed(name string) {
	for _, v := range []*prometheus.CounterVec{m.events, m.duplicates, m.bytes} {
		v.WithLabelValues(name)
	}
}

// RawStoreUp reports whether the last raw-store write succeeded.
func (m *Metrics) RawStoreUp() bool {
	var v dto.Metric
	if err := m.rawStoreUp.Write(&v); err != nil {
		return false
	}
	return v.GetGauge().GetValue() == 1
}
