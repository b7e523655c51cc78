package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"
)

// result is what a run measured. Its JSON form is the -json output.
type result struct {
	Mode           string `json:"mode"`
	Target         int64  `json:"target_events"`
	Sources        int    `json:"sources"`
	EventsPerTick  int    `json:"events_per_tick"`
	EventSize      int    `json:"event_size"`
	Processors     int    `json:"processors"`
	Synchronous    string `json:"synchronous"`
	EventsPerFrame int    `json:"events_per_frame"`
	// Capped is true when -duration ended the run before Target was acked.
	Capped bool `json:"capped"`

	// Acked counts events acked (the sum of the daemon's OnAck calls) by
	// the end of the measurement: when Target was reached, or the cap.
	Acked int64 `json:"events_acked"`
	// WallSeconds runs from the processors' start to the last needed ack.
	WallSeconds  float64 `json:"wall_seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// Latency is fetch-to-ack, in milliseconds, weighted by events: each
	// acked frame counts once per event it carried.
	Latency latencyMs `json:"fetch_to_ack_ms"`
	// CPU is the whole process's, from before the daemon started to the
	// last needed ack, so it includes the in-process processors.
	CPUUserSeconds       float64 `json:"cpu_user_seconds"`
	CPUSysSeconds        float64 `json:"cpu_sys_seconds"`
	CPUSeconds           float64 `json:"cpu_seconds"`
	CPUSecondsPerMillion float64 `json:"cpu_seconds_per_million_events"`
	PeakRSSMiB           float64 `json:"peak_rss_mib"`
	// PendingAtEnd is the queue's pending events after shutdown: what the
	// sources fetched beyond the target and no processor acked yet.
	// Received counts what the processors got, shutdown included.
	PendingAtEnd int64           `json:"queue_pending_at_end"`
	Received     processorTotals `json:"processors_received"`
	// Backlog is set in processor-down mode.
	Backlog *backlogResult `json:"backlog,omitempty"`
}

type latencyMs struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// processorTotals sum the in-process processors' counters.
type processorTotals struct {
	Events       int64 `json:"events"`
	Frames       int64 `json:"frames"`
	Redeliveries int64 `json:"redelivered_frames"`
	Bytes        int64 `json:"bytes"`
}

// backlogResult is the processor-down measurement.
type backlogResult struct {
	// Events were pending in the queue when the processors started.
	Events int64 `json:"events"`
	// FillSeconds is how long queueing them took, from the daemon's start.
	FillSeconds float64 `json:"fill_seconds"`
	// RSSQueuedMiB is the RSS with the backlog queued and no processor.
	RSSQueuedMiB float64 `json:"rss_queued_mib"`
	// DrainSeconds runs from the processors' start until as many events
	// fetched before it as were pending then had been acked; the sources
	// keep fetching meanwhile.
	DrainSeconds      float64 `json:"drain_seconds"`
	DrainEventsPerSec float64 `json:"drain_events_per_sec"`
	// RSSDrainedMiB is the RSS when the backlog had drained.
	RSSDrainedMiB float64 `json:"rss_drained_mib"`
	// CPUSecondsAtDrain is the process's CPU time from its start to the drain.
	CPUSecondsAtDrain float64 `json:"cpu_seconds_at_drain"`
}

func (b *backlogResult) setDrain(d, cpu time.Duration, rss float64) {
	b.DrainSeconds = round(d.Seconds(), 3)
	b.DrainEventsPerSec = round(perSecond(b.Events, d), 0)
	b.CPUSecondsAtDrain = round(cpu.Seconds(), 2)
	b.RSSDrainedMiB = round(rss, 1)
}

// finish fills in the measurements: acked events were acked in wall.
func (r *result) finish(rec *recorder, acked int64, wall time.Duration, u0, u1 usage, pending int64, got processorTotals) {
	r.Acked = acked
	r.WallSeconds = round(wall.Seconds(), 3)
	r.EventsPerSec = round(perSecond(r.Acked, wall), 0)
	l := rec.latencies(50, 90, 99, 100)
	r.Latency = latencyMs{P50: ms(l[0]), P90: ms(l[1]), P99: ms(l[2]), Max: ms(l[3])}
	r.CPUUserSeconds = round((u1.user - u0.user).Seconds(), 2)
	r.CPUSysSeconds = round((u1.sys - u0.sys).Seconds(), 2)
	cpu := (u1.user + u1.sys - u0.user - u0.sys).Seconds()
	r.CPUSeconds = round(cpu, 2)
	if r.Acked > 0 {
		r.CPUSecondsPerMillion = round(cpu/float64(r.Acked)*1e6, 2)
	}
	r.PeakRSSMiB = round(float64(u1.maxRSSKiB)/1024, 1)
	r.PendingAtEnd = pending
	r.Received = got
}

func perSecond(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 1) }

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

func printJSON(w io.Writer, r *result) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func printText(w io.Writer, r *result) {
	fmt.Fprintf(w, "ingestor-bench: mode=%s sources=%d events_per_tick=%d event_size=%d processors=%d synchronous=%s events_per_frame=%d\n",
		r.Mode, r.Sources, r.EventsPerTick, r.EventSize, r.Processors, r.Synchronous, r.EventsPerFrame)
	if r.Capped {
		fmt.Fprintf(w, "  stopped by -duration before %d events were acked\n", r.Target)
	}
	if b := r.Backlog; b != nil {
		fmt.Fprintf(w, "  backlog queued (no processor)  %d events in %.2f s, RSS %.1f MiB\n", b.Events, b.FillSeconds, b.RSSQueuedMiB)
		if b.DrainSeconds > 0 {
			fmt.Fprintf(w, "  backlog drained                %.0f events/s (%.2f s, sources still fetching), RSS %.1f MiB\n",
				b.DrainEventsPerSec, b.DrainSeconds, b.RSSDrainedMiB)
		}
	}
	fmt.Fprintf(w, "  events acked                   %d\n", r.Acked)
	fmt.Fprintf(w, "  wall                           %.2f s (from the processors' start)\n", r.WallSeconds)
	fmt.Fprintf(w, "  throughput                     %.0f events/s\n", r.EventsPerSec)
	fmt.Fprintf(w, "  fetch-to-ack latency           p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms (per event: frames weighted by event count)\n",
		r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.Max)
	fmt.Fprintf(w, "  CPU                            %.2f s (user %.2f + sys %.2f), %.2f s per 1M events (whole process, in-process processors included)\n",
		r.CPUSeconds, r.CPUUserSeconds, r.CPUSysSeconds, r.CPUSecondsPerMillion)
	fmt.Fprintf(w, "  peak RSS                       %.1f MiB\n", r.PeakRSSMiB)
	fmt.Fprintf(w, "  queue pending at end           %d events\n", r.PendingAtEnd)
	fmt.Fprintf(w, "  processors received            %d events in %d frames (%d redelivered), %.1f MiB\n",
		r.Received.Events, r.Received.Frames, r.Received.Redeliveries, float64(r.Received.Bytes)/(1<<20))
}
