package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/cluster"
)

// modeCluster runs the real path on a cluster of 1, 2, ... -members
// members sharing -sources sources through etcd.
const modeCluster = "cluster"

// Defaults of -mode cluster: six sources, so that three members get two
// each, of 200,000 events each.
const (
	clusterSources         = 6
	clusterEventsPerSource = 200_000
)

// clusterResult is one -mode cluster run: the same firehose load on
// Members daemons sharing the sources through etcd.
type clusterResult struct {
	Members      int     `json:"members"`
	Sources      int     `json:"sources"`
	Events       int64   `json:"events"`
	EventsPerSec float64 `json:"events_per_sec"`
	// DaemonsCPUPerMillion is the CPU of all members together.
	DaemonsCPUPerMillion   float64 `json:"daemons_cpu_s_per_1m"`
	ProcessorCPUPerMillion float64 `json:"processor_cpu_s_per_1m"`
	EtcdCPUPerMillion      float64 `json:"etcd_cpu_s_per_1m"`
	// CheckpointsPerSec counts the cursor checkpoints the members wrote to
	// etcd per second of the run.
	CheckpointsPerSec float64 `json:"checkpoints_per_sec"`
	Received          counts  `json:"received"`
}

func (r *clusterResult) exactlyOnce() bool {
	return r.Received.Events == r.Events && r.Received.DistinctKeys == r.Events
}

// printCluster prints the runs as one table.
func printCluster(w io.Writer, o options, runs []*clusterResult) error {
	fmt.Fprintf(w, "ingestor-bench -mode cluster: %d sources polling a firehose of %d events each (pages of %d, ~%d B), on 1 to %d members sharing them through etcd, each its own bin/ingestor process; one bin/processor following the members from etcd\n",
		o.sources, o.events, o.pageSize, o.eventSize, o.members)
	fmt.Fprintln(w, "| members | events | events/s | members' CPU-s/1M | processor CPU-s/1M | etcd CPU-s/1M | checkpoints/s | exactly once |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, r := range runs {
		once := fmt.Sprintf("yes: %d keys", r.Received.DistinctKeys)
		if !r.exactlyOnce() {
			once = fmt.Sprintf("NO: %d received, %d distinct of %d", r.Received.Events, r.Received.DistinctKeys, r.Events)
		}
		fmt.Fprintf(w, "| %d | %d | %.0f | %.2f | %.2f | %.2f | %.1f | %s |\n", r.Members, r.Events, r.EventsPerSec,
			r.DaemonsCPUPerMillion, r.ProcessorCPUPerMillion, r.EtcdCPUPerMillion, r.CheckpointsPerSec, once)
	}
	for _, r := range runs {
		if !r.exactlyOnce() {
			return fmt.Errorf("%d members: not every event arrived exactly once", r.Members)
		}
	}
	return nil
}

// benchCluster runs the cluster load on 1, 2, ... o.members members, one
// after the other, against one etcd.
func benchCluster(ctx context.Context, o options, dir string, stderr io.Writer) ([]*clusterResult, error) {
	etcd, endpoint, err := startEtcd(ctx, dir, stderr)
	if err != nil {
		return nil, err
	}
	defer etcd.stopLogged(stderr)
	var runs []*clusterResult
	for n := 1; n <= o.members; n++ {
		rdir := filepath.Join(dir, fmt.Sprintf("members-%d", n))
		if err := os.MkdirAll(rdir, 0o755); err != nil {
			return nil, err
		}
		res, err := clusterRun(ctx, o, rdir, endpoint, etcd, n, stderr)
		if err != nil {
			return nil, fmt.Errorf("%d members: %w", n, err)
		}
		runs = append(runs, res)
	}
	return runs, nil
}

// clusterRun is one run on n members: a fresh firehose, fresh data dirs
// and a cluster name of its own on the shared etcd.
func clusterRun(ctx context.Context, o options, dir, etcdEndpoint string, etcd *child, n int, stderr io.Writer) (res *clusterResult, err error) {
	ingestorBin, processorBin, err := realBinaries(o.bin)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r := &realRun{o: o, dir: dir}
	defer func() {
		for _, c := range r.children {
			if serr := c.stop(time.Minute); serr != nil && err == nil {
				fmt.Fprintln(stderr, "ingestor-bench:", serr)
			}
		}
	}()
	if err := r.startFirehose(self); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("bench-%d", n)
	members, metrics, names, err := r.startClusterMembers(ctx, ingestorBin, etcdEndpoint, name, n)
	if err != nil {
		return nil, err
	}
	countOut := filepath.Join(dir, "processor-counts.json")
	procs, err := startChild("processor", exec.Command(processorBin, "-etcd", etcdEndpoint, "-cluster", name,
		"-count-out", countOut, "-log-every", "1h"), filepath.Join(dir, "processor.log"))
	if err != nil {
		return nil, err
	}
	r.children = append(r.children, procs)
	// Placement settles before the load: every member sees all n and
	// holds the sources placed on it. No source moves during the run, so
	// the members' event counters (which a member drops for a source it
	// hands over) add up.
	if err := waitPlacement(ctx, metrics, names, o.sources, r.children); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}

	res = &clusterResult{Members: n, Sources: o.sources, Events: o.events * int64(o.sources)}
	if err := r.measureCluster(ctx, res, metrics, members, procs, etcd); err != nil {
		return nil, err
	}
	// The members drain, then the processor writes its counts.
	for _, m := range members {
		if err := m.stop(2 * time.Minute); err != nil {
			return nil, err
		}
	}
	if res.Received, err = stopProcessor(procs, countOut); err != nil {
		return nil, err
	}
	return res, nil
}

// startClusterMembers starts n members of cluster name, m1..mn, each in
// its own directory under r.dir, and returns them, their metrics URLs and
// their names.
func (r *realRun) startClusterMembers(ctx context.Context, ingestorBin, etcdEndpoint, name string, n int) (members []*child, metrics, names []string, err error) {
	for i := 1; i <= n; i++ {
		names = append(names, fmt.Sprintf("m%d", i))
		mdir := filepath.Join(r.dir, fmt.Sprintf("m%d", i))
		if err := os.MkdirAll(mdir, 0o755); err != nil {
			return nil, nil, nil, err
		}
		cfg, err := clusterConfig(mdir, r.firehose, etcdEndpoint, name, fmt.Sprintf("m%d", i), r.o.sources)
		if err != nil {
			return nil, nil, nil, err
		}
		m, err := startChild(fmt.Sprintf("ingestor m%d", i), exec.Command(ingestorBin, "run", "-c", cfg), filepath.Join(mdir, "ingestor.log"))
		if err != nil {
			return nil, nil, nil, err
		}
		r.children = append(r.children, m)
		members = append(members, m)
		addr, err := childHTTPAddr(ctx, m)
		if err != nil {
			return nil, nil, nil, err
		}
		metrics = append(metrics, "http://"+addr+"/metrics")
	}
	return members, metrics, names, nil
}

// measureCluster releases res.Events from the firehose, waits until the
// members have queued and delivered them all, and fills res's rates and
// CPU per million events of the members, the processor and etcd.
func (r *realRun) measureCluster(ctx context.Context, res *clusterResult, metrics []string, members []*child, procs, etcd *child) error {
	cpu := func() (daemons, proc, etcdCPU float64, err error) {
		for _, m := range members {
			t, err := procCPUTicks(m.cmd.Process.Pid)
			if err != nil {
				return 0, 0, 0, err
			}
			daemons += t
		}
		if proc, err = procCPUTicks(procs.cmd.Process.Pid); err != nil {
			return 0, 0, 0, err
		}
		etcdCPU, err = procCPUTicks(etcd.cmd.Process.Pid)
		return daemons, proc, etcdCPU, err
	}
	s0, err := scrapeCluster(ctx, metrics)
	if err != nil {
		return err
	}
	m0, p0, e0, err := cpu()
	if err != nil {
		return err
	}
	if err := r.control(ctx, fmt.Sprintf("/release?n=%d", r.o.events)); err != nil {
		return err
	}
	begin := time.Now()
	want := float64(res.Events)
	if err := waitCluster(ctx, metrics, r.children, func(s clusterScrape) bool {
		return s.events-s0.events >= want && s.pending == 0
	}); err != nil {
		return err
	}
	wall := time.Since(begin)
	m1, p1, e1, err := cpu()
	if err != nil {
		return err
	}
	s1, err := scrapeCluster(ctx, metrics)
	if err != nil {
		return err
	}
	perMillion := 1e6 / want / clockTicks()
	res.EventsPerSec = round(want/wall.Seconds(), 0)
	res.DaemonsCPUPerMillion = round((m1-m0)*perMillion, 2)
	res.ProcessorCPUPerMillion = round((p1-p0)*perMillion, 2)
	res.EtcdCPUPerMillion = round((e1-e0)*perMillion, 2)
	res.CheckpointsPerSec = round((s1.checkpoints-s0.checkpoints)/wall.Seconds(), 1)
	return nil
}

// clusterConfig writes member's config into dir: sources s00.. polling
// the firehose, the member's own data dir and ipc endpoints, [cluster] on
// etcd.
func clusterConfig(dir, firehose, etcd, cluster, member string, sources int) (string, error) {
	pub, ack := filepath.Join(dir, "pub.sock"), filepath.Join(dir, "ack.sock")
	if len(pub) > maxIPCPath {
		return "", fmt.Errorf("-dir %s is too long for ipc:// endpoints: use a shorter path", dir)
	}
	data := filepath.Join(dir, "data")
	var b strings.Builder
	fmt.Fprintf(&b, `[daemon]
data_dir = %s
http_addr = "127.0.0.1:0"
log_format = "json"
shutdown_grace = "60s"

[raw_store]
url = %s

[publish]
endpoint = %s
ack_endpoint = %s

[cluster]
enabled = true
name = %s
member_name = %s
etcd_endpoints = [%s]
rebalance_delay = "0s"
`, tomlString(data), tomlString("file://"+filepath.Join(data, "raw")), tomlString("ipc://"+pub), tomlString("ipc://"+ack),
		tomlString(cluster), tomlString(member), tomlString(etcd))
	for i := range sources {
		fmt.Fprintf(&b, `
[source.s%02d]
kind = "http_poll"
poll_url = %s
interval = "1ms"
jitter = "0%%"
timeout = "5m"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
time_field = "ts"
`, i, tomlString(fmt.Sprintf("%s/events?src=s%02d", firehose, i)))
	}
	path := filepath.Join(dir, "ingestor.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	if _, err := config.Load(path); err != nil {
		return "", fmt.Errorf("bench config: %w", err)
	}
	return path, nil
}

// clusterScrape sums what the members' /metrics say.
type clusterScrape struct {
	events, pending, owned, checkpoints float64
}

func scrapeCluster(ctx context.Context, urls []string) (clusterScrape, error) {
	var t clusterScrape
	for _, u := range urls {
		s, err := scrapeMetrics(ctx, u)
		if err != nil {
			return clusterScrape{}, err
		}
		t.events += s.events
		t.pending += s.pending
		t.owned += s.owned
		t.checkpoints += s.checkpoints
	}
	return t, nil
}

// waitCluster polls the members' metrics until done holds, failing when a
// child exits or nothing moves for stallLimit.
func waitCluster(ctx context.Context, urls []string, children []*child, done func(clusterScrape) bool) error {
	last, lastAt := clusterScrape{}, time.Now()
	for {
		s, err := scrapeCluster(ctx, urls)
		if err != nil {
			return err
		}
		if done(s) {
			return nil
		}
		if s != last {
			last, lastAt = s, time.Now()
		} else if time.Since(lastAt) > stallLimit {
			return fmt.Errorf("no progress for %v: %+v", stallLimit, s)
		}
		for _, c := range children {
			if err := c.exited(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitPlacement waits until the member behind each of urls (names, in the
// same order) sees them all and holds exactly the sources placed on it.
func waitPlacement(ctx context.Context, urls, names []string, sources int, children []*child) error {
	all := make([]string, sources)
	for i := range all {
		all[i] = fmt.Sprintf("s%02d", i)
	}
	want := make(map[string]float64)
	for _, member := range cluster.PlaceAll(all, names) {
		want[member]++
	}
	// A hand-over waits for the fetch in progress, here a long poll of
	// the firehose, which its lease's deadline ends (under lease_ttl).
	const limit = 2 * time.Minute
	deadline := time.Now().Add(limit)
	for {
		settled := true
		for i, u := range urls {
			s, err := scrapeMetrics(ctx, u)
			if err != nil {
				return err
			}
			if s.members != float64(len(names)) || s.owned != want[names[i]] {
				settled = false
			}
		}
		if settled {
			return nil
		}
		for _, c := range children {
			if err := c.exited(); err != nil {
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled within %v (want sources per member %v)", limit, want)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startEtcd runs etcd from $PATH with its data in dir/etcd, on free
// loopback ports, with extra flags, and waits until it is healthy; stop
// it with stopLogged.
func startEtcd(ctx context.Context, dir string, stderr io.Writer, extra ...string) (*child, string, error) {
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, "", fmt.Errorf("the cluster modes run etcd from $PATH: %w (apt-get install etcd-server; make bench installs it)", err)
	}
	client, peer := freeAddr(), freeAddr()
	args := append([]string{"--name", "bench", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://" + client, "--advertise-client-urls", "http://" + client,
		"--listen-peer-urls", "http://" + peer, "--initial-advertise-peer-urls", "http://" + peer,
		"--initial-cluster", "bench=http://" + peer, "--logger", "zap", "--log-level", "error"}, extra...)
	etcd, err := startChild("etcd", exec.Command(etcdBin, args...), filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, "", err
	}
	endpoint := "http://" + client
	if err := waitEtcd(ctx, endpoint, etcd); err != nil {
		etcd.stopLogged(stderr)
		return nil, "", err
	}
	return etcd, endpoint, nil
}

// stopLogged stops etcd, reporting a failure to stop it on stderr: etcd
// exits on SIGTERM with the signal as its status, which is no failure.
func (c *child) stopLogged(stderr io.Writer) {
	if err := c.stop(10 * time.Second); err != nil && !strings.Contains(err.Error(), "signal: terminated") {
		fmt.Fprintln(stderr, "ingestor-bench:", err)
	}
}

// waitEtcd waits until etcd reports itself healthy.
func waitEtcd(ctx context.Context, endpoint string, etcd *child) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(endpoint + "/health")
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			err = errors.Join(rerr, resp.Body.Close())
			if err == nil && strings.Contains(string(b), `"health":"true"`) {
				return nil
			}
		}
		if err := etcd.exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not healthy within 30s%s", etcd.logTail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// freeAddr returns a loopback address free when asked.
func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer ln.Close()
	return ln.Addr().String()
}
