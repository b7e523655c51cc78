package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ingestorhq/ingestor/internal/cpuprofile"
)

// Overload mode (-mode overload) checks that push overload degrades and
// never collapses (issue 26). A fresh daemon with one ws_ingress source
// ("devices") and one webhook source ("hooks"), a processor acking, runs
// two phases one after the other:
//
//   - unloaded: overloadUnloadedDevices devices (their windows together
//     hold half of the inbox's 4096 waiting slots, so nothing is refused)
//     and -clients webhook senders for -duration (default 6 s): the commit
//     rate the daemon sustains without overload, measured after the first
//     second;
//   - overload: -devices devices (200 or 1,000 in make bench) at once, each
//     sending -events envelopes (default 150) at up to 1000 a second with
//     up to 64 waiting for their answer (max_inflight), every second one a
//     duplicate of the one before and every tenth not JSON, and sending an
//     envelope answered "retry" again after its retry_after_ms; meanwhile
//     the same webhook senders post one event per request back to back,
//     sending a request answered 429 again after its Retry-After.
//
// Goodput is events answered stored (committed: new and duplicates) per
// second, by devices and webhooks together. It prints goodput over
// 5-second windows (1-second steps) with the refusals, the webhook p99
// (first POST to stored answer) and the devices' progress in each, and
// fails unless: goodput stays at or above 80% of the unloaded rate in
// every window until the last device finishes, every device finishes,
// no device or webhook sender waits over starveLimit for its next stored
// answer while the others progress, and the commits never stall (no
// stored answer for 2 s while requests wait for one).
//
// The daemon and the processor are the built binaries (bin/ingestor run,
// bin/processor -count-out; -bin DIR), each in its own process as in -mode
// real, and the processor must receive every event stored exactly once.
// The devices (real WebSocket clients) and the webhook senders (real HTTP
// clients) run in this process, over loopback. An in-process daemon, as
// in webhook mode, shared its Go scheduler with the devices' 2,000
// goroutines, whose runnable backlog held the group commit up for seconds
// when 1,000 devices started at once (a 2.4 s stall, a first window at
// 0-20% of the unloaded rate): a cost of the bench, not of the daemon.
// The CPU per event is the daemon's own (/proc/PID/stat), which shows what
// overload costs whatever share of the two cores other processes take.
const (
	modeOverload = "overload"
	// overloadEvents, overloadSenders and overloadUnloaded are the mode's
	// defaults of -events (envelopes per device), -clients (webhook
	// senders) and -duration (the unloaded phase), overloadDevices that
	// of -devices.
	overloadEvents   = 150
	overloadSenders  = 8
	overloadUnloaded = 6 * time.Second
	overloadDevices  = 200
	// overloadUnloadedDevices is the unloaded phase's devices: with
	// deviceWindow each they hold at most 2048 of the 4096 waiting slots.
	overloadUnloadedDevices = 32
	// goodputWindow, goodputStep and goodputTarget: goodput in every
	// window of goodputWindow (one every goodputStep) must be at least
	// goodputTarget of the unloaded rate.
	goodputWindow = 5 * time.Second
	goodputStep   = time.Second
	goodputTarget = 0.8
	// commitStall is the longest time without a stored answer while
	// requests wait for one; starveLimit the longest a device or webhook
	// sender may go without its next stored answer.
	commitStall = 2 * time.Second
	starveLimit = 10 * time.Second
)

// overloadFlags applies the mode's defaults and checks its flags.
func overloadFlags(o *options, set map[string]bool) []error {
	if o.mode != modeOverload {
		return nil
	}
	if !set["events"] {
		o.events = overloadEvents
	}
	if !set["clients"] {
		o.clients = overloadSenders
	}
	if !set["duration"] {
		o.duration = overloadUnloaded
	}
	// -devices is registered by soak mode, whose default differs.
	o.devices = overloadDevices
	if set["devices"] {
		o.devices = o.soak.devices
	}
	var errs []error
	if o.devices < 1 {
		errs = append(errs, fmt.Errorf("-devices must be at least 1, not %d", o.devices))
	}
	if o.duration < 2*time.Second {
		errs = append(errs, fmt.Errorf("-duration (the unloaded phase) must be at least 2s, not %v", o.duration))
	}
	return errs
}

// overloadConfig writes the daemon's config into dir, one ws_ingress and
// one webhook source on the push listener, and checks it loads.
func overloadConfig(o options, dir string) (string, error) {
	head, err := daemonTOML(dir, "", "", fmt.Sprintf("events_per_frame = %d\nsynchronous = %s\nmax_pending_events = 1000000000",
		o.eventsPerFrame, tomlString(o.synchronous)))
	if err != nil {
		return "", err
	}
	return writeConfig(dir, head+fmt.Sprintf(`[push]
addr = "127.0.0.1:0"

[source.devices]
kind = "ws_ingress"
max_inflight = %d

[source.hooks]
kind = "webhook"
id_field = "id"
`, deviceWindow))
}

// runOverload runs overload mode in dir and prints its result; it fails
// when a target is missed.
func runOverload(ctx context.Context, o options, dir string, stdout, stderr io.Writer) error {
	res, err := benchOverload(ctx, o, dir, stderr)
	if err != nil {
		return err
	}
	if err := printOverload(stdout, res, o.json); err != nil {
		return err
	}
	var missed []string
	for _, c := range res.Checks {
		if !c.OK {
			missed = append(missed, c.Name+": "+c.Detail)
		}
	}
	if len(missed) > 0 {
		return fmt.Errorf("overload targets missed:\n  %s", strings.Join(missed, "\n  "))
	}
	return nil
}

// overloadRun is one run of overload mode: the daemon's push URLs and the
// webhook senders' client.
type overloadRun struct {
	o              options
	daemon         *child
	wsURL, hookURL string
	client         *http.Client
	progress       io.Writer
}

// benchOverload starts the daemon and the processor, runs both phases,
// stops them and returns what the phases measured with the targets
// checked.
func benchOverload(ctx context.Context, o options, dir string, progress io.Writer) (res *overloadResult, err error) {
	ingestorBin, processorBin, err := realBinaries(o.bin)
	if err != nil {
		return nil, err
	}
	cfg, err := overloadConfig(o, dir)
	if err != nil {
		return nil, err
	}
	r := &overloadRun{o: o, progress: progress}
	var procs *child
	defer func() {
		// Normally already stopped; this covers an early return.
		for _, c := range []*child{r.daemon, procs} {
			if c != nil {
				if serr := c.stop(10 * time.Second); serr != nil && err == nil {
					fmt.Fprintln(progress, "ingestor-bench:", serr)
				}
			}
		}
	}()
	countOut := filepath.Join(dir, "processor-counts.json")
	pub, ack := "ipc://"+filepath.Join(dir, "pub.sock"), "ipc://"+filepath.Join(dir, "ack.sock")
	if procs, err = startChild("processor", exec.Command(processorBin, "-connect", pub, "-ack", ack,
		"-count-out", countOut, "-log-every", "1h"), filepath.Join(dir, "processor.log")); err != nil {
		return nil, err
	}
	dcmd := exec.Command(ingestorBin, "run", "-c", cfg)
	if err := profileEnv(dcmd, "-cpuprofile", o.cpuProfile, cpuprofile.DaemonEnv); err != nil {
		return nil, err
	}
	if r.daemon, err = startChild("ingestor", dcmd, filepath.Join(dir, "ingestor.log")); err != nil {
		return nil, err
	}
	started, err := childStarted(ctx, r.daemon)
	if err != nil {
		return nil, err
	}
	transport := &http.Transport{MaxIdleConnsPerHost: o.clients}
	defer transport.CloseIdleConnections()
	r.wsURL, r.hookURL = "ws://"+started.Push+"/ingest/devices/ws", "http://"+started.Push+"/ingest/hooks"
	r.client = &http.Client{Transport: transport, Timeout: time.Minute}
	res = &overloadResult{Mode: modeOverload, Devices: o.devices, EventsPerDevice: int(o.events), WebhookSenders: o.clients}
	if res.Unloaded, err = r.phase(ctx, phaseSpec{name: "unloaded", devices: overloadUnloadedDevices, duration: o.duration}); err != nil {
		return nil, err
	}
	if res.Overload, err = r.phase(ctx, phaseSpec{name: "overload", devices: o.devices, limit: int(o.events)}); err != nil {
		return nil, err
	}
	// Stop the daemon while the processor still acks, so it drains; then
	// the processor, which writes its counts.
	if err := r.daemon.stop(2 * time.Minute); err != nil {
		return nil, err
	}
	if res.Received, err = stopProcessor(procs, countOut); err != nil {
		return nil, err
	}
	res.check()
	return res, nil
}

// phaseSpec describes a phase: devices each sending limit envelopes, or
// sending until duration has passed when limit is 0, beside the webhook
// senders.
type phaseSpec struct {
	name     string
	devices  int
	limit    int
	duration time.Duration
}

// phaseRun is a phase in progress.
type phaseRun struct {
	spec    phaseSpec
	tl      *timeline
	devices []*device
	senders []*hookSender
	// stop ends an open-ended phase's new messages; stoppedAt is when.
	stop      chan struct{}
	stoppedAt time.Time
	// samples holds the devices' progress at each whole second.
	samples []progressSample
	// longestStall is the longest time without a stored answer while
	// requests waited for one.
	longestStall time.Duration
	// final is the devices' progress when the last one finished; cpu the
	// daemon's CPU time over the phase.
	final progressSample
	cpu   time.Duration
}

// progressSample is the devices' progress at one moment.
type progressSample struct {
	done                 int
	minStored, maxStored int64
}

// phase runs one phase and summarises it.
func (r *overloadRun) phase(ctx context.Context, spec phaseSpec) (*phaseResult, error) {
	fmt.Fprintf(r.progress, "ingestor-bench: %s phase: connecting %d devices\n", spec.name, spec.devices)
	p := &phaseRun{spec: spec, stop: make(chan struct{})}
	var err error
	if p.devices, err = r.dial(ctx, spec, p.stop); err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pid := r.daemon.cmd.Process.Pid
	t0, err := procCPUTicks(pid)
	if err != nil {
		for _, d := range p.devices {
			err = errors.Join(err, d.conn.CloseNow())
		}
		return nil, err
	}
	p.tl = newTimeline(time.Now())
	hookStop := make(chan struct{})
	var devs, hooks sync.WaitGroup
	for i := range r.o.clients {
		s := &hookSender{id: i, prefix: spec.name, url: r.hookURL, client: r.client, tl: p.tl, stop: hookStop}
		p.senders = append(p.senders, s)
		hooks.Go(func() { s.run(pctx) })
	}
	for _, d := range p.devices {
		d.tl = p.tl
		devs.Go(func() { d.run(pctx) })
	}
	all := make(chan struct{})
	go func() {
		devs.Wait()
		close(all)
	}()
	err = p.watch(pctx, all, r.daemon)
	t1, terr := procCPUTicks(pid)
	p.cpu = time.Duration((t1 - t0) / clockTicks() * float64(time.Second))
	err = errors.Join(err, terr)
	close(hookStop)
	if err != nil {
		cancel()
	}
	<-all
	hooks.Wait()
	for _, d := range p.devices {
		err = errors.Join(err, d.err, d.close())
	}
	for _, s := range p.senders {
		err = errors.Join(err, s.err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s phase: %w", spec.name, err)
	}
	return p.summary(), nil
}

// dial connects the phase's devices, 32 at a time.
func (r *overloadRun) dial(ctx context.Context, spec phaseSpec, stop <-chan struct{}) ([]*device, error) {
	devs := make([]*device, spec.devices)
	errs := make([]error, spec.devices)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range devs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			devs[i], errs[i] = dialDevice(ctx, r.wsURL, fmt.Sprintf("%s-dev%04d", spec.name, i), spec.limit, stop)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, d := range devs {
			if d != nil {
				err = errors.Join(err, d.conn.CloseNow())
			}
		}
		return nil, err
	}
	return devs, nil
}

// watch follows the phase until every device is done (all closed): it
// stops an open-ended phase's new messages after its duration, measures
// the longest commit stall, samples the devices' progress every second,
// and fails when nothing is stored for stallLimit, the phase outlasts the
// timeline or the daemon exits.
func (p *phaseRun) watch(ctx context.Context, all <-chan struct{}, daemon *child) error {
	tick := time.NewTicker(bucketWidth)
	defer tick.Stop()
	start := p.tl.start
	var last int64
	lastAt, progressAt := start, start
	for {
		var now time.Time
		select {
		case <-all:
			p.final = p.progress()
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		case now = <-tick.C:
		}
		if p.spec.limit == 0 && p.stoppedAt.IsZero() && now.Sub(start) >= p.spec.duration {
			p.stoppedAt = now
			close(p.stop)
		}
		n := p.tl.stored.Load()
		switch {
		case n != last:
			last, lastAt, progressAt = n, now, now
		case p.tl.inflight.Load() == 0:
			lastAt = now // nothing offered: every sender waits as told
		default:
			p.longestStall = max(p.longestStall, now.Sub(lastAt))
		}
		if now.Sub(progressAt) >= stallLimit {
			return fmt.Errorf("nothing stored for %v (%d stored so far, %d requests waiting)", stallLimit, n, p.tl.inflight.Load())
		}
		if now.Sub(start) >= maxPhase-time.Second {
			return fmt.Errorf("not done after %v", maxPhase)
		}
		if err := daemon.exited(); err != nil {
			return err
		}
		p.sample(now)
	}
}

// sample records the devices' progress for each whole second up to now.
func (p *phaseRun) sample(now time.Time) {
	sec := int(now.Sub(p.tl.start) / time.Second)
	if len(p.samples) > sec {
		return
	}
	s := p.progress()
	for len(p.samples) <= sec {
		p.samples = append(p.samples, s)
	}
}

// progress returns the devices' progress now.
func (p *phaseRun) progress() progressSample {
	s := progressSample{minStored: -1}
	for _, d := range p.devices {
		n := d.stored.Load()
		if s.minStored < 0 || n < s.minStored {
			s.minStored = n
		}
		s.maxStored = max(s.maxStored, n)
		select {
		case <-d.done:
			s.done++
		default:
		}
	}
	return s
}

// sampleAt returns the devices' progress at the first whole second at or
// after the bucket b, or when the last one finished if that was earlier.
func (p *phaseRun) sampleAt(b int) progressSample {
	sec := (b*int(bucketWidth) + int(time.Second) - 1) / int(time.Second)
	if sec >= len(p.samples) {
		return p.final
	}
	return p.samples[sec]
}

// percentile returns the p-th percentile (0 to 100) of sorted, or 0.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p/100*float64(len(sorted))))]
}
