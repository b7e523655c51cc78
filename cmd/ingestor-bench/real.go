package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/cpuprofile"
	"github.com/ingestorhq/ingestor/internal/telemetry/otlptest"
)

// modeReal runs the real path through the built binaries, each in its own
// process.
const modeReal = "real"

// realEventSize is the default -event-size of modes real and firehose.
const realEventSize = 500

// realResult is the summary of -mode real.
type realResult struct {
	// Events is the number of events of the full-load phase.
	Events       int64   `json:"events"`
	EventSize    int     `json:"event_size"`
	PageSize     int     `json:"page_size"`
	EventsPerSec float64 `json:"events_per_sec"`
	// CPU seconds per 1M events and peak RSS (VmHWM) of each process; CPU
	// over the full-load phase, RSS over the whole run.
	DaemonCPUPerMillion    float64 `json:"daemon_cpu_s_per_1m"`
	ProcessorCPUPerMillion float64 `json:"processor_cpu_s_per_1m"`
	DaemonPeakRSSMiB       float64 `json:"daemon_peak_rss_mib"`
	ProcessorPeakRSSMiB    float64 `json:"processor_peak_rss_mib"`
	// Fetch-to-ack percentiles, per frame, from the daemon's histogram.
	FullP50Ms float64 `json:"full_load_p50_ms"`
	FullP99Ms float64 `json:"full_load_p99_ms"`
	// HalfRate is the events/s the upstream was paced to for HalfEvents
	// more events: half of EventsPerSec.
	HalfRate   float64 `json:"half_load_events_per_sec"`
	HalfEvents int64   `json:"half_load_events"`
	HalfP50Ms  float64 `json:"half_load_p50_ms"`
	HalfP99Ms  float64 `json:"half_load_p99_ms"`
	// Queue (queue.db with its -wal and -shm) and raw store sizes at the
	// end of the full-load phase.
	QueueMiB float64 `json:"queue_mib"`
	RawMiB   float64 `json:"raw_mib"`
	// What the processor counted (-count-out) over the whole run.
	Received counts `json:"received"`
	// TraceRatio is the daemon's sampling ratio with -trace-ratio, -1 with
	// tracing off; Spans the spans its OTLP receiver got.
	TraceRatio float64 `json:"trace_ratio"`
	Spans      int     `json:"spans"`
	// The largest in-flight frames and frame cache the daemon's /metrics
	// showed over the run (sampled every -mode memory run's gaugeEvery, and
	// at every progress scrape).
	PeakInflightFrames float64 `json:"peak_inflight_frames"`
	PeakFrameCacheMiB  float64 `json:"peak_frame_cache_mib"`
}

// counts is what the processor's -count-out file holds (cmd/processor,
// keys.go).
type counts struct {
	Events       int64 `json:"events"`
	DistinctKeys int64 `json:"distinct_keys"`
	Redeliveries int64 `json:"redeliveries"`
}

// exactlyOnce reports whether the processor received every event of the
// run exactly once. The firehose serves only ev-1..ev-total, so total
// distinct keys means none is missing.
func (r *realResult) exactlyOnce() bool {
	total := r.Events + r.HalfEvents
	return r.Received.Events == total && r.Received.DistinctKeys == total
}

// realColumns are the columns of the summary table, each with its cell.
func (r *realResult) columns() [][2]string {
	once := fmt.Sprintf("yes: %d keys", r.Received.DistinctKeys)
	if !r.exactlyOnce() {
		once = fmt.Sprintf("NO: %d events, %d keys, want %d", r.Received.Events, r.Received.DistinctKeys, r.Events+r.HalfEvents)
	}
	return [][2]string{
		{"events", fmt.Sprint(r.Events)},
		{"events/s", fmt.Sprintf("%.0f", r.EventsPerSec)},
		{"daemon CPU-s/1M", fmt.Sprintf("%.2f", r.DaemonCPUPerMillion)},
		{"processor CPU-s/1M", fmt.Sprintf("%.2f", r.ProcessorCPUPerMillion)},
		{"daemon peak RSS MiB", fmt.Sprintf("%.1f", r.DaemonPeakRSSMiB)},
		{"processor peak RSS MiB", fmt.Sprintf("%.1f", r.ProcessorPeakRSSMiB)},
		{"full load p50/p99 ms", fmt.Sprintf("%.1f / %.1f", r.FullP50Ms, r.FullP99Ms)},
		{"half load events/s", fmt.Sprintf("%.0f", r.HalfRate)},
		{"half load p50/p99 ms", fmt.Sprintf("%.1f / %.1f", r.HalfP50Ms, r.HalfP99Ms)},
		{"queue MiB", fmt.Sprintf("%.1f", r.QueueMiB)},
		{"raw MiB", fmt.Sprintf("%.1f", r.RawMiB)},
		{"tracing", r.tracing()},
		{"exactly once", once},
	}
}

// tracing describes the run's tracing: off, or its ratio and spans.
func (r *realResult) tracing() string {
	if r.TraceRatio < 0 {
		return "off"
	}
	return fmt.Sprintf("%g sampled, %d spans", r.TraceRatio, r.Spans)
}

// printReal prints the summary table.
func printReal(w io.Writer, r *realResult) error {
	cols := r.columns()
	var head, sep, row strings.Builder
	for _, c := range cols {
		fmt.Fprintf(&head, "| %s ", c[0])
		sep.WriteString("|---")
		fmt.Fprintf(&row, "| %s ", c[1])
	}
	_, err := fmt.Fprintf(w, "ingestor-bench -mode real: %d events of ~%d B in pages of %d, then %d more at half load; "+
		"firehose -> bin/ingestor (http_poll, raw file:// fsynced, synchronous=full, frames of 100) -> bin/processor, each its own process\n%s|\n%s|\n%s|\n",
		r.Events, r.EventSize, r.PageSize, r.HalfEvents, head.String(), sep.String(), row.String())
	return err
}

// child is a process the real bench started.
type child struct {
	name string
	cmd  *exec.Cmd
	log  string // the file of its stderr
	done chan struct{}
	err  error // set before done is closed
}

// startChild starts cmd as the child name, its stderr into the file log.
// The child is killed if the bench dies.
func startChild(name string, cmd *exec.Cmd, log string) (*child, error) {
	c := &child{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	f, err := os.Create(log)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	// The child has its own descriptor of the log.
	if err := errors.Join(err, f.Close()); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// exited returns an error naming the child and ending with its log's tail
// if it has exited.
func (c *child) exited() error {
	select {
	case <-c.done:
		return fmt.Errorf("%s exited early (%v)%s", c.name, c.err, c.logTail())
	default:
		return nil
	}
}

// logTail returns the last lines of the child's log, for errors.
func (c *child) logTail() string {
	b, err := os.ReadFile(c.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return fmt.Sprintf("; the end of %s:\n%s", c.log, strings.Join(lines[max(0, len(lines)-15):], "\n"))
}

// stop sends SIGTERM and waits for the child to exit, killing it after
// grace.
func (c *child) stop(grace time.Duration) error {
	select {
	case <-c.done:
	default:
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("stop %s: %w", c.name, err)
		}
		select {
		case <-c.done:
		case <-time.After(grace):
			if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
				return fmt.Errorf("kill %s: %w", c.name, err)
			}
			<-c.done
			return fmt.Errorf("%s did not stop within %v after SIGTERM; killed%s", c.name, grace, c.logTail())
		}
	}
	if c.err != nil {
		return fmt.Errorf("%s: %w%s", c.name, c.err, c.logTail())
	}
	return nil
}

// binDir returns dir, or by default the directory of this executable:
// where the real mode finds bin/ingestor and bin/processor.
func binDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the binaries: %w", err)
	}
	return filepath.Dir(self), nil
}

// realBinaries returns the paths of bin/ingestor and bin/processor in dir,
// by default the directory of this executable.
func realBinaries(dir string) (ingestor, processor string, err error) {
	if dir, err = binDir(dir); err != nil {
		return "", "", err
	}
	ingestor, processor = filepath.Join(dir, "ingestor"), filepath.Join(dir, "processor")
	for _, p := range []string{ingestor, processor} {
		if _, err := os.Stat(p); err != nil {
			return "", "", fmt.Errorf("-mode real runs the built binaries: %w (run make build, or pass -bin DIR)", err)
		}
	}
	return ingestor, processor, nil
}

// installBinaries copies the daemon and the processor into dir and returns
// the copies' paths: the bench runs them as installed. The file the Go
// linker has just written is in the page cache as huge folios (it writes
// through a mapping), and the kernel then maps the executable's code in
// 2 MiB pieces, which adds 10-14 MiB of clean file pages to the daemon's
// RSS; a binary installed by a package, an image or cp is not (see
// docs/performance.md, "Memory"). Both builds of -mode compare are copied
// alike.
func installBinaries(dir string, bins ...string) (string, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("install binaries: %w", err)
	}
	out := make([]string, len(bins))
	for i, src := range bins {
		out[i] = filepath.Join(dir, filepath.Base(src))
		if err := copyExecutable(src, out[i]); err != nil {
			return "", "", fmt.Errorf("install binaries: %w", err)
		}
	}
	return out[0], out[1], nil
}

// copyExecutable copies src to a new executable file dst.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// daemonTOML returns the start of the config of every mode that runs
// bin/ingestor: [daemon] with its data under dir/data, JSON logs and an
// ephemeral http_addr, with daemonExtra; [raw_store] file:// under it,
// with rawExtra; and [publish] on ipc:// endpoints in dir, with
// publishExtra. Sections and sources follow.
func daemonTOML(dir, daemonExtra, rawExtra, publishExtra string) (string, error) {
	pub, ack := filepath.Join(dir, "pub.sock"), filepath.Join(dir, "ack.sock")
	if len(pub) > maxIPCPath {
		return "", fmt.Errorf("-dir %s is too long for ipc:// endpoints (%d bytes, at most %d): use a shorter path",
			dir, len(pub), maxIPCPath)
	}
	data := filepath.Join(dir, "data")
	return fmt.Sprintf(`[daemon]
data_dir = %s
http_addr = "127.0.0.1:0"
log_level = "info"
log_format = "json"
shutdown_grace = "60s"
%s

[raw_store]
url = %s
%s

[publish]
endpoint = %s
ack_endpoint = %s
%s

`, tomlString(data), daemonExtra, tomlString("file://"+filepath.Join(data, "raw")), rawExtra,
		tomlString("ipc://"+pub), tomlString("ipc://"+ack), publishExtra), nil
}

// writeConfig writes text as dir/ingestor.toml and checks that it loads.
func writeConfig(dir, text string) (string, error) {
	path := filepath.Join(dir, "ingestor.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("bench config: %w", err)
	}
	if _, err := config.Load(path); err != nil {
		return "", fmt.Errorf("bench config: %w", err)
	}
	return path, nil
}

// realPublishExtra is what the real mode adds to [publish]: -publish-extra,
// and with -dedupe-window that window and a prune interval of a third of
// it.
func realPublishExtra(o options) string {
	if o.dedupeWindow <= 0 {
		return o.publishExtra
	}
	return fmt.Sprintf("%s\ndedupe_window = %q\nprune_interval = %q\n", o.publishExtra, o.dedupeWindow.String(), (o.dedupeWindow / 3).String())
}

// realConfig writes the daemon's config into dir and checks it loads.
func realConfig(dir, firehose, publishExtra, sourceExtra, topExtra string) (string, error) {
	head, err := daemonTOML(dir, "", "", "events_per_frame = 100\nsynchronous = \"full\"\n"+publishExtra)
	if err != nil {
		return "", err
	}
	return writeConfig(dir, head+topExtra+fmt.Sprintf(`[source.firehose]
kind = "http_poll"
poll_url = %s
interval = "1ms"
jitter = "0%%"
timeout = "5m"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
time_field = "ts"
%s
`, tomlString(firehose+"/events"), sourceExtra))
}

// realRun is one -mode real run.
type realRun struct {
	o                   options
	dir                 string
	firehose            string // the firehose's base URL
	metrics             string // the daemon's /metrics URL
	fire, daemon, procs *child
	children            []*child // every child, for early-exit checks
	peaks               gaugePeaks
}

// benchReal runs -mode real in dir.
func benchReal(ctx context.Context, o options, dir string, stderr io.Writer) (res *realResult, err error) {
	ingestorBin, processorBin, err := realBinaries(o.bin)
	if err == nil {
		ingestorBin, processorBin, err = installBinaries(filepath.Join(dir, "bin"), ingestorBin, processorBin)
	}
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find ingestor-bench: %w", err)
	}
	r := &realRun{o: o, dir: dir}
	defer func() {
		// Normally already stopped; this covers an early return.
		for _, c := range r.children {
			if serr := c.stop(10 * time.Second); serr != nil && err == nil {
				fmt.Fprintln(stderr, "ingestor-bench:", serr)
			}
		}
	}()
	if err := r.startFirehose(self); err != nil {
		return nil, err
	}
	topExtra := ""
	if o.traceRatio >= 0 {
		// Tracing on, exporting to a receiver in this process that keeps
		// the spans: the bench measures what tracing costs the daemon.
		recv, stop, err := otlptest.Listen()
		if err != nil {
			return nil, fmt.Errorf("otlp receiver: %w", err)
		}
		defer func() {
			if res != nil {
				res.Spans = recv.Count()
			}
			stop()
		}()
		topExtra = fmt.Sprintf("[telemetry]\nendpoint = %q\nsampling_ratio = %v\n\n", recv.Endpoint(), o.traceRatio)
	}
	cfgPath, err := realConfig(dir, r.firehose, realPublishExtra(o), o.sourceExtra, topExtra)
	if err != nil {
		return nil, err
	}
	countOut := filepath.Join(dir, "processor-counts.json")
	if err := r.startRealChildren(ctx, ingestorBin, processorBin, cfgPath, countOut); err != nil {
		return nil, err
	}

	res = &realResult{Events: o.events, EventSize: o.eventSize, PageSize: o.pageSize, HalfEvents: o.halfEvents, TraceRatio: o.traceRatio}
	if err := r.measure(ctx, res); err != nil {
		return nil, err
	}
	// Stop the daemon while the processor still acks, so it drains; then
	// the processor, which writes its counts.
	if err := r.daemon.stop(2 * time.Minute); err != nil {
		return nil, err
	}
	if res.Received, err = stopProcessor(r.procs, countOut); err != nil {
		return nil, err
	}
	return res, nil
}

// startRealChildren starts bin/processor on the ipc endpoints in r.dir,
// writing its counts to countOut at exit, then the daemon on cfgPath, each
// profiled when -processor-cpuprofile or -cpuprofile asks, and waits for
// the daemon's HTTP address.
func (r *realRun) startRealChildren(ctx context.Context, ingestorBin, processorBin, cfgPath, countOut string) error {
	pub, ack := "ipc://"+filepath.Join(r.dir, "pub.sock"), "ipc://"+filepath.Join(r.dir, "ack.sock")
	pcmd := exec.Command(processorBin, "-connect", pub, "-ack", ack, "-count-out", countOut, "-log-every", "1h")
	if err := profileEnv(pcmd, "-processor-cpuprofile", r.o.processorCPUProfile, cpuprofile.ProcessorEnv); err != nil {
		return err
	}
	var err error
	if r.procs, err = startChild("processor", pcmd, filepath.Join(r.dir, "processor.log")); err != nil {
		return err
	}
	r.children = append(r.children, r.procs)
	dcmd := exec.Command(ingestorBin, "run", "-c", cfgPath)
	if err := profileEnv(dcmd, "-cpuprofile", r.o.cpuProfile, cpuprofile.DaemonEnv); err != nil {
		return err
	}
	if r.daemon, err = startChild("ingestor", dcmd, filepath.Join(r.dir, "ingestor.log")); err != nil {
		return err
	}
	r.children = append(r.children, r.daemon)
	addr, err := r.daemonAddr(ctx)
	if err != nil {
		return err
	}
	r.metrics = "http://" + addr + "/metrics"
	return nil
}

// profileEnv has cmd write a CPU profile to path (given as flag) through
// the environment variable env; an empty path leaves cmd as it is.
func profileEnv(cmd *exec.Cmd, flag, path, env string) error {
	if path == "" {
		return nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	cmd.Env = append(os.Environ(), env+"="+abs)
	return nil
}

// stopProcessor stops procs, a bin/processor, and reads the counts it
// wrote to countOut on exiting.
func stopProcessor(procs *child, countOut string) (counts, error) {
	var c counts
	if err := procs.stop(time.Minute); err != nil {
		return c, err
	}
	b, err := os.ReadFile(countOut)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil {
		return c, fmt.Errorf("the processor's counts: %w", err)
	}
	return c, nil
}

// startFirehose starts this executable in firehose mode and reads its URL.
func (r *realRun) startFirehose(self string) error {
	cmd := exec.Command(self, "-mode", modeFirehose, "-addr", "127.0.0.1:0",
		"-page-size", fmt.Sprint(r.o.pageSize), "-event-size", fmt.Sprint(r.o.eventSize))
	// The firehose exits when its stdin closes: when this process exits.
	if _, err := cmd.StdinPipe(); err != nil {
		return fmt.Errorf("start firehose: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("start firehose: %w", err)
	}
	if r.fire, err = startChild("firehose", cmd, filepath.Join(r.dir, "firehose.log")); err != nil {
		return err
	}
	r.children = append(r.children, r.fire)
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n') // an error leaves s incomplete, reported below
		line <- s
	}()
	select {
	case s := <-line:
		r.firehose, err = firehoseURL(s)
		if err != nil {
			return fmt.Errorf("%w%s", err, r.fire.logTail())
		}
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("firehose: no URL within 30s%s", r.fire.logTail())
	}
}

// daemonAddr waits for the daemon's "ingestor started" log line and
// returns the http_addr it bound.
func (r *realRun) daemonAddr(ctx context.Context) (string, error) {
	return childHTTPAddr(ctx, r.daemon)
}

// childHTTPAddr waits for the "ingestor started" line in the log of d, a
// daemon, and returns the http_addr it bound.
func childHTTPAddr(ctx context.Context, d *child) (string, error) {
	l, err := childStarted(ctx, d)
	return l.HTTP, err
}

// startedLine is the daemon's "ingestor started" log line: the addresses
// it bound.
type startedLine struct {
	Msg  string `json:"msg"`
	HTTP string `json:"http"`
	Push string `json:"push"`
}

// childStarted waits for the "ingestor started" line in the log of d, a
// daemon, and returns it.
func childStarted(ctx context.Context, d *child) (startedLine, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(d.log)
		if err != nil {
			return startedLine{}, fmt.Errorf("read the daemon's log: %w", err)
		}
		for line := range bytes.Lines(b) {
			var l startedLine
			if json.Unmarshal(line, &l) == nil && l.Msg == "ingestor started" && l.HTTP != "" {
				return l, nil
			}
		}
		if err := d.exited(); err != nil {
			return startedLine{}, err
		}
		if time.Now().After(deadline) {
			return startedLine{}, fmt.Errorf("the daemon did not start within a minute%s", d.logTail())
		}
		select {
		case <-ctx.Done():
			return startedLine{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// measure runs the two phases: N events as fast as they go, then
// HalfEvents more paced to half that rate.
func (r *realRun) measure(ctx context.Context, res *realResult) error {
	if err := r.waitProcessor(ctx); err != nil {
		return err
	}
	defer r.watchGauges(ctx, res)()
	ticks := clockTicks()
	d0, err := procCPUTicks(r.daemon.cmd.Process.Pid)
	if err != nil {
		return err
	}
	p0, err := procCPUTicks(r.procs.cmd.Process.Pid)
	if err != nil {
		return err
	}
	s0, err := scrapeMetrics(ctx, r.metrics)
	if err != nil {
		return err
	}
	if err := r.control(ctx, fmt.Sprintf("/release?n=%d", res.Events)); err != nil {
		return err
	}
	begin := time.Now()
	s1, end, err := r.waitAcked(ctx, "the full-load phase", s0, res.Events)
	if err != nil {
		return err
	}
	d1, err := procCPUTicks(r.daemon.cmd.Process.Pid)
	if err != nil {
		return err
	}
	p1, err := procCPUTicks(r.procs.cmd.Process.Pid)
	if err != nil {
		return err
	}
	wall := end.Sub(begin)
	res.EventsPerSec = round(float64(res.Events)/wall.Seconds(), 0)
	perMillion := 1e6 / float64(res.Events) / ticks
	res.DaemonCPUPerMillion = round((d1-d0)*perMillion, 2)
	res.ProcessorCPUPerMillion = round((p1-p0)*perMillion, 2)
	if res.FullP50Ms, res.FullP99Ms, err = percentilesMs(s0, s1); err != nil {
		return fmt.Errorf("the full-load phase: %w", err)
	}
	data := filepath.Join(r.dir, "data")
	q, err := filesBytes(filepath.Join(data, "queue.db"), filepath.Join(data, "queue.db-wal"), filepath.Join(data, "queue.db-shm"))
	if err != nil {
		return err
	}
	raw, err := dirBytes(filepath.Join(data, "raw"))
	if err != nil {
		return err
	}
	res.QueueMiB, res.RawMiB = round(float64(q)/(1<<20), 1), round(float64(raw)/(1<<20), 1)

	res.HalfRate = round(res.EventsPerSec/2, 0)
	if err := r.control(ctx, fmt.Sprintf("/pace?rate=%g&until=%d", res.HalfRate, res.Events+res.HalfEvents)); err != nil {
		return err
	}
	s2, _, err := r.waitAcked(ctx, "the half-load phase", s1, res.Events+res.HalfEvents)
	if err != nil {
		return err
	}
	if res.HalfP50Ms, res.HalfP99Ms, err = percentilesMs(s1, s2); err != nil {
		return fmt.Errorf("the half-load phase: %w", err)
	}
	if res.DaemonPeakRSSMiB, err = procPeakRSSMiB(r.daemon.cmd.Process.Pid); err != nil {
		return err
	}
	res.ProcessorPeakRSSMiB, err = procPeakRSSMiB(r.procs.cmd.Process.Pid)
	return err
}

// percentilesMs returns the fetch-to-ack p50 and p99 of the frames acked
// between two scrapes, in milliseconds.
func percentilesMs(before, after scrape) (p50, p99 float64, err error) {
	p50, p99 = quantile(0.50, before.buckets, after.buckets), quantile(0.99, before.buckets, after.buckets)
	if math.IsNaN(p50) || math.IsNaN(p99) {
		return 0, 0, errors.New("no frame acked, or the fetch-to-ack histogram changed shape")
	}
	return round(p50*1000, 1), round(p99*1000, 1), nil
}

// control posts a schedule change to the firehose.
func (r *realRun) control(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.firehose+path, nil)
	if err != nil {
		return fmt.Errorf("firehose %s: %w", path, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("firehose %s: %w", path, err)
	}
	body, err := io.ReadAll(resp.Body)
	err = errors.Join(err, resp.Body.Close())
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, body)
	}
	if err != nil {
		return fmt.Errorf("firehose %s: %w", path, err)
	}
	return nil
}

// waitProcessor waits until the processor's connection reached the
// daemon. The processor starts first, but its sockets find the daemon's
// only at their next reconnect (ZeroMQ's 100 ms): released before, the
// firehose's first pages wait in the frame cache for it, and at 300,000
// events/s that filled the cache (16 MiB) and the in-flight window, so
// the peak RSS measured a processor that lagged at start, not the run.
func (r *realRun) waitProcessor(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := scrapeMetrics(ctx, r.metrics)
		if err != nil {
			return err
		}
		if s.processors >= 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the processor did not connect within 30s; logs in %s", r.dir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitAcked waits until the daemon has queued want events and none is
// pending, and returns the scrape that saw it and when. It polls /metrics
// less often the further the end is, so that scraping costs the daemon
// little, and fails when nothing moves for stallLimit or a child exits.
func (r *realRun) waitAcked(ctx context.Context, what string, from scrape, want int64) (scrape, time.Time, error) {
	begin, last := time.Now(), from.events-from.pending
	lastAt := begin
	for {
		s, err := scrapeMetrics(ctx, r.metrics)
		now := time.Now()
		if err != nil {
			return scrape{}, now, fmt.Errorf("%s: %w", what, err)
		}
		r.peaks.note(s)
		if s.events >= float64(want) && s.pending == 0 {
			return s, now, nil
		}
		acked := s.events - s.pending
		if acked != last {
			last, lastAt = acked, now
		} else if now.Sub(lastAt) >= stallLimit {
			return scrape{}, now, fmt.Errorf("%s: no progress for %v: %.0f of %d events queued, %.0f pending; logs in %s",
				what, stallLimit, s.events, want, s.pending, r.dir)
		}
		for _, c := range r.children {
			if err := c.exited(); err != nil {
				return scrape{}, now, fmt.Errorf("%s: %w", what, err)
			}
		}
		wait := 10 * time.Millisecond
		if done := acked - (from.events - from.pending); done > 0 {
			left := time.Duration(float64(now.Sub(begin)) * (float64(want) - acked) / done)
			wait = min(max(left/4, wait), 500*time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return scrape{}, now, fmt.Errorf("%s: %w", what, context.Cause(ctx))
		case <-time.After(wait):
		}
	}
}
