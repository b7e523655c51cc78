package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ingestorhq/ingestor/config"
)

// modeMemory runs -mode real once per setting of the source's
// inflight_batches and compares each run's peak RSS with the memory
// formula of docs/performance.md.
const modeMemory = "memory"

// defaultMemoryBatches is the default -memory-batches.
const defaultMemoryBatches = "2,4,8"

// memoryTolerance is how far a measured peak RSS may be from the
// prediction and still count as predicted: ±10%.
const memoryTolerance = 0.10

// memoryGaugeEvery is how often a memory run samples the daemon's
// in-flight frames and frame cache.
const memoryGaugeEvery = 50 * time.Millisecond

// memoryFlags parses -memory-batches and checks the flags of -mode memory.
func memoryFlags(o *options, set map[string]bool, batches string) []error {
	if o.mode != modeMemory {
		return nil
	}
	var errs []error
	for _, f := range strings.Split(batches, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 64 {
			errs = append(errs, fmt.Errorf("-memory-batches: %q is not an inflight_batches of 1 to 64", f))
			continue
		}
		o.memoryBatches = append(o.memoryBatches, n)
	}
	if strings.Contains(o.sourceExtra, "inflight_batches") {
		errs = append(errs, errors.New("-mode memory sets inflight_batches itself (-memory-batches): -source-extra must not"))
	}
	for _, f := range []string{"cpuprofile", "processor-cpuprofile", "json"} {
		if set[f] {
			errs = append(errs, fmt.Errorf("-%s is not supported by -mode memory: use -mode real", f))
		}
	}
	o.gaugeEvery = memoryGaugeEvery
	return errs
}

// memoryParams are the parameters of one run that the memory formula
// takes, read from the run's config and the firehose's pages.
type memoryParams struct {
	PageBytes         int64 // one page as the firehose serves it
	RecordsPerPage    int
	EventsPerFrame    int
	MaxInflightFrames int
	FrameCacheBytes   int64
	Sources           int
	InflightBatches   int
	// InflightFrames is F, the most frames in flight the run saw
	// (ingestor_publish_inflight_frames); 0: the whole window.
	InflightFrames float64
}

// eventBytes is the size of one record of a page.
func (p memoryParams) eventBytes() float64 { return float64(p.PageBytes) / float64(p.RecordsPerPage) }

// The constants of the memory formula of docs/performance.md, "Memory"
// (fitted to -mode memory runs at inflight_batches 1 to 16; see there).
const (
	memDaemonBaseMiB    = 64     // daemon RSS ~ 64 MiB at full speed
	memFrameBytes       = 1.2    // frames term: x ~1.2
	memPagesPerBatch    = 4.5    // page size x ~4.5
	memRecordsCap       = 20_000 // min(records per page, 20,000)
	memRecordBytes      = 1 << 10
	memProcessorBaseMiB = 29 // processor RSS ~ 29 MiB
)

// framesMiB is the frames term: F x events_per_frame x event size x ~1.2,
// F the frames in flight, at most max_inflight_frames.
func (p memoryParams) framesMiB() float64 {
	f := float64(p.MaxInflightFrames)
	if p.InflightFrames > 0 {
		f = min(f, p.InflightFrames)
	}
	return f * float64(p.EventsPerFrame) * p.eventBytes() * memFrameBytes / (1 << 20)
}

// predictDaemonMiB is the daemon's line of the formula in
// docs/performance.md ("Memory"), term by term:
//
//	daemon RSS    ~ 64 MiB
//	              + F x events_per_frame x event size x ~1.2, F the frames in flight (at most max_inflight_frames)
//	              + sources x inflight_batches x (page size x ~4.5
//	                                              + min(records per page, 20,000) x ~1 KiB)
//	              + max_body_bytes x ~3, only while a body of unknown length is read
//	              + up to 2 x frame_cache_bytes, only while a processor lags behind the in-flight window
//
// The last two are 0 here: the firehose's bodies have a Content-Length,
// and the processor keeps up (the frame cache then holds at most the
// frames of the last pages committed, which share those pages' bytes: the
// per-batch term).
func predictDaemonMiB(p memoryParams) float64 {
	base := float64(memDaemonBaseMiB)
	frames := p.framesMiB()
	perBatch := float64(p.PageBytes)*memPagesPerBatch + float64(min(p.RecordsPerPage, memRecordsCap))*memRecordBytes
	batches := float64(p.Sources*p.InflightBatches) * perBatch / (1 << 20)
	return base + frames + batches
}

// predictProcessorMiB is the processor's line of the formula, at its
// bound (the whole window in its receive buffer: a processor that lags):
//
//	processor RSS ~ 29 MiB + up to the same frames term
func predictProcessorMiB(p memoryParams) float64 {
	p.InflightFrames = 0 // the whole window
	return memProcessorBaseMiB + p.framesMiB()
}

// memoryRun is one run of -mode memory.
type memoryRun struct {
	p   memoryParams
	res *realResult
}

// runMemory runs -mode real once per -memory-batches setting, each in its
// own directory under dir, and prints the table.
func runMemory(ctx context.Context, o options, dir string, stdout, stderr io.Writer) error {
	if _, _, err := realBinaries(o.bin); err != nil {
		return err
	}
	pageBytes := firehosePageBytes(o.pageSize, o.eventSize)
	var runs []memoryRun
	for _, n := range o.memoryBatches {
		ro := o
		ro.sourceExtra = fmt.Sprintf("%s\ninflight_batches = %d\n", o.sourceExtra, n)
		runDir := filepath.Join(dir, fmt.Sprintf("inflight-%d", n))
		res, err := compareOnce(ctx, ro, build{"new", o.bin}, runDir, stderr)
		if err != nil {
			return fmt.Errorf("inflight_batches = %d: %w", n, err)
		}
		p, err := runParams(filepath.Join(runDir, "ingestor.toml"), pageBytes, o.pageSize)
		if err != nil {
			return err
		}
		p.InflightFrames = res.PeakInflightFrames
		fmt.Fprintf(stderr, "ingestor-bench: inflight_batches = %d: daemon %.1f MiB, predicted %.1f\n",
			n, res.DaemonPeakRSSMiB, predictDaemonMiB(p))
		runs = append(runs, memoryRun{p: p, res: res})
	}
	if err := printMemory(stdout, o, runs); err != nil {
		return err
	}
	var errs []error
	for _, r := range runs {
		if !r.res.exactlyOnce() {
			errs = append(errs, fmt.Errorf("exactly-once check failed with inflight_batches = %d: the processor received %d events with %d distinct keys, want %d of each",
				r.p.InflightBatches, r.res.Received.Events, r.res.Received.DistinctKeys, r.res.Events+r.res.HalfEvents))
		}
	}
	return errors.Join(errs...)
}

// firehosePageBytes returns the size of a full page the firehose serves.
func firehosePageBytes(pageSize, eventSize int) int64 {
	rec := httptest.NewRecorder()
	newFirehose(pageSize, eventSize).writePage(rec, 0, int64(pageSize), time.Now())
	return int64(rec.Body.Len())
}

// runParams reads the formula's parameters from a run's config.
func runParams(path string, pageBytes int64, recordsPerPage int) (memoryParams, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return memoryParams{}, fmt.Errorf("the run's config: %w", err)
	}
	if len(cfg.Sources) != 1 {
		return memoryParams{}, fmt.Errorf("the run's config has %d sources, want 1", len(cfg.Sources))
	}
	return memoryParams{
		PageBytes:         pageBytes,
		RecordsPerPage:    recordsPerPage,
		EventsPerFrame:    cfg.Publish.EventsPerFrame,
		MaxInflightFrames: cfg.Publish.MaxInflightFrames,
		FrameCacheBytes:   cfg.Publish.FrameCacheBytes,
		Sources:           len(cfg.Sources),
		InflightBatches:   cfg.Sources[0].InflightBatches,
	}, nil
}

// memoryCells returns a prediction, the measurement, their ratio and
// whether it is within memoryTolerance.
func memoryCells(predicted, measured float64) string {
	ratio := measured / predicted
	within := "yes"
	if ratio < 1-memoryTolerance || ratio > 1+memoryTolerance {
		within = "NO"
	}
	return fmt.Sprintf(" %.1f | %.1f | %.2f | %s |", predicted, measured, ratio, within)
}

// printMemory prints a row per run.
func printMemory(w io.Writer, o options, runs []memoryRun) error {
	var b strings.Builder
	fmt.Fprintf(&b, "ingestor-bench -mode memory: -mode real per inflight_batches, %d events of ~%d B in pages of %d, then %d more at half load; "+
		"predicted: the formula of docs/performance.md (Memory); measured: peak RSS (VmHWM)\n",
		o.events, o.eventSize, o.pageSize, o.halfEvents)
	b.WriteString("| inflight_batches | daemon predicted MiB | daemon measured MiB | daemon measured/predicted | daemon within ±10% |" +
		" processor predicted MiB | processor measured MiB | processor measured/predicted | processor within ±10% |" +
		" peak in-flight frames | peak frame cache MiB | events/s | exactly once |\n")
	b.WriteString("|" + strings.Repeat("---|", 13) + "\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %d |", r.p.InflightBatches)
		b.WriteString(memoryCells(predictDaemonMiB(r.p), r.res.DaemonPeakRSSMiB))
		b.WriteString(memoryCells(predictProcessorMiB(r.p), r.res.ProcessorPeakRSSMiB))
		cols := r.res.columns()
		fmt.Fprintf(&b, " %.0f of %d | %.1f | %.0f | %s |\n", r.res.PeakInflightFrames, r.p.MaxInflightFrames,
			r.res.PeakFrameCacheMiB, r.res.EventsPerSec, cols[len(cols)-1][1])
	}
	if len(runs) > 0 {
		p := runs[0].p
		fmt.Fprintf(&b, "\npage %d B (%d records of %.0f B), events_per_frame %d, max_inflight_frames %d, frame_cache_bytes %d, sources %d\n",
			p.PageBytes, p.RecordsPerPage, p.eventBytes(), p.EventsPerFrame, p.MaxInflightFrames, p.FrameCacheBytes, p.Sources)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// gaugePeaks keeps the largest in-flight frames and frame cache a real
// run's scrapes saw.
type gaugePeaks struct {
	mu              sync.Mutex
	inflight, cache float64
}

// note records the gauges of s.
func (g *gaugePeaks) note(s scrape) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight, g.cache = max(g.inflight, s.inflightFrames), max(g.cache, s.frameCacheBytes)
}

// watchGauges scrapes the daemon every r.o.gaugeEvery, when it is set,
// until the function it returns is called; that function writes the peaks
// into res.
func (r *realRun) watchGauges(ctx context.Context, res *realResult) func() {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if r.o.gaugeEvery > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(r.o.gaugeEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if s, err := scrapeMetrics(ctx, r.metrics); err == nil {
					r.peaks.note(s)
				}
			}
		}()
	}
	return func() {
		cancel()
		wg.Wait()
		r.peaks.mu.Lock()
		defer r.peaks.mu.Unlock()
		res.PeakInflightFrames, res.PeakFrameCacheMiB = r.peaks.inflight, round(r.peaks.cache/(1<<20), 1)
	}
}
