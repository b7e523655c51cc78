package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// reloadHarness is a daemon started from a config file on disk, which the
// test edits and reloads.
type reloadHarness struct {
	*harness
	path string
	head string // the daemon, raw store and publish tables
}

// startReloadable writes head+body to a config file in a new data dir
// and starts a daemon on it.
func startReloadable(t *testing.T, daemonExtra, body string, o Options) *reloadHarness {
	t.Helper()
	rh, cfg := loadReloadable(t, daemonExtra, body)
	startConfig(t, rh.harness, cfg, o)
	return rh
}

// loadReloadable writes head+body to a config file in a new data dir and
// loads it, for a daemon to start on.
func loadReloadable(t *testing.T, daemonExtra, body string) (*reloadHarness, *config.Config) {
	t.Helper()
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, pub: "tcp://" + testsync.FreePort(t), ack: "tcp://" + testsync.FreePort(t)}
	rh := &reloadHarness{harness: h, path: filepath.Join(dir, "ingestor.toml"), head: h.configText(daemonExtra, "", `ack_timeout = "2m"`)}
	rh.write(body)
	cfg, err := config.Load(rh.path)
	if err != nil {
		t.Fatal(err)
	}
	return rh, cfg
}

// write replaces the config file's body (everything after the head).
func (rh *reloadHarness) write(body string) {
	rh.t.Helper()
	if err := os.WriteFile(rh.path, []byte(rh.head+body), 0o600); err != nil {
		rh.t.Fatal(err)
	}
}

// reload writes body and reloads it, failing the test if it is refused.
func (rh *reloadHarness) reload(body string) config.Plan {
	rh.t.Helper()
	rh.write(body)
	res, err := rh.d.Reload(rh.t.Context(), false)
	if err != nil {
		rh.t.Fatalf("reload: %v\nconfig:\n%s", err, body)
	}
	return res.Plan
}

// feedBlock is an http_poll source on feed polled every interval; extra
// adds keys.
func feedBlock(name, url, interval, extra string) string {
	return fmt.Sprintf(`
[source.%s]
kind = "http_poll"
poll_url = %q
interval = %q
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
time_field = "ts"
%s
`, name, url+"/feed", interval, extra)
}

// TestReloadUnderLoad reloads a daemon ten times while its sources fetch
// as fast as their upstreams answer and a processor acks: sources are
// added, removed, added back, changed directly, through [defaults] and
// through their rate limiter, and one edit is invalid. The source no edit
// touches keeps its actor and its polls through all of it. No source's
// cursor ever goes back (a drained source commits what it fetched, and
// its next incarnation starts at that durable cursor), and once a last
// reload has stopped them all, each source's events delivered are exactly
// its records 1 to its durable cursor, each once: nothing lost, nothing
// queued twice.
func TestReloadUnderLoad(t *testing.T) {
	r := startReloadUnderLoad(t)
	for i, step := range r.steps() {
		r.reloadStep(i, step)
	}

	rh := r.rh
	testsync.WaitFor(t, "every source to commit some pages", 30*time.Second, func() bool {
		for _, n := range r.names {
			if c, _, _ := rh.d.Queue().Cursor(t.Context(), n); c == "" {
				return false
			}
		}
		return true
	})
	// A last reload stops every source; what they committed is delivered.
	if got, want := rh.reload(""), (config.Plan{Stop: []string{"s2", "s3", "s4", "s5", "steady"}}); !samePlan(got, want) {
		t.Fatalf("last reload: plan %v, want %v", got, want)
	}
	testsync.WaitFor(t, "every committed event acked", 60*time.Second, func() bool { return rh.d.Queue().PendingEvents() == 0 })
	for _, n := range r.names {
		r.checkSource(n)
	}
	if n := r.seen.len(); n == 0 {
		t.Fatal("nothing delivered")
	}
	r.checkSteadyUndisturbed()
}

// reloadUnderLoad is the daemon of TestReloadUnderLoad, its upstreams
// (one per source name), and what its processor delivered.
type reloadUnderLoad struct {
	t     *testing.T
	page  int
	names []string
	feeds map[string]*testupstream.Server
	// steady is the block of the source no edit touches, steadyPID its
	// actor.
	steady    string
	rh        *reloadHarness
	seen      *seenSet
	steadyPID *actor.PID
}

// startReloadUnderLoad starts an upstream per source, then the daemon with
// [defaults] and steady alone, and a processor.
func startReloadUnderLoad(t *testing.T) *reloadUnderLoad {
	t.Helper()
	const total, page = 10_000_000, 10
	r := &reloadUnderLoad{t: t, page: page, names: []string{"steady", "s2", "s3", "s4", "s5"}, feeds: map[string]*testupstream.Server{}}
	for _, n := range r.names {
		r.feeds[n] = testupstream.NewServer(t, testupstream.Options{Total: total, PageSize: page})
	}
	// steady sets every key [defaults] could give it, so the edits of
	// [defaults] below do not concern it.
	r.steady = feedBlock("steady", r.feeds["steady"].URL, "100ms", "timeout = \"5s\"\njitter = \"10%\"\ninflight_batches = 2\nmalformed_retries = 3")
	r.rh = startReloadable(t, "", reloadDefaults("5s")+r.steady, Options{})
	r.seen = newSeenSet()
	r.rh.startProcessor(func(_ context.Context, ev *processor.Event) error {
		r.seen.add(ev.Source + "/" + ev.Key)
		return nil
	})
	r.steadyPID = r.rh.d.pipeline.SourcePID("steady")
	if r.steadyPID == nil {
		t.Fatal("source steady is not running")
	}
	return r
}

// src is the block of source n polling its upstream every 1ms, or at the
// interval extra starts with; the rest of extra adds keys.
func (r *reloadUnderLoad) src(n string, extra ...string) string {
	interval := "1ms"
	if len(extra) > 0 && strings.HasPrefix(extra[0], "interval = ") {
		interval, extra = strings.Trim(strings.TrimPrefix(extra[0], "interval = "), `"`), extra[1:]
	}
	return feedBlock(n, r.feeds[n].URL, interval, strings.Join(extra, "\n"))
}

// reloadLimiter is the table of the rate limiter shared at rate.
func reloadLimiter(rate string) string {
	return fmt.Sprintf("\n[rate_limiters.shared]\nrate = %q\nburst = 5\n", rate)
}

// reloadDefaults is a [defaults] table with timeout.
func reloadDefaults(timeout string) string {
	return fmt.Sprintf("\n[defaults]\ntimeout = %q\ninflight_batches = 4\n", timeout)
}

// reloadEdit is a config body and the plan its reload must make; the body
// INVALID stands for an invalid edit.
type reloadEdit struct {
	body string
	want config.Plan
}

// steps returns the ten edits of TestReloadUnderLoad, in order.
func (r *reloadUnderLoad) steps() []reloadEdit {
	defaults, limiter, src, steady := reloadDefaults, reloadLimiter, r.src, r.steady
	return []reloadEdit{
		{defaults("5s") + steady + src("s2"), config.Plan{Start: []string{"s2"}, Stay: []string{"steady"}}},
		{defaults("5s") + steady + src("s2", `interval = "2ms"`) + src("s3"),
			config.Plan{Start: []string{"s3"}, Restart: []string{"s2"}, Stay: []string{"steady"}}},
		{defaults("5s") + steady + src("s3"), config.Plan{Stop: []string{"s2"}, Stay: []string{"s3", "steady"}}},
		{defaults("5s") + steady + src("s2") + src("s3") + src("s4"),
			config.Plan{Start: []string{"s2", "s4"}, Stay: []string{"s3", "steady"}}},
		{defaults("6s") + steady + src("s2") + src("s3") + src("s4"),
			config.Plan{Restart: []string{"s2", "s3", "s4"}, Stay: []string{"steady"}}},
		{"INVALID", config.Plan{}},
		{defaults("6s") + steady + src("s2"), config.Plan{Stop: []string{"s3", "s4"}, Stay: []string{"s2", "steady"}}},
		{defaults("6s") + limiter("500/s") + steady + src("s2") + src("s3", `rate_limiter = "shared"`),
			config.Plan{Start: []string{"s3"}, Stay: []string{"s2", "steady"}}},
		{defaults("6s") + limiter("800/s") + steady + src("s2") + src("s3", `rate_limiter = "shared"`),
			config.Plan{Restart: []string{"s3"}, Stay: []string{"s2", "steady"}}},
		{defaults("6s") + limiter("800/s") + steady + src("s2") + src("s3", `rate_limiter = "shared"`) + src("s4") + src("s5"),
			config.Plan{Start: []string{"s4", "s5"}, Stay: []string{"s2", "s3", "steady"}}},
	}
}

// reloadStep waits for steady to poll a few times, then makes edit i, and
// checks that its reload makes the plan the edit wants and keeps steady's
// actor, or, for the invalid edit, that its reload is refused and stops
// nothing.
func (r *reloadUnderLoad) reloadStep(i int, step reloadEdit) {
	t, rh := r.t, r.rh
	t.Helper()
	// Let the sources fetch between reloads: steady's polls go on.
	before := len(r.feeds["steady"].Requests())
	testsync.WaitFor(t, "steady to poll before reload "+strconv.Itoa(i+1), 20*time.Second, func() bool {
		return len(r.feeds["steady"].Requests()) >= before+3
	})
	if step.body == "INVALID" {
		bad := reloadDefaults("6s") + r.steady + r.src("s2", `interval = "soon"`) + r.src("s3") + r.src("s4")
		rh.write(bad)
		_, err := rh.d.Reload(t.Context(), false)
		var errs config.Errors
		if !errors.As(err, &errs) || !strings.Contains(err.Error(), rh.path+":") || !strings.Contains(err.Error(), `source "s2": interval: must be a duration`) {
			t.Fatalf("reload %d of an invalid edit: err = %v", i+1, err)
		}
		if v := metric(t, rh.d.Registry(), "ingestor_config_last_reload_successful"); v != 0 {
			t.Errorf("ingestor_config_last_reload_successful = %v after a refused reload, want 0", v)
		}
		if rh.d.pipeline.SourcePID("s4") == nil {
			t.Error("the refused edit stopped source s4")
		}
		return
	}
	if got := rh.reload(step.body); !samePlan(got, step.want) {
		t.Fatalf("reload %d: plan %v, want %v", i+1, got, step.want)
	}
	if v := metric(t, rh.d.Registry(), "ingestor_config_last_reload_successful"); v != 1 {
		t.Errorf("ingestor_config_last_reload_successful = %v after reload %d, want 1", v, i+1)
	}
	if pid := rh.d.pipeline.SourcePID("steady"); pid != r.steadyPID {
		t.Fatalf("reload %d replaced steady's actor (%v, was %v)", i+1, pid, r.steadyPID)
	}
}

// checkSource checks, once every source stopped, that source n's events
// delivered are exactly its records 1 to its durable cursor, each once,
// and that its cursor never went back.
func (r *reloadUnderLoad) checkSource(n string) {
	t := r.t
	t.Helper()
	c, _, err := r.rh.d.Queue().Cursor(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	upTo, err := strconv.Atoi(c)
	if err != nil || upTo < r.page {
		t.Fatalf("source %s: durable cursor %q, want a seq of at least one page", n, c)
	}
	for k := 1; k <= upTo; k++ {
		if c := r.seen.count(n + "/" + testupstream.ID(k)); c != 1 {
			t.Fatalf("%s/%s delivered %d times, want once (durable cursor %d)", n, testupstream.ID(k), c, upTo)
		}
	}
	if c := r.seen.count(n + "/" + testupstream.ID(upTo+1)); c != 0 {
		t.Errorf("%s/%s delivered past the durable cursor %d", n, testupstream.ID(upTo+1), upTo)
	}
	t.Logf("source %s: %d events delivered", n, upTo)
	// The cursor of each request is never behind an earlier one's: no
	// committed record is fetched again.
	last := -1
	for _, req := range r.feeds[n].Requests() {
		since, _ := strconv.Atoi(req.Query.Get("since"))
		if since < last {
			t.Fatalf("source %s fetched since=%d after since=%d: its cursor went back", n, since, last)
		}
		last = since
	}
}

// checkSteadyUndisturbed checks that steady started once and never missed
// a poll through the reloads.
func (r *reloadUnderLoad) checkSteadyUndisturbed() {
	t := r.t
	t.Helper()
	if n := strings.Count(r.rh.logs.String(), "msg=\"source started\" source=steady"); n != 1 {
		t.Errorf("steady started %d times, want once", n)
	}
	// steady never missed a poll: its longest gap between requests stays
	// near its interval (a loose bound for a loaded machine).
	reqs := r.feeds["steady"].Requests()
	var gap time.Duration
	for i := 1; i < len(reqs); i++ {
		gap = max(gap, reqs[i].Time.Sub(reqs[i-1].Time))
	}
	t.Logf("steady: %d polls, longest gap %v (interval 100ms)", len(reqs), gap)
	if gap > 5*time.Second {
		t.Errorf("steady went %v without a poll during the reloads", gap)
	}
}

// samePlan compares plans, treating nil and empty lists alike.
func samePlan(a, b config.Plan) bool {
	return slices.Equal(a.Start, b.Start) && slices.Equal(a.Stop, b.Stop) &&
		slices.Equal(a.Restart, b.Restart) && slices.Equal(a.Stay, b.Stay)
}

// TestWatchConfigFollowsAConfigMapSwap runs a daemon with watch_config on
// a config file laid out as Kubernetes mounts a ConfigMap: the file is a
// symlink into a "..data" symlink, which an update points at a new
// directory. Each swap is seen: a source added starts, an invalid edit is
// refused (the daemon runs on), a source removed stops.
func TestWatchConfigFollowsAConfigMapSwap(t *testing.T) {
	demo := func(name string) string {
		return fmt.Sprintf("\n[source.%s]\nkind = \"demo\"\ninterval = \"50ms\"\nevents_per_tick = 1\n", name)
	}
	rh := startReloadable(t, "watch_config = true", demo("a"), Options{watchInterval: 20 * time.Millisecond})
	dir := filepath.Dir(rh.path)
	// swap publishes body as the kubelet publishes a ConfigMap update: a
	// new timestamped directory, then ..data renamed over to point at it.
	version := 0
	swap := func(body string) {
		t.Helper()
		version++
		ts := filepath.Join(dir, fmt.Sprintf("..2026_11_24_%d", version))
		if err := os.Mkdir(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ts, "ingestor.toml"), []byte(rh.head+body), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	swap(demo("a") + demo("b"))
	link := rh.path + ".tmp"
	if err := os.Symlink("..data/ingestor.toml", link); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(link, rh.path); err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "source b to start once the file changed", 20*time.Second, func() bool {
		return rh.d.pipeline.SourcePID("b") != nil
	})
	aPID := rh.d.pipeline.SourcePID("a")

	swap(demo("a") + demo("b") + "\n[source.c]\nkind = \"no-such-kind\"\n")
	testsync.WaitFor(t, "the invalid edit to be refused", 20*time.Second, func() bool {
		return metric(t, rh.d.Registry(), "ingestor_config_last_reload_successful") == 0
	})
	if !strings.Contains(rh.logs.String(), `ingestor.toml:`) || !strings.Contains(rh.logs.String(), `source \"c\": kind: unknown kind`) {
		t.Errorf("the refusal is not logged with file:line:\n%s", rh.logs.String())
	}
	if c := rh.d.status(t.Context()).Config; c.File != rh.path || c.LastReloadSuccessful || c.LastReloadAt == nil ||
		!strings.Contains(c.LastReloadError, rh.path+":") || !strings.Contains(c.LastReloadError, `source "c": kind: unknown kind`) {
		t.Errorf("/status config after the refused reload: %+v", c)
	}

	swap(demo("a"))
	testsync.WaitFor(t, "source b to stop once the file changed", 20*time.Second, func() bool {
		return rh.d.pipeline.SourcePID("b") == nil && metric(t, rh.d.Registry(), "ingestor_config_last_reload_successful") == 1
	})
	if c := rh.d.status(t.Context()).Config; !c.LastReloadSuccessful || c.LastReloadError != "" || c.LastReloadSuccessAt != *c.LastReloadAt {
		t.Errorf("/status config after the applied reload: %+v", c)
	}
	if rh.d.pipeline.SourcePID("a") != aPID {
		t.Error("source a was restarted by edits that did not touch it")
	}
}

// TestWatchConfigSeesAnEditMadeBeforeItStarted edits the config file
// between its load and the daemon's start: the watch compares the file
// with the config the daemon runs, not with the file as it first read it,
// so the edit is applied. (Comparing with its first read, it missed such
// an edit when its goroutine started late on a loaded machine.)
func TestWatchConfigSeesAnEditMadeBeforeItStarted(t *testing.T) {
	demo := func(name string) string {
		return fmt.Sprintf("\n[source.%s]\nkind = \"demo\"\ninterval = \"50ms\"\nevents_per_tick = 1\n", name)
	}
	rh, cfg := loadReloadable(t, "watch_config = true", demo("a"))
	rh.write(demo("a") + demo("b"))
	startConfig(t, rh.harness, cfg, Options{watchInterval: 20 * time.Millisecond})
	// The source starts inside the reload, which is counted once done.
	testsync.WaitFor(t, "source b to start and the reload to be counted", 20*time.Second, func() bool {
		return rh.d.pipeline.SourcePID("b") != nil && metric(t, rh.d.Registry(), "ingestor_config_reloads_total", "result", "applied") > 0
	})
	if n := metric(t, rh.d.Registry(), "ingestor_config_reloads_total", "result", "applied"); n != 1 {
		t.Errorf("%v reloads applied, want 1", n)
	}
}
