package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/internal/backoff"
	"github.com/ingestorhq/ingestor/internal/sqliteuri"
)

// modeSoak runs every kind of source at once for -duration with short
// retentions and checks that nothing grows (soak.go).
const modeSoak = "soak"

// soakDuration is -duration's default in mode soak.
const soakDuration = 20 * time.Minute

// soakOptions are the flags of mode soak.
type soakOptions struct {
	sample time.Duration
	warmup time.Duration
	// rate is the firehose's events/s, streamRate the WebSocket feed's,
	// pushRate each webhook sender's and device's.
	rate, streamRate, pushRate float64
	senders, devices           int
	// retention is the raw store's retention; the dedupe window is a
	// third of it (soakDedupeWindow). processorRetention is the processor's (nothing is killed, so
	// nothing is redelivered after its ack): longer than a big page takes
	// to apply, so that each burst's keys are all remembered at once and
	// every burst costs the database the same. keepRaw sets the raw
	// store's to "0" (keep everything), to show that the check fails.
	retention          time.Duration
	processorRetention time.Duration
	keepRaw            bool
	// bigPage is the records of the one-page burst, refusedBody the size
	// of the body refused at max_body_bytes, both sent three times: in the
	// warm-up, in the first and in the last third of the measured span.
	bigPage     int
	refusedBody int64
	dropEvery   time.Duration
	chart       string
	// limit is the flatness bound: the last third's maximum over the
	// highest before it (warm-up and first third).
	limit float64
}

func soakFlags(fs *flag.FlagSet, o *soakOptions) {
	fs.DurationVar(&o.sample, "sample", 10*time.Second, "soak mode: interval between samples")
	fs.DurationVar(&o.warmup, "warmup", 0, "soak mode: samples before this are not checked (default: a quarter of -duration, at least 2 x -retention)")
	fs.Float64Var(&o.rate, "rate", 2000, "soak mode: events/s of the polled firehose (the WebSocket feed gets a tenth)")
	fs.Float64Var(&o.pushRate, "push-rate", 20, "soak mode: events/s of each webhook sender and each device")
	fs.IntVar(&o.senders, "senders", 4, "soak mode: webhook senders")
	fs.IntVar(&o.devices, "devices", 20, "soak mode: devices (ws_ingress), each at -push-rate; overload mode: devices at full speed (default 200 there)")
	fs.DurationVar(&o.retention, "retention", time.Minute, "soak mode: raw store retention (at least 1m); the dedupe window a third of it")
	fs.DurationVar(&o.processorRetention, "processor-retention", time.Minute, "soak mode: the processor's retention (processor -retention)")
	fs.BoolVar(&o.keepRaw, "keep-raw", false, `soak mode: raw store retention = "0" (keep everything): the raw series grows and the check fails`)
	fs.IntVar(&o.bigPage, "big-page", 1_000_000, "soak mode: records of the one big page, served three times (0: none)")
	fs.Int64Var(&o.refusedBody, "refused-body", 2<<30, "soak mode: bytes of the endless body refused at max_body_bytes, served three times (0: none)")
	fs.DurationVar(&o.dropEvery, "dlq-drop-every", 30*time.Second, "soak mode: how often `ingestor dlq drop -all` runs")
	fs.StringVar(&o.chart, "chart", "", "soak mode: write the series as an SVG chart to this file")
	fs.Float64Var(&o.limit, "flat-limit", 1.2, "soak mode: a series is flat when the maximum of the last third is at most this times the highest before it (warm-up and first third)")
}

// check validates o and fills in the defaults that depend on duration.
func (o *soakOptions) check(duration time.Duration) error {
	var errs []error
	if o.warmup == 0 {
		o.warmup = max(duration/4, 2*o.retention)
	}
	if o.retention < time.Minute {
		errs = append(errs, fmt.Errorf("-retention must be at least 1m (the raw store's minimum), not %v", o.retention))
	}
	if o.processorRetention <= 0 {
		errs = append(errs, fmt.Errorf("-processor-retention must be positive, not %v", o.processorRetention))
	}
	if o.sample <= 0 || o.rate <= 0 || o.pushRate <= 0 || o.limit < 1 {
		errs = append(errs, errors.New("-sample, -rate and -push-rate must be positive and -flat-limit at least 1"))
	}
	if span := duration - o.warmup; span < 6*o.sample {
		errs = append(errs, fmt.Errorf("-duration %v leaves %v after the warm-up of %v: at least 6 samples (-sample %v) are needed",
			duration, span, o.warmup, o.sample))
	}
	o.streamRate = o.rate / 10
	return errors.Join(errs...)
}

// soakDedupeWindow is the soak's dedupe_window for a raw retention of
// retention: a third of it. A key is remembered one to two windows (the
// ledger forgets a generation at a time) plus a prune interval, 45 s for
// a retention of 1m: less than the minute between two bursts of the short
// soak, so every burst's keys are forgotten before the next one comes and
// each burst costs the queue's file the same. With half of it (30 s, up
// to 65 s remembered) whether the last burst found the one before still
// there depended on timing: the file grew by a burst's keys in one run of
// three (12.2 to 16.6 MiB).
func soakDedupeWindow(retention time.Duration) time.Duration { return retention / 3 }

// soakDeviceRetention is the soak's device_retention for a raw retention
// of retention: a third of it, 20 s for a retention of 1m, shorter than a
// device id's life in the soak (deviceReconnectEvery envelopes, 25 s at
// the default -push-rate), so that at most two ids of each device are
// tracked at once while the ids it left are forgotten.
func soakDeviceRetention(retention time.Duration) time.Duration { return retention / 3 }

// soakConfig writes the daemon's config into dir and checks it loads.
func soakConfig(dir, upstream string, o soakOptions) (string, error) {
	rawRetention := o.retention.String()
	if o.keepRaw {
		rawRetention = "0"
	}
	// The admin endpoints (dlq drop) on a socket in dir: a fixed port
	// could be taken.
	head, err := daemonTOML(dir, "admin_addr = "+tomlString("unix:"+filepath.Join(dir, "admin.sock")), fmt.Sprintf("retention = %q", rawRetention),
		fmt.Sprintf("dedupe_window = %q\nprune_interval = \"5s\"", soakDedupeWindow(o.retention).String()))
	if err != nil {
		return "", err
	}
	poll := func(name, path, interval, extra string) string {
		return fmt.Sprintf("[source.%s]\nkind = \"http_poll\"\npoll_url = %s\ninterval = %q\nid_field = \"id\"\n%s\n\n",
			name, tomlString(upstream+path), interval, extra)
	}
	text := head + fmt.Sprintf(`[push]
addr = "127.0.0.1:0"

[source.hooks]
kind = "webhook"
id_field = "id"

[source.devices]
kind = "ws_ingress"
seq_gap_grace = "5s"
device_retention = %s

[source.stream]
kind = "websocket"
interval = "50ms"
url = %s
id_field = "id"
cursor_field = "seq"
time_field = "ts"

`, tomlString(soakDeviceRetention(o.retention).String()), tomlString("ws"+upstream[len("http"):]+"/stream?since={cursor}"))
	text += poll("firehose", "/events", "1ms", "cursor_field = \"seq\"\ncursor_param = \"since\"\ntime_field = \"ts\"\ntimeout = \"5m\"\njitter = \"0%\"")
	text += poll("quiet", "/quiet", "1s", "")
	text += poll("broken", "/broken", "1s", "malformed_retries = 0")
	text += poll("big", "/big", "1s", "")
	text += poll("huge", "/huge", "1s", "")
	return writeConfig(dir, text)
}

// soakRun is one -mode soak run.
type soakRun struct {
	o        options
	so       soakOptions
	dir, cfg string
	bin      string // bin/ingestor
	up       *soakUpstreams
	push     *soakPush
	daemon   *child
	procs    *child
	metrics  string
	procDB   string
	samples  []soakSample
	drops    int
}

// benchSoak runs -mode soak in dir.
func benchSoak(ctx context.Context, o options, dir string, stdout, stderr io.Writer) (res *soakResult, err error) {
	ingestorBin, processorBin, err := realBinaries(o.bin)
	if err != nil {
		return nil, err
	}
	r := &soakRun{o: o, so: o.soak, dir: dir, bin: ingestorBin, up: newSoakUpstreams(o.soak), procDB: filepath.Join(dir, "processor.db")}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("soak upstreams: %w", err)
	}
	srv := &http.Server{Handler: r.up, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	if r.cfg, err = soakConfig(dir, "http://"+ln.Addr().String(), r.so); err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range []*child{r.daemon, r.procs} {
			if c != nil {
				if serr := c.stop(10 * time.Second); serr != nil && err == nil {
					fmt.Fprintln(stderr, "ingestor-bench:", serr)
				}
			}
		}
	}()
	pub, ack := "ipc://"+filepath.Join(dir, "pub.sock"), "ipc://"+filepath.Join(dir, "ack.sock")
	if r.procs, err = startChild("processor", exec.Command(processorBin, "-connect", pub, "-ack", ack, "-sqlite", r.procDB,
		"-sqlite-count", "-retention", r.so.processorRetention.String(), "-log-every", "1h", "-log-format", "json", "-memprofile", filepath.Join(dir, "processor.heap")),
		filepath.Join(dir, "processor.log")); err != nil {
		return nil, err
	}
	if r.daemon, err = startChild("ingestor", exec.Command(ingestorBin, "run", "-c", r.cfg), filepath.Join(dir, "ingestor.log")); err != nil {
		return nil, err
	}
	started, err := childStarted(ctx, r.daemon)
	if err != nil {
		return nil, err
	}
	r.metrics = "http://" + started.HTTP + "/metrics"
	r.push = &soakPush{addr: started.Push}
	res, err = r.soak(ctx, stdout)
	if err != nil {
		return res, err
	}
	return res, r.finish(ctx, res)
}

// soak offers the load for -duration, sampling, then stops the load.
func (r *soakRun) soak(ctx context.Context, progress io.Writer) (*soakResult, error) {
	r.up.start(r.so.rate)
	loadCtx, stopLoad := context.WithCancel(ctx)
	waitPush := r.push.run(loadCtx, r.so.senders, r.so.devices, r.so.pushRate)
	begin := time.Now()
	span := r.o.duration - r.so.warmup
	// A burst in the warm-up takes the files (a WAL keeps its largest
	// size) to their high-water marks; then one in the first and one in
	// the last third of the measured span, to compare.
	bursts := []time.Duration{r.so.warmup / 2, r.so.warmup + span/6, r.o.duration - span/6}
	nextDrop := r.so.dropEvery
	var err error
	for at := time.Duration(0); at <= r.o.duration && err == nil; at = time.Since(begin) {
		if len(bursts) > 0 && at >= bursts[0] {
			bursts = bursts[1:]
			r.up.bigArmed.Store(r.so.bigPage > 0)
			r.up.hugeArmed.Store(r.so.refusedBody > 0)
		}
		if at >= nextDrop {
			nextDrop += r.so.dropEvery
			err = r.dropDeadLetters(ctx)
		}
		if err == nil && len(r.samples) <= int(at/r.so.sample) {
			err = r.sample(ctx, at, progress)
		}
		if err == nil {
			err = r.exited()
		}
		if err == nil && !backoff.Sleep(ctx, min(time.Second, r.so.sample/4)) {
			err = ctx.Err()
		}
	}
	stopLoad()
	firehose, stream := r.up.stopFeeds()
	err = errors.Join(err, waitPush())
	res := &soakResult{
		Samples: r.samples, Warmup: r.so.warmup, Limit: r.so.limit, KeepRaw: r.so.keepRaw,
		Sent: map[string]int64{
			"firehose": firehose, "stream": stream, "hooks": r.push.hooksStored.Load(), "devices": r.push.devicesStored.Load(),
			"big": r.up.bigServed.Load() * int64(r.so.bigPage),
		},
		Refusals: r.push.refusals.Load(), DLQDrops: r.drops, StreamConnections: r.up.stream.conns.Load(),
		Devices: r.so.devices,
	}
	return res, err
}

// exited reports a child that stopped on its own.
func (r *soakRun) exited() error {
	return errors.Join(r.daemon.exited(), r.procs.exited())
}

// dropDeadLetters runs `ingestor dlq drop -all -yes`, as an operator
// would, so that dead letters and the raw bytes they keep come and go.
func (r *soakRun) dropDeadLetters(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, r.bin, "dlq", "drop", "-all", "-yes", "-c", r.cfg).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ingestor dlq drop: %w: %s", err, out)
	}
	r.drops++
	return nil
}

// finish waits until the processor applied everything sent, stops the
// daemon (it drains) and the processor, and reads the final count.
func (r *soakRun) finish(ctx context.Context, res *soakResult) error {
	want := res.total()
	var last int64
	lastAt := time.Now()
	for {
		applied, err := appliedCount(ctx, r.procDB)
		if err != nil {
			return err
		}
		if applied >= want {
			break
		}
		if applied != last {
			last, lastAt = applied, time.Now()
		} else if time.Since(lastAt) > stallLimit {
			res.Applied, _ = appliedCounts(ctx, r.procDB) // for the report; the error below says what failed
			return fmt.Errorf("the processor applied %d of %d events and nothing more for %v; logs in %s", applied, want, stallLimit, r.dir)
		}
		if err := r.exited(); err != nil {
			return err
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	if err := r.readStatus(ctx, res); err != nil {
		return err
	}
	if err := r.daemon.stop(2 * time.Minute); err != nil {
		return err
	}
	if err := r.procs.stop(time.Minute); err != nil {
		return err
	}
	r.daemon, r.procs = nil, nil
	var err error
	res.Applied, err = appliedCounts(ctx, r.procDB)
	return err
}

// appliedCount returns the events the processor applied in all.
func appliedCount(ctx context.Context, path string) (int64, error) {
	counts, err := appliedCounts(ctx, path)
	var n int64
	for _, c := range counts {
		n += c
	}
	return n, err
}

// appliedCounts reads the processor's table applied (processor
// -sqlite-count): events applied per source.
func appliedCounts(ctx context.Context, path string) (map[string]int64, error) {
	dsn, err := sqliteuri.File(path, "mode=ro&_busy_timeout=10000")
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, err
	}
	defer func() { _ = db.Close() }()
	rows, err := db.QueryContext(ctx, `SELECT source, n FROM applied`)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer func() { _ = rows.Close() }()
	counts := map[string]int64{}
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		counts[s] = n
	}
	return counts, rows.Err()
}

// runSoak runs -mode soak, prints its report (or JSON) and the chart, and
// fails when the check does.
func runSoak(ctx context.Context, o options, dir string, stdout, stderr io.Writer) error {
	progress := stderr
	res, err := benchSoak(ctx, o, dir, progress, stderr)
	if res == nil {
		return err
	}
	checkErr := res.check()
	if err != nil {
		checkErr = err // the run did not finish: its figures are printed for the diagnosis
	}
	if o.soak.chart != "" {
		if err := writeSoakChart(o.soak.chart, res); err != nil {
			return errors.Join(checkErr, err)
		}
	}
	if o.json {
		if err := printJSONLine(stdout, res); err != nil {
			return err
		}
	} else if err := printSoak(stdout, res); err != nil {
		return err
	}
	return checkErr
}

// readStatus records from the daemon's /status the sources it reports
// late and the restarts of their actors: a quiet source is never late, and
// no actor crashed. "broken" is left out: none of its fetches succeeds (each
// page is malformed), so after 5 minutes it is late, rightly.
func (r *soakRun) readStatus(ctx context.Context, res *soakResult) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(r.metrics, "/metrics")+"/status", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var st struct {
		Sources []struct {
			Name     string `json:"name"`
			Late     bool   `json:"late"`
			Restarts int64  `json:"restarts"`
		} `json:"sources"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	for _, s := range st.Sources {
		if s.Late && s.Name != "broken" {
			res.Late = append(res.Late, s.Name)
		}
		res.Restarts += s.Restarts
	}
	return nil
}
