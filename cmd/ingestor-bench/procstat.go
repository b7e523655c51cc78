package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks returns the kernel's clock ticks per second, in which
// /proc/PID/stat counts CPU time: getconf CLK_TCK, or 100, Linux's value
// nearly everywhere, when getconf fails.
func clockTicks() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err != nil {
		return 100
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	if err != nil || n <= 0 {
		return 100
	}
	return n
}

// procCPUTicks returns the user plus system CPU time of process pid so far,
// in clock ticks, from /proc/PID/stat (fields 14 and 15, utime and stime).
func procCPUTicks(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu time of process %d: %w", pid, err)
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields after it start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	var f []string
	if i >= 0 {
		f = strings.Fields(string(b[i+1:]))
	}
	if len(f) < 13 {
		return 0, fmt.Errorf("cpu time of process %d: unexpected /proc/%d/stat %q", pid, pid, b)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("cpu time of process %d: unexpected /proc/%d/stat %q", pid, pid, b)
	}
	return utime + stime, nil
}

// procPeakRSSMiB returns the peak resident set size of process pid,
// VmHWM in /proc/PID/status.
func procPeakRSSMiB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("peak RSS of process %d: %w", pid, err)
	}
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			kib, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte(" kB"))), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("peak RSS of process %d: VmHWM %q: %w", pid, rest, err)
			}
			return float64(kib) / 1024, nil
		}
	}
	return 0, fmt.Errorf("peak RSS of process %d: no VmHWM in /proc/%d/status", pid, pid)
}

// dirBytes returns the total size of the regular files under dir.
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += info.Size()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", dir, err)
	}
	return n, nil
}

// filesBytes returns the total size of the files that exist among paths.
func filesBytes(paths ...string) (int64, error) {
	var n int64
	for _, p := range paths {
		info, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return 0, fmt.Errorf("size of %s: %w", p, err)
		default:
			n += info.Size()
		}
	}
	return n, nil
}

// Daemon metrics the real bench reads.
const (
	metricEvents      = "ingestor_source_events_total"
	metricPending     = "ingestor_queue_pending_events"
	metricOwned       = "ingestor_cluster_sources_owned"
	metricCheckpoints = "ingestor_cluster_checkpoints_total"
	metricMembers     = "ingestor_cluster_members"
	metricFetchToAck  = "ingestor_fetch_to_ack_seconds_bucket"
	metricGoroutines  = "go_goroutines"
	metricInflight    = "ingestor_publish_inflight_frames"
	metricFrameCache  = "ingestor_publish_frame_cache_bytes"
	metricProcessors  = "ingestor_processors_connected"
)

// scrape is what the real bench reads of the daemon's /metrics.
type scrape struct {
	// events is the number of events committed to the queue, all sources.
	events float64
	// pending is the number of queued events not yet acked.
	pending float64
	// buckets is ingestor_fetch_to_ack_seconds: the cumulative count of
	// acked frames by upper bound (le), +Inf last.
	buckets []bucket
	// owned, checkpoints and members are the cluster mode's sources held,
	// checkpoints written and members seen.
	owned, checkpoints, members float64
	// goroutines is the daemon's go_goroutines.
	goroutines float64
	// inflightFrames and frameCacheBytes are the frames sent and not yet
	// acked, and the bytes of committed frames held until their first send.
	inflightFrames, frameCacheBytes float64
	// processors is ingestor_processors_connected.
	processors float64
}

// bucket is one cumulative histogram bucket.
type bucket struct {
	le    float64
	count float64
}

// scrapeMetrics reads the daemon's /metrics at url.
func scrapeMetrics(ctx context.Context, url string) (scrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return scrape{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	// Uncompressed: the bench scrapes up to a hundred times a second near
	// the end of a run, where Prometheus would every 15 s, and gzipping
	// each exposition was ~1.5% of the daemon's CPU in -mode real.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return scrape{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s", resp.Status)
	}
	var s scrape
	if err == nil {
		s, err = parseMetrics(resp.Body)
	}
	if err := errors.Join(err, resp.Body.Close()); err != nil {
		return scrape{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	return s, nil
}

// parseMetrics reads the samples the bench needs from the Prometheus text
// format.
func parseMetrics(r io.Reader) (scrape, error) {
	var s scrape
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		labels := ""
		if i := strings.IndexByte(line, '{'); i >= 0 && i < len(name) {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				return scrape{}, fmt.Errorf("malformed line %q", line)
			}
			name, labels, rest = line[:i], line[i+1:j], strings.TrimSpace(line[j+1:])
		}
		if name != metricEvents && name != metricPending && name != metricFetchToAck && name != metricOwned && name != metricCheckpoints &&
			name != metricMembers && name != metricGoroutines && name != metricInflight && name != metricFrameCache && name != metricProcessors {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest + " x")[0], 64)
		if err != nil {
			return scrape{}, fmt.Errorf("malformed line %q: %w", line, err)
		}
		seen[name] = true
		switch name {
		case metricEvents:
			s.events += v
		case metricPending:
			s.pending = v
		case metricOwned:
			s.owned = v
		case metricMembers:
			s.members = v
		case metricGoroutines:
			s.goroutines = v
		case metricInflight:
			s.inflightFrames = v
		case metricFrameCache:
			s.frameCacheBytes = v
		case metricProcessors:
			s.processors = v
		case metricCheckpoints:
			if r, _ := labelValue(labels, "result"); r == "written" {
				s.checkpoints += v
			}
		case metricFetchToAck:
			le, ok := labelValue(labels, "le")
			bound, err := strconv.ParseFloat(le, 64)
			if !ok || err != nil {
				return scrape{}, fmt.Errorf("malformed bucket %q", line)
			}
			s.buckets = append(s.buckets, bucket{le: bound, count: v})
		}
	}
	if err := sc.Err(); err != nil {
		return scrape{}, err
	}
	for _, name := range []string{metricPending, metricFetchToAck} {
		if !seen[name] {
			return scrape{}, fmt.Errorf("no %s", name)
		}
	}
	return s, nil
}

// labelValue returns the value of label name in a Prometheus label list
// such as `source="a",le="0.5"` (values without escapes, as these are).
func labelValue(labels, name string) (string, bool) {
	for _, kv := range strings.Split(labels, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.TrimSpace(k) == name {
			return strings.Trim(v, `"`), true
		}
	}
	return "", false
}

// quantile returns quantile q (0 to 1) of the observations that were made
// between two scrapes of one histogram, by linear interpolation inside the
// bucket that holds it, as Prometheus's histogram_quantile does; its error
// is at most that bucket's width. It returns NaN when there is none, and
// the largest finite bound when the quantile lies in the +Inf bucket.
func quantile(q float64, before, after []bucket) float64 {
	if len(after) == 0 || len(before) != 0 && len(before) != len(after) {
		return math.NaN()
	}
	diff := make([]float64, len(after))
	for i := range after {
		diff[i] = after[i].count
		if len(before) != 0 {
			diff[i] -= before[i].count
		}
	}
	total := diff[len(diff)-1]
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for i, b := range after {
		if diff[i] >= rank {
			if math.IsInf(b.le, 1) {
				return lower
			}
			if diff[i] == below {
				return b.le
			}
			return lower + (b.le-lower)*(rank-below)/(diff[i]-below)
		}
		lower, below = b.le, diff[i]
	}
	return lower
}
