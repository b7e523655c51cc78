package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// overloadResult is what overload mode measured. Its JSON form is the
// -json output of that mode.
type overloadResult struct {
	Mode            string       `json:"mode"`
	Devices         int          `json:"devices"`
	EventsPerDevice int          `json:"events_per_device"`
	WebhookSenders  int          `json:"webhook_senders"`
	Unloaded        *phaseResult `json:"unloaded"`
	Overload        *phaseResult `json:"overload"`
	// MinWindowRatio is the overload phase's lowest window goodput over
	// the unloaded goodput.
	MinWindowRatio float64 `json:"min_window_ratio"`
	// Received is what the processor counted over the run.
	Received counts          `json:"received"`
	Checks   []overloadCheck `json:"checks"`
}

// overloadCheck is one target and whether it was met.
type overloadCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// phaseResult is what one phase measured.
type phaseResult struct {
	Name    string `json:"name"`
	Devices int    `json:"devices"`
	// EventsPerDevice is 0 in the unloaded phase, whose devices send for
	// its duration.
	EventsPerDevice int `json:"events_per_device"`
	// Seconds runs from the phase's start until its last device finished.
	Seconds float64 `json:"seconds"`
	// Goodput is events answered stored per second: in the unloaded phase
	// from its first second until its devices were told to stop, in the
	// overload phase over Seconds.
	Goodput float64 `json:"goodput_per_sec"`
	// NewEvents is how many distinct events the phase stored: the
	// devices' envelopes less duplicates and invalid ones, and the
	// webhook requests.
	NewEvents      int64 `json:"new_events"`
	DeviceStored   int64 `json:"device_stored"`
	DeviceRejected int64 `json:"device_rejected"`
	DeviceRetries  int64 `json:"device_retries"`
	WebhookStored  int64 `json:"webhook_stored"`
	WebhookRefused int64 `json:"webhook_refused"`
	// Webhook is the webhook events' time from the first POST to the
	// stored answer, retries included, in milliseconds.
	Webhook         latencyMs      `json:"webhook_latency_ms"`
	Windows         []windowResult `json:"windows"`
	DevicesFinished int            `json:"devices_finished"`
	// FinishedS are the devices' finish times from the phase's start.
	FinishedS struct {
		Min, P50, Max float64
	} `json:"finished_s"`
	MinDeviceStored  int64 `json:"min_device_stored"`
	MaxDeviceStored  int64 `json:"max_device_stored"`
	MinWebhookStored int64 `json:"min_webhook_sender_stored"`
	// The longest time a device or a webhook sender went without a stored
	// answer, and the longest time without any while requests waited.
	LongestDeviceWaitS  float64 `json:"longest_device_wait_s"`
	LongestWebhookWaitS float64 `json:"longest_webhook_wait_s"`
	LongestStallS       float64 `json:"longest_stall_s"`
	// CPUPerEventUS is the daemon's CPU time over the phase per event
	// stored, in microseconds: what overload wastes shows here, whatever
	// share of the machine other processes take.
	CPUPerEventUS float64 `json:"cpu_us_per_event"`
}

// windowResult is one goodput window of a phase.
type windowResult struct {
	FromS        float64 `json:"from_s"`
	ToS          float64 `json:"to_s"`
	PerSec       float64 `json:"committed_per_sec"`
	Refused      int64   `json:"refusals"`
	WebhookP99Ms float64 `json:"webhook_p99_ms"`
	// DevicesDone and the stored answers per device at the window's end.
	DevicesDone     int   `json:"devices_done"`
	MinDeviceStored int64 `json:"min_device_stored"`
	MaxDeviceStored int64 `json:"max_device_stored"`
	// Ratio is PerSec over the unloaded goodput (overload phase only).
	Ratio float64 `json:"ratio_of_unloaded,omitempty"`
}

// summary sums up a finished phase.
func (p *phaseRun) summary() *phaseResult {
	tl := p.tl
	r := &phaseResult{Name: p.spec.name, Devices: len(p.devices), EventsPerDevice: p.spec.limit}
	var end time.Time
	var finished []time.Duration
	r.MinDeviceStored = -1
	for _, d := range p.devices {
		n := d.stored.Load()
		r.DeviceStored += n
		r.DeviceRejected += d.rejected
		r.DeviceRetries += d.retries.Load()
		if r.MinDeviceStored < 0 || n < r.MinDeviceStored {
			r.MinDeviceStored = n
		}
		r.MaxDeviceStored = max(r.MaxDeviceStored, n)
		r.NewEvents += int64(newEnvelopes(d.total))
		r.LongestDeviceWaitS = max(r.LongestDeviceWaitS, round(d.longestGap.Seconds(), 2))
		if !d.finished.IsZero() {
			r.DevicesFinished++
			finished = append(finished, d.finished.Sub(tl.start))
			end = maxTime(end, d.finished)
		}
	}
	slices.Sort(finished)
	r.FinishedS.Min, r.FinishedS.P50, r.FinishedS.Max = round(percentile(finished, 0).Seconds(), 2),
		round(percentile(finished, 50).Seconds(), 2), round(percentile(finished, 100).Seconds(), 2)
	var lat []hookLatency
	r.MinWebhookStored = -1
	for _, s := range p.senders {
		r.WebhookStored += s.stored
		r.NewEvents += s.stored
		r.WebhookRefused += s.refused
		if r.MinWebhookStored < 0 || s.stored < r.MinWebhookStored {
			r.MinWebhookStored = s.stored
		}
		r.LongestWebhookWaitS = max(r.LongestWebhookWaitS, round(s.longestGap.Seconds(), 2))
		lat = append(lat, s.latencies...)
	}
	r.Webhook = hookPercentiles(lat, 0, len(tl.ref))
	r.LongestStallS = round(p.longestStall.Seconds(), 2)
	if n := r.DeviceStored + r.WebhookStored; n > 0 {
		r.CPUPerEventUS = round(p.cpu.Seconds()/float64(n)*1e6, 1)
	}
	r.Seconds = round(end.Sub(tl.start).Seconds(), 2)
	endB := tl.bucket(end) + 1
	from, to := 0, endB
	if p.spec.limit == 0 {
		// The unloaded rate: from the first second until the stop.
		from, to = int(time.Second/bucketWidth), tl.bucket(p.stoppedAt)
	}
	r.Goodput = round(float64(tl.committed(from, to))/(float64(to-from)*bucketWidth.Seconds()), 0)
	for _, w := range windows(0, endB) {
		r.Windows = append(r.Windows, p.window(w[0], w[1], lat))
	}
	return r
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// windows returns the goodput windows [from, to) of buckets from..to: one
// of goodputWindow every goodputStep, the last one ending at to; or the
// whole span when it is shorter than a window.
func windows(from, to int) [][2]int {
	size, step := int(goodputWindow/bucketWidth), int(goodputStep/bucketWidth)
	if to-from <= size {
		return [][2]int{{from, to}}
	}
	var ws [][2]int
	for s := from; s+size <= to; s += step {
		ws = append(ws, [2]int{s, s + size})
	}
	if last := ws[len(ws)-1][1]; last < to {
		ws = append(ws, [2]int{to - size, to})
	}
	return ws
}

// window measures the buckets [from, to).
func (p *phaseRun) window(from, to int, lat []hookLatency) windowResult {
	secs := float64(to-from) * bucketWidth.Seconds()
	s := p.sampleAt(to)
	return windowResult{
		FromS: round(float64(from)*bucketWidth.Seconds(), 1), ToS: round(float64(to)*bucketWidth.Seconds(), 1),
		PerSec: round(float64(p.tl.committed(from, to))/secs, 0), Refused: sum(p.tl.ref, from, to),
		WebhookP99Ms: hookPercentiles(lat, from, to).P99, DevicesDone: s.done, MinDeviceStored: s.minStored, MaxDeviceStored: s.maxStored,
	}
}

// hookPercentiles returns the percentiles of the webhook latencies
// answered in the buckets [from, to).
func hookPercentiles(lat []hookLatency, from, to int) latencyMs {
	var ds []time.Duration
	for _, l := range lat {
		if l.bucket >= from && l.bucket < to {
			ds = append(ds, l.latency)
		}
	}
	slices.Sort(ds)
	ms := func(p float64) float64 { return round(percentile(ds, p).Seconds()*1000, 1) }
	return latencyMs{P50: ms(50), P90: ms(90), P99: ms(99), Max: ms(100)}
}

// validEnvelopes is how many of a device's first n messages are envelopes
// (every tenth is not JSON), and newEnvelopes how many of them are not
// duplicates (every second message repeats the one before).
func validEnvelopes(n int) int64 { return int64(n - n/10) }
func newEnvelopes(n int) int     { return (n + 1) / 2 }

// check checks the targets.
func (r *overloadResult) check() {
	u, o := r.Unloaded, r.Overload
	worst := -1
	r.MinWindowRatio = 0
	for i := range o.Windows {
		w := &o.Windows[i]
		if u.Goodput > 0 {
			w.Ratio = round(w.PerSec/u.Goodput, 3)
		}
		if worst < 0 || w.Ratio < o.Windows[worst].Ratio {
			worst = i
		}
	}
	w := o.Windows[worst]
	r.MinWindowRatio = w.Ratio
	want := validEnvelopes(r.EventsPerDevice)
	r.Checks = []overloadCheck{
		{"goodput", w.Ratio >= goodputTarget, fmt.Sprintf("lowest window %.0f%% of the unloaded %.0f/s (%.0f/s in %.0f-%.0f s; target %.0f%%)",
			w.Ratio*100, u.Goodput, w.PerSec, w.FromS, w.ToS, goodputTarget*100)},
		{"every device finishes", o.DevicesFinished == o.Devices && o.MinDeviceStored == want && o.MaxDeviceStored == want,
			fmt.Sprintf("%d of %d devices finished, %d-%d envelopes stored each (want %d)", o.DevicesFinished, o.Devices,
				o.MinDeviceStored, o.MaxDeviceStored, want)},
		{"no sender starves", o.LongestDeviceWaitS <= starveLimit.Seconds() && o.LongestWebhookWaitS <= starveLimit.Seconds() && o.MinWebhookStored > 0,
			fmt.Sprintf("longest wait for a stored answer: device %.1f s, webhook sender %.1f s (limit %v); every webhook sender stored %d or more",
				o.LongestDeviceWaitS, o.LongestWebhookWaitS, starveLimit, o.MinWebhookStored)},
		{"every event reaches the processor once", r.Received.Events == u.NewEvents+o.NewEvents && r.Received.DistinctKeys == r.Received.Events,
			fmt.Sprintf("the processor received %d events with %d distinct keys; %d were stored", r.Received.Events, r.Received.DistinctKeys,
				u.NewEvents+o.NewEvents)},
		{"no commit stall", max(u.LongestStallS, o.LongestStallS) < commitStall.Seconds(),
			fmt.Sprintf("longest time without a commit while requests waited: %.1f s unloaded, %.1f s overloaded (limit %v)",
				u.LongestStallS, o.LongestStallS, commitStall)},
	}
}

// printOverload prints the result as text, or as JSON.
func printOverload(w io.Writer, r *overloadResult, asJSON bool) error {
	if asJSON {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode result: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	u, o := r.Unloaded, r.Overload
	var b strings.Builder
	fmt.Fprintf(&b, "ingestor-bench -mode overload: bin/ingestor with a ws_ingress and a webhook source, bin/processor acking, devices and webhook senders in this process\n")
	fmt.Fprintf(&b, "  unloaded: %d devices sending for %.1f s, %d webhook senders: %.0f events committed/s, %d refusals, webhook p50 %.1f ms p99 %.1f ms, "+
		"daemon %.0f CPU-us per event\n", u.Devices, u.Seconds, r.WebhookSenders, u.Goodput, u.DeviceRetries+u.WebhookRefused, u.Webhook.P50, u.Webhook.P99,
		u.CPUPerEventUS)
	fmt.Fprintf(&b, "  overload: %d devices x %d envelopes (up to %d/s each, %d waiting at most; every 2nd a duplicate, every 10th not JSON), "+
		"%d webhook senders; %.1f s, %.0f events committed/s, daemon %.0f CPU-us per event\n",
		o.Devices, r.EventsPerDevice, deviceRate, deviceWindow, r.WebhookSenders, o.Seconds, o.Goodput, o.CPUPerEventUS)
	b.WriteString("| window s | committed/s | of unloaded | refusals | webhook p99 ms | devices done | stored per device min-max |\n|---|---|---|---|---|---|---|\n")
	for _, w := range o.Windows {
		fmt.Fprintf(&b, "| %.1f-%.1f | %.0f | %.0f%% | %d | %.1f | %d | %d-%d |\n", w.FromS, w.ToS, w.PerSec, w.Ratio*100, w.Refused,
			w.WebhookP99Ms, w.DevicesDone, w.MinDeviceStored, w.MaxDeviceStored)
	}
	fmt.Fprintf(&b, "  refusals: %d device envelopes answered retry, %d webhook requests answered 429; webhook p50 %.1f ms, p99 %.1f ms, max %.1f ms "+
		"(first POST to stored), %d stored\n", o.DeviceRetries, o.WebhookRefused, o.Webhook.P50, o.Webhook.P99, o.Webhook.Max, o.WebhookStored)
	fmt.Fprintf(&b, "  devices finished: %d of %d, after %.1f-%.1f s (median %.1f s)\n", o.DevicesFinished, o.Devices,
		o.FinishedS.Min, o.FinishedS.Max, o.FinishedS.P50)
	for _, c := range r.Checks {
		verdict := "met"
		if !c.OK {
			verdict = "MISSED"
		}
		fmt.Fprintf(&b, "  target %s: %s (%s)\n", c.Name, verdict, c.Detail)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
