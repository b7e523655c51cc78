package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.yaml.in/yaml/v3"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
	"github.com/ingestorhq/ingestor/sources"
)

// The dashboard, the alert rules and their unit tests in deploy/.
const (
	dashboardPath  = "../../deploy/grafana/ingestor.json"
	rulesPath      = "../../deploy/prometheus/ingestor.rules.yml"
	rulesTestPath  = "../../deploy/prometheus/ingestor.rules.test.yml"
	deployREADME   = "../../deploy/README.md"
	runbookURLBase = "https://github.com/ingestorhq/ingestor/blob/main/deploy/README.md#"
)

// TestSourceIntervalMetric checks that every polled source exports its
// configured interval, which the IngestorSourceStale alert multiplies by 3.
func TestSourceIntervalMetric(t *testing.T) {
	h := startDaemon(t, "", "", `
[source.slow]
kind = "demo"
interval = "1h"

[source.fast]
kind = "demo"
interval = "2s"
`)
	testsync.WaitFor(t, "interval gauges", 10*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_source_interval_seconds", "source", "slow") == 3600 &&
			metric(t, h.d.Registry(), "ingestor_source_interval_seconds", "source", "fast") == 2
	})
}

// TestDeployMetricsExist runs a daemon with a polled source (http_poll on
// a finite feed), a source that crashes once, a webhook and a ws_ingress source and a
// processor, makes each labelled series appear (a full queue, a refused
// webhook, a malformed page, a device that skips and resets its seq, a
// restart), scrapes its /metrics over HTTP and
// fails naming every metric that the dashboard or the alert rules use and
// the daemon does not export.
func TestDeployMetricsExist(t *testing.T) {
	exported := scrapeBusyDaemon(t)
	refs := deployMetricNames(t)
	if len(refs) < 30 {
		t.Fatalf("only %d metric names found in deploy/: %v", len(refs), refs)
	}
	for _, name := range refs {
		if err := checkExported(exported, name); err != nil {
			t.Errorf("deploy/ uses %v", err)
		}
	}
	if !t.Failed() {
		t.Logf("%d metric names used in deploy/, each exported", len(refs))
	}
}

// TestDeployRulesPromtool runs promtool (Debian's prometheus package, which
// make test-deps installs) on the rules and their unit tests, and on every
// dashboard expression as a recording rule, so that none is invalid PromQL;
// every alert has a summary and a runbook in deploy/README.md.
func TestDeployRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed (apt-get install prometheus; make test-deps does): %v", err)
	}
	run := func(args ...string) {
		t.Helper()
		out, err := exec.CommandContext(t.Context(), promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("check", "rules", rulesPath)
	run("test", "rules", rulesTestPath)

	// Grafana's variables, replaced by what Grafana sends for "All".
	vars := strings.NewReplacer("$__rate_interval", "5m", "$source", ".*", "$instance", ".*")
	var recs []map[string]string
	for i, e := range dashboardExprs(t) {
		expr := vars.Replace(e)
		if strings.Contains(expr, "$") {
			t.Errorf("dashboard expression %q uses a variable the test does not know", e)
		}
		recs = append(recs, map[string]string{"record": fmt.Sprintf("dashboard:expr_%d", i), "expr": expr})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": recs}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard.rules.yml")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	run("check", "rules", file)
	if t.Failed() {
		for i, r := range recs {
			t.Logf("dashboard:expr_%d is %s", i, r["expr"])
		}
	}

	doc, err := os.ReadFile(deployREADME)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	alerts := 0
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			continue
		}
		alerts++
		if r.Annotations["summary"] == "" {
			t.Errorf("alert %s has no summary", r.Alert)
		}
		anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookURLBase)
		if !ok || !anchors[anchor] {
			t.Errorf("alert %s: runbook_url %q is not a heading of deploy/README.md", r.Alert, r.Annotations["runbook_url"])
		}
	}
	if alerts < 10 {
		t.Errorf("only %d alerts in %s", alerts, rulesPath)
	}
}

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// rule is one rule of a Prometheus rule file.
type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// dashboardExprs returns the PromQL of every panel target of the dashboard,
// and the metric selector of every label_values() variable query.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
			Panels []json.RawMessage `json:"panels"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var exprs []string
	for _, p := range d.Panels {
		if len(p.Panels) > 0 {
			t.Fatalf("%s: collapsed rows hide their panels from this test; keep rows expanded", dashboardPath)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_]\w*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("%s: variable query %s: %v", dashboardPath, v.Query, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("%s: variable query %q is not label_values(selector, label)", dashboardPath, q.Query)
		}
		exprs = append(exprs, m[1])
	}
	return exprs
}

// deployMetricNames returns the metric names used by the dashboard and the
// alert rules, sorted.
func deployMetricNames(t *testing.T) []string {
	t.Helper()
	exprs := dashboardExprs(t)
	for _, r := range loadRules(t) {
		exprs = append(exprs, r.Expr)
	}
	var names []string
	for _, e := range exprs {
		n, err := promqlMetricNames(e)
		if err != nil {
			t.Fatal(err)
		}
		if len(n) == 0 {
			t.Errorf("no metric name found in %q", e)
		}
		names = append(names, n...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// checkExported says why name, used in a query, names no series of the
// exported families (name to type): absent, or a histogram's base name
// (whose series are name_bucket, name_sum and name_count).
func checkExported(types map[string]string, name string) error {
	switch types[name] {
	case "":
	case "histogram", "summary":
		return fmt.Errorf("%s, a %s: its series are %[1]s_bucket, %[1]s_sum and %[1]s_count", name, types[name])
	default:
		return nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if typ := types[base]; ok && (typ == "histogram" || typ == "summary" && suffix != "_bucket") {
			return nil
		}
	}
	return fmt.Errorf("%s, which the daemon does not export", name)
}

// promqlKeywords are the PromQL words that are not metric names, and the
// aggregation operators, which may be followed by "by (...)" instead of "(".
var promqlKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true, "start": true, "end": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
	"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}

// labelListWords are the PromQL words followed by a parenthesised list of
// label names.
var labelListWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promqlMetricNames returns the metric names an expression selects, in
// order: identifiers that are not functions or aggregations (followed by
// "("), keywords, label names (in {...} or in by (...) and the like),
// numbers, durations or strings.
func promqlMetricNames(expr string) ([]string, error) {
	var names []string
	labelList := false
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			end := i + 1
			for ; end < len(expr) && expr[end] != c; end++ {
				if expr[end] == '\\' && c != '`' {
					end++
				}
			}
			if end >= len(expr) {
				return nil, fmt.Errorf("unterminated string in %q", expr)
			}
			i = end + 1
		case c == '{' || c == '[':
			closer := map[byte]byte{'{': '}', '[': ']'}[c]
			end := i + 1
			for ; end < len(expr) && expr[end] != closer; end++ {
				if q := expr[end]; q == '"' || q == '\'' || q == '`' {
					for end++; end < len(expr) && expr[end] != q; end++ {
						if expr[end] == '\\' && q != '`' {
							end++
						}
					}
				}
			}
			if end >= len(expr) {
				return nil, fmt.Errorf("unclosed %q in %q", c, expr)
			}
			i = end + 1
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdentByte(expr[i]) || expr[i] == '.') {
				i++
			}
		case c == ')':
			labelList = false
			i++
		case isIdentByte(c):
			end := i
			for end < len(expr) && isIdentByte(expr[end]) {
				end++
			}
			word := expr[i:end]
			next := strings.TrimLeft(expr[end:], " \t\r\n")
			switch {
			case labelList:
			case labelListWords[word] && strings.HasPrefix(next, "("):
				labelList = true
			case strings.HasPrefix(next, "("):
			case promqlKeywords[strings.ToLower(word)]:
			default:
				names = append(names, word)
			}
			i = end
		default:
			i++
		}
	}
	return names, nil
}

func isIdentByte(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// TestPromQLMetricNames checks the extraction on the constructs deploy/
// uses, so that TestDeployMetricsExist cannot pass by finding nothing.
func TestPromQLMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`histogram_quantile(0.99, sum by (instance, le) (rate(a_seconds_bucket{instance=~"$i",x="{"}[$__rate_interval])))`: {"a_seconds_bucket"},
		`deriv(q[15m]) > 0 and q > 1000`:                                {"q", "q"},
		`x > clamp_min(3 * y{source="a b"}, 300)`:                       {"x", "y"},
		`sum by (job, source) (p{result=~"error|wait"}) unless last`:    {"p", "last"},
		`a / on (source) group_left (kind) b offset 5m`:                 {"a", "b"},
		"c # a comment with words\n + sum(d) without (le) + Inf + 1e3":  {"c", "d"},
		`count(up == bool 1) or vector(0)`:                              {"up"},
		`increase(ingestor:recorded_rule[10m]) > 0 and time() - t > 60`: {"ingestor:recorded_rule", "t"},
		`max without (le) (m) + sum(n{a="b"}) by (source)`:              {"m", "n"},
	} {
		got, err := promqlMetricNames(expr)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("promqlMetricNames(%q) = %q, %v; want %q", expr, got, err, want)
		}
	}
	for _, bad := range []string{`a{b="c}`, `rate(a[5m)`, `"open`} {
		if _, err := promqlMetricNames(bad); err == nil {
			t.Errorf("promqlMetricNames(%q) = nil error, want one", bad)
		}
	}
}

// scrapeBusyDaemon starts a daemon whose every labelled series exists and
// returns the metric families (name to type) its /metrics serves.
func scrapeBusyDaemon(t *testing.T) map[string]string {
	h := startBusyDaemon(t)
	reg := h.d.Registry()

	// With no processor the queue fills: polled pauses and a push is busy.
	testsync.WaitFor(t, "polled to pause on the full queue", 30*time.Second, func() bool {
		return metric(t, reg, "ingestor_source_paused", "source", "polled") == 1
	})
	postBusyWebhook(t, h, "hooks-token-0123456789", http.StatusTooManyRequests)
	postBusyWebhook(t, h, "", http.StatusUnauthorized)

	h.startProcessor(func(context.Context, *processor.Event) error { return nil })
	testsync.WaitFor(t, "acks, a malformed page and a restart", 30*time.Second, func() bool {
		return metric(t, reg, "ingestor_frames_acked_total") > 0 &&
			metric(t, reg, "ingestor_source_malformed_total", "source", "polled") > 0 &&
			metric(t, reg, "ingestor_actor_restarts_total", "actor", "source-boom") > 0
	})

	// A device stores seq 1, 3 (2 is lost at once: the grace is 0s) and
	// then 1 again under a new event id (its outbox was reset).
	conn, _, err := websocket.Dial(t.Context(), "ws://"+h.d.PushAddr()+"/ingest/devices/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer devices-token-0123456789"}}})
	if err != nil {
		t.Fatalf("dial the device socket: %v", err)
	}
	defer func() {
		if err := conn.Close(websocket.StatusNormalClosure, ""); err != nil {
			t.Errorf("close the device socket: %v", err)
		}
	}()
	checkDeviceGapAndReset(t, h, conn)

	// The feed is finite, so the queue empties; nothing in flight when the
	// processor stops keeps the shutdown from waiting for acks.
	testsync.WaitFor(t, "every event acked", 30*time.Second, func() bool { return h.d.Queue().PendingEvents() == 0 })
	return scrapeMetricTypes(t, h)
}

// startBusyDaemon starts a daemon with a small queue and a source of every
// kind: a polled feed that serves a malformed page, a webhook, a device
// socket with no grace for a seq gap, and a source that crashes once.
func startBusyDaemon(t *testing.T) *harness {
	t.Helper()
	feed := testupstream.New(t, 50, 100)
	feed.ServeMalformed(testupstream.Truncated)
	dir := t.TempDir()
	pub, ack := testconfig.FreeEndpoints(t)
	cfg := testconfig.Daemon{
		Dir: dir, DataDir: dir, HTTPAddr: "127.0.0.1:0", ShutdownGrace: "10s",
		Publish: pub, Ack: ack, PublishKeys: "max_pending_events = 20",
		Rest: `[push]
addr = "127.0.0.1:0"

` + httpSource("polled", feed.URL) + `

[source.hooks]
kind = "webhook"
token = "hooks-token-0123456789"

[source.devices]
kind = "ws_ingress"
token = "devices-token-0123456789"
seq_gap_grace = "0s"
`,
	}.Parse(t, "deploy.toml")
	cfg.Sources = append(cfg.Sources, config.Source{Name: "boom", Kind: "crash_once", Enabled: true,
		Interval: 50 * time.Millisecond, Timeout: time.Second, InflightBatches: 1, Spec: crashOnceSpec{crashed: &atomic.Bool{}}})
	return startConfig(t, &harness{t: t, dir: dir, pub: cfg.Publish.Endpoint, ack: cfg.Publish.AckEndpoint}, cfg, Options{})
}

// postBusyWebhook posts an event to the webhook source hooks of h with the
// bearer token, if any, and fails unless it answers want.
func postBusyWebhook(t *testing.T, h *harness, token string, want int) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+h.d.PushAddr()+"/ingest/hooks", strings.NewReader(`{"n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Error(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("webhook answered %d, want %d", resp.StatusCode, want)
	}
}

// checkDeviceGapAndReset has the device on conn store seq 1, 3, 4 and 1
// again, waits for the seq gap and the reset to be counted, and checks
// that /status says which device lost what.
func checkDeviceGapAndReset(t *testing.T, h *harness, conn *websocket.Conn) {
	t.Helper()
	reg := h.d.Registry()
	for n, seq := range []int{1, 3, 4, 1} {
		msg := fmt.Sprintf(`{"schema_version":1,"event_id":"e-%d","type":"flow","ts":"2026-11-24T09:00:00Z","session_id":"boot-1","device_id":"pump-1","seq":%d,"payload":{}}`, n, seq)
		storeEnvelope(t, conn, msg)
	}
	testsync.WaitFor(t, "a seq gap and a reset", 10*time.Second, func() bool {
		return metric(t, reg, "ingestor_device_seq_gaps_total", "source", "devices") > 0 &&
			metric(t, reg, "ingestor_device_seq_resets_total", "source", "devices") > 0
	})
	// /status says which device lost what.
	for _, s := range h.d.status(t.Context()).Sources {
		if s.Name != "devices" {
			continue
		}
		if d := s.Devices; d == nil || d.Devices != 1 || d.Gaps != 1 || d.Lost != 1 || d.Resets != 1 ||
			len(d.Notable) != 1 || d.Notable[0].Device != "pump-1" || d.Notable[0].LastSeq != 1 {
			t.Errorf("status of the device source: %+v", d)
		}
	}
}

// scrapeMetricTypes scrapes the /metrics of h and returns its metric
// families, name to type.
func scrapeMetricTypes(t *testing.T, h *harness) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + h.d.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatalf("scrape /metrics: %v", err)
	}
	defer func() {
		if err := resp.Body.Close(); err != nil {
			t.Error(err)
		}
	}()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape /metrics: %s", resp.Status)
	}
	types := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape /metrics: %v", err)
	}
	return types
}

// crashOnceSpec is a source kind whose first fetch panics, for one actor
// restart, and whose later fetches fail (retried with backoff). A source
// that crashes again and again is restarted while the daemon drains, which
// delays the shutdown to its context's deadline.
type crashOnceSpec struct{ crashed *atomic.Bool }

func (crashOnceSpec) Validate() []sources.FieldError { return nil }

func (s crashOnceSpec) Open(sources.Env) (sources.Source, error) { return crashOnceSource(s), nil }

type crashOnceSource struct{ crashed *atomic.Bool }

func (s crashOnceSource) Fetch(context.Context, string) (*sources.Batch, error) {
	if s.crashed.CompareAndSwap(false, true) {
		panic("this source crashes once")
	}
	return nil, errors.New("this source has nothing")
}

func (crashOnceSource) Close() error { return nil }

// storeEnvelope sends msg on a device connection until it is answered
// stored (a full queue answers retry).
func storeEnvelope(t *testing.T, conn *websocket.Conn, msg string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := conn.Write(t.Context(), websocket.MessageText, []byte(msg)); err != nil {
			t.Fatalf("send an envelope: %v", err)
		}
		_, b, err := conn.Read(t.Context())
		if err != nil {
			t.Fatalf("read an answer: %v", err)
		}
		var a struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("answer %s: %v", b, err)
		}
		switch {
		case a.Status == "stored":
			return
		case a.Status != "retry" || time.Now().After(deadline):
			t.Fatalf("envelope %s answered %s, want stored", msg, b)
		}
	}
}
