package config

import (
	"math"
	"net"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ingestorhq/ingestor/internal/curvekey"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// daemonTOML is [daemon] as written in the file.
type daemonTOML struct {
	DataDir        string   `toml:"data_dir"`
	HTTPAddr       string   `toml:"http_addr"`
	AdminAddr      string   `toml:"admin_addr"`
	AdminToken     string   `toml:"admin_token"`
	AdminTokenFile string   `toml:"admin_token_file"`
	LogLevel       string   `toml:"log_level"`
	LogFormat      string   `toml:"log_format"`
	ShutdownGrace  duration `toml:"shutdown_grace"`
	WatchConfig    bool     `toml:"watch_config"`
	MinFreeBytes   int64    `toml:"min_free_bytes"`
}

// daemonDefaults is [daemon] with its defaults.
func daemonDefaults() daemonTOML {
	return daemonTOML{
		DataDir:       "./data",
		HTTPAddr:      "127.0.0.1:9464",
		LogLevel:      "info",
		LogFormat:     "text",
		ShutdownGrace: "30s",
		MinFreeBytes:  DefaultMinFreeBytes,
	}
}

func (d *decoder) daemon(top map[string]toml.Primitive) Daemon {
	t := daemonDefaults()
	d.section(top, "daemon", &t)
	p := []string{"daemon"}
	if t.DataDir == "" {
		d.errAt(child(p, "data_dir"), "must not be empty")
	}
	if _, _, err := net.SplitHostPort(t.HTTPAddr); err != nil {
		d.errAt(child(p, "http_addr"), "must be host:port such as \"127.0.0.1:9464\" or \":9464\", not %s", d.show(child(p, "http_addr"), t.HTTPAddr))
	}
	if t.MinFreeBytes < 0 {
		d.errAt(child(p, "min_free_bytes"), "must be 0 (no watermark) or more bytes, not %d", t.MinFreeBytes)
	}
	d.oneOf(child(p, "log_level"), t.LogLevel, "debug", "info", "warn", "error")
	d.oneOf(child(p, "log_format"), t.LogFormat, "text", "json")
	token := d.adminToken(p, t.AdminToken, t.AdminTokenFile)
	if t.AdminAddr != "" {
		if msg := checkAdminAddr(t.AdminAddr); msg != "" {
			d.errAt(child(p, "admin_addr"), "%s, not %s", msg, d.show(child(p, "admin_addr"), t.AdminAddr))
		} else if t.AdminAddr == t.HTTPAddr && !strings.HasSuffix(t.AdminAddr, ":0") {
			d.errAt(child(p, "admin_addr"), "must differ from daemon.http_addr (leave it out to serve the admin endpoints there)")
		}
	}
	dm := Daemon{
		DataDir:       t.DataDir,
		HTTPAddr:      t.HTTPAddr,
		AdminAddr:     t.AdminAddr,
		AdminToken:    token,
		LogLevel:      t.LogLevel,
		LogFormat:     t.LogFormat,
		ShutdownGrace: d.duration(child(p, "shutdown_grace"), t.ShutdownGrace, 30*time.Second),
		WatchConfig:   t.WatchConfig,
		MinFreeBytes:  t.MinFreeBytes,
	}
	key := "http_addr"
	if t.AdminAddr != "" {
		key = "admin_addr"
	}
	// Offline, a token file is not read: it gives a token all the same.
	unread := d.offline && t.AdminTokenFile != ""
	if !unread && !d.covered(child(p, key)) && !d.covered(child(p, "admin_token")) && !d.covered(child(p, "admin_token_file")) {
		if msg := dm.AdminProblem(); msg != "" {
			d.errAt(child(p, key), "%s", msg)
		}
	}
	return dm
}

// rawStoreTOML is [raw_store] as written in the file.
type rawStoreTOML struct {
	URL         string   `toml:"url"`
	Endpoint    string   `toml:"endpoint"`
	Region      string   `toml:"region"`
	PathStyle   bool     `toml:"path_style"`
	MaxAttempts int      `toml:"max_attempts"`
	SpillDir    string   `toml:"spill_dir"`
	Retention   duration `toml:"retention"`
}

// rawStoreDefaults is [raw_store] with its defaults, for the data dir
// dataDir.
func rawStoreDefaults(dataDir string) rawStoreTOML {
	return rawStoreTOML{
		URL:         "file://" + strings.TrimSuffix(dataDir, "/") + "/raw",
		Region:      "us-east-1",
		MaxAttempts: 10,
		SpillDir:    strings.TrimSuffix(dataDir, "/") + "/raw-spill",
		Retention:   "24h",
	}
}

func (d *decoder) rawStore(top map[string]toml.Primitive, dataDir string) RawStore {
	t := rawStoreDefaults(dataDir)
	d.section(top, "raw_store", &t)
	p := []string{"raw_store"}
	if msg := checkStoreURL(t.URL); msg != "" {
		d.errAt(child(p, "url"), "%s, not %s", msg, d.show(child(p, "url"), t.URL))
	}
	if t.Endpoint != "" {
		if u, err := url.Parse(t.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			d.errAt(child(p, "endpoint"), "must be an absolute http or https URL such as \"http://127.0.0.1:9000\"")
		}
	}
	if t.Region == "" {
		d.errAt(child(p, "region"), "must not be empty")
	}
	d.intRange(child(p, "max_attempts"), int64(t.MaxAttempts), 1, 1_000_000)
	if t.SpillDir == "" {
		d.errAt(child(p, "spill_dir"), "must not be empty")
	}
	return RawStore{
		URL:         t.URL,
		Endpoint:    t.Endpoint,
		Region:      t.Region,
		PathStyle:   t.PathStyle,
		MaxAttempts: t.MaxAttempts,
		SpillDir:    t.SpillDir,
		Retention:   d.retention(child(p, "retention"), t.Retention),
	}
}

// retention parses [raw_store] retention: "0" keeps every raw payload,
// otherwise a duration of at least MinRawRetention.
func (d *decoder) retention(path []string, v duration) time.Duration {
	return d.keepFor(path, v, DefaultRawRetention, MinRawRetention, "keep every raw payload", `"24h" or "168h"`)
}

// keepFor parses a retention at path: "0" keeps everything (zero says
// what, for the error), otherwise a duration of at least least (examples
// gives two). A mistake is reported and def returned.
func (d *decoder) keepFor(path []string, v duration, def, least time.Duration, zero, examples string) time.Duration {
	if d.covered(path) {
		return def
	}
	if strings.TrimSpace(string(v)) == "0" {
		return 0
	}
	dur, err := time.ParseDuration(string(v))
	if err != nil || dur < least {
		d.errAt(path, `must be "0" (%s) or a duration of at least %v such as %s, not %s`,
			zero, least, examples, d.show(path, string(v)))
		return def
	}
	return dur
}

// s3Bucket matches an S3 bucket name.
var s3Bucket = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// checkStoreURL returns what is wrong with a raw store URL, or "". It
// accepts what package rawstore opens: file://DIR or s3://bucket[/prefix].
func checkStoreURL(s string) string {
	const want = "must be file://DIR or s3://bucket[/prefix]"
	scheme, rest, ok := strings.Cut(s, "://")
	switch {
	case !ok:
		return want
	case scheme == "file":
		if rest == "" {
			return want + " (the directory is empty)"
		}
		return ""
	case scheme != "s3":
		return want + " (unsupported scheme " + strconv.Quote(scheme) + ")"
	}
	u, err := url.Parse(s)
	if err != nil || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Port() != "" {
		return want
	}
	if !s3Bucket.MatchString(u.Host) {
		return want + " (invalid bucket name " + strconv.Quote(u.Host) + ")"
	}
	if prefix := strings.Trim(u.Path, "/"); prefix != "" && (path.Clean(prefix) != prefix || strings.Contains(prefix, "..")) {
		return want + " (the prefix must be a clean path without ..)"
	}
	return ""
}

// publishTOML is [publish] as written in the file.
type publishTOML struct {
	Endpoint           string   `toml:"endpoint"`
	AckEndpoint        string   `toml:"ack_endpoint"`
	HighWaterMark      int      `toml:"high_water_mark"`
	EventsPerFrame     int      `toml:"events_per_frame"`
	AckTimeout         duration `toml:"ack_timeout"`
	MaxDeliveries      int      `toml:"max_deliveries"`
	MaxInflightFrames  int      `toml:"max_inflight_frames"`
	MaxPendingEvents   int64    `toml:"max_pending_events"`
	Synchronous        string   `toml:"synchronous"`
	DedupeWindow       duration `toml:"dedupe_window"`
	PruneInterval      duration `toml:"prune_interval"`
	DeadLetterKeep     duration `toml:"dead_letter_retention"`
	AckMaxMessageBytes int64    `toml:"ack_max_message_bytes"`
	FrameCacheBytes    int64    `toml:"frame_cache_bytes"`
	CurveSecretKey     string   `toml:"curve_secret_key_file"`
	CurveAuthorized    string   `toml:"curve_authorized_keys_file"`
}

// publishDefaults is [publish] with its defaults.
func publishDefaults() publishTOML {
	return publishTOML{
		Endpoint:          "tcp://127.0.0.1:5557",
		AckEndpoint:       "tcp://127.0.0.1:5558",
		HighWaterMark:     1000,
		EventsPerFrame:    100,
		AckTimeout:        "30s",
		MaxInflightFrames: 256,
		MaxPendingEvents:  10_000_000,
		Synchronous:       "full",
		DedupeWindow:      "1h",
		PruneInterval:     "30s",
		DeadLetterKeep:    "168h",
		FrameCacheBytes:   DefaultFrameCacheBytes,
	}
}

// DefaultFrameCacheBytes is publish.frame_cache_bytes when it is not set.
const DefaultFrameCacheBytes = 16 << 20

func (d *decoder) publish(top map[string]toml.Primitive) Publish {
	t := publishDefaults()
	d.section(top, "publish", &t)
	p := []string{"publish"}
	for _, e := range []struct{ key, val string }{{"endpoint", t.Endpoint}, {"ack_endpoint", t.AckEndpoint}} {
		scheme, rest, _ := strings.Cut(e.val, "://")
		if (scheme != "tcp" && scheme != "ipc") || rest == "" {
			d.errAt(child(p, e.key), "must be a ZeroMQ endpoint tcp://HOST:PORT or ipc://PATH, not %s", d.show(child(p, e.key), e.val))
		}
	}
	if t.Endpoint == t.AckEndpoint {
		d.errAt(child(p, "ack_endpoint"), "must differ from publish.endpoint")
	}
	d.intRange(child(p, "high_water_mark"), int64(t.HighWaterMark), 0, math.MaxInt32)
	d.intRange(child(p, "events_per_frame"), int64(t.EventsPerFrame), 1, 10_000)
	d.intRange(child(p, "max_deliveries"), int64(t.MaxDeliveries), 0, math.MaxInt32)
	d.intRange(child(p, "max_inflight_frames"), int64(t.MaxInflightFrames), 1, math.MaxInt32)
	d.intRange(child(p, "max_pending_events"), t.MaxPendingEvents, 1, math.MaxInt64)
	d.oneOf(child(p, "synchronous"), t.Synchronous, "full", "normal")
	d.intRange(child(p, "frame_cache_bytes"), t.FrameCacheBytes, 0, 1<<40)
	d.curve(p, t.CurveSecretKey, t.CurveAuthorized)
	ackMax := DefaultAckMaxMessageBytes(t.MaxInflightFrames, t.EventsPerFrame)
	if d.docOf(p).md.IsDefined("publish", "ack_max_message_bytes") && d.intRange(child(p, "ack_max_message_bytes"), t.AckMaxMessageBytes, 64<<10, 1<<30) {
		ackMax = t.AckMaxMessageBytes
	}
	return Publish{
		Endpoint:          t.Endpoint,
		AckEndpoint:       t.AckEndpoint,
		HighWaterMark:     t.HighWaterMark,
		EventsPerFrame:    t.EventsPerFrame,
		AckTimeout:        d.duration(child(p, "ack_timeout"), t.AckTimeout, 30*time.Second),
		MaxDeliveries:     t.MaxDeliveries,
		MaxInflightFrames: t.MaxInflightFrames,
		MaxPendingEvents:  t.MaxPendingEvents,
		Synchronous:       t.Synchronous,
		DedupeWindow:      d.duration(child(p, "dedupe_window"), t.DedupeWindow, time.Hour),
		PruneInterval:     d.duration(child(p, "prune_interval"), t.PruneInterval, 30*time.Second),
		DeadLetterRetention: d.keepFor(child(p, "dead_letter_retention"), t.DeadLetterKeep, DefaultDeadLetterRetention,
			MinDeadLetterRetention, "keep every replayed and resolved dead letter", `"168h" or "720h"`),
		AckMaxMessageBytes:      ackMax,
		FrameCacheBytes:         t.FrameCacheBytes,
		CurveSecretKeyFile:      t.CurveSecretKey,
		CurveAuthorizedKeysFile: t.CurveAuthorized,
	}
}

// curve checks the CURVE key files of [publish]: both or neither, each
// readable and holding valid keys, the secret one private.
func (d *decoder) curve(p []string, secret, authorized string) {
	switch {
	case secret == "" && authorized == "":
		return
	case secret == "":
		d.errAt(child(p, "curve_secret_key_file"), "is required when curve_authorized_keys_file is set")
	case authorized == "":
		d.errAt(child(p, "curve_authorized_keys_file"), "is required when curve_secret_key_file is set: without it no processor could connect")
	}
	if secret != "" && d.readsFile(child(p, "curve_secret_key_file"), secret) {
		if _, err := curvekey.ReadSecret(secret); err != nil {
			d.errAt(child(p, "curve_secret_key_file"), "%v", err)
		}
	}
	if authorized != "" && d.readsFile(child(p, "curve_authorized_keys_file"), authorized) {
		if _, err := curvekey.ReadKeys(authorized); err != nil {
			d.errAt(child(p, "curve_authorized_keys_file"), "%v", err)
		}
	}
}

// DefaultAckMaxMessageBytes is publish.ack_max_message_bytes when it is
// not set: 256 bytes for each event that can be in flight at once
// (maxInflightFrames frames of eventsPerFrame events), enough to name each
// in one ack with a key of about 200 bytes, counting at most
// wire.MaxAckEntries events, since an ack names no more; and at least
// 1 MiB. With the default settings it is 4 MiB, which a valid ack sent
// right after a maximal one waits less than 100 ms for (make bench).
func DefaultAckMaxMessageBytes(maxInflightFrames, eventsPerFrame int) int64 {
	events := min(int64(max(maxInflightFrames, 1))*int64(max(eventsPerFrame, 1)), wire.MaxAckEntries)
	return max(events<<8, 1<<20)
}

// defaultsTOML is [defaults] as written in the file; sourceTOML holds the
// same keys for one source.
type defaultsTOML struct {
	Interval         duration `toml:"interval"`
	Jitter           percent  `toml:"jitter"`
	Timeout          duration `toml:"timeout"`
	InflightBatches  int      `toml:"inflight_batches"`
	MalformedRetries int      `toml:"malformed_retries"`
	StartJitter      duration `toml:"start_jitter"`
}

// sourceDefaults are the validated [defaults] that sources inherit.
type sourceDefaults struct {
	interval, timeout time.Duration
	jitter            float64
	inflightBatches   int
	malformedRetries  int
	startJitter       time.Duration
}

// defaultStartJitter is [defaults] start_jitter's default: a new feed
// shows data within seconds, and sources started together still spread.
const defaultStartJitter = 5 * time.Second

// defaultsDefaults is [defaults] with its defaults.
func defaultsDefaults() defaultsTOML {
	return defaultsTOML{Interval: "10s", Jitter: "10%", Timeout: "30s", InflightBatches: 2, MalformedRetries: 3, StartJitter: "5s"}
}

func (d *decoder) defaults(top map[string]toml.Primitive) sourceDefaults {
	t := defaultsDefaults()
	d.section(top, "defaults", &t)
	p := []string{"defaults"}
	return sourceDefaults{
		interval:         d.duration(child(p, "interval"), t.Interval, 10*time.Second),
		jitter:           d.percent(child(p, "jitter"), t.Jitter, 0.1),
		timeout:          d.duration(child(p, "timeout"), t.Timeout, 30*time.Second),
		inflightBatches:  d.inflight(child(p, "inflight_batches"), t.InflightBatches, 2),
		malformedRetries: d.malformedRetries(child(p, "malformed_retries"), t.MalformedRetries, 3),
		startJitter:      d.durationOrOff(child(p, "start_jitter"), t.StartJitter, defaultStartJitter, time.Millisecond, 24*time.Hour),
	}
}

// duration parses the positive duration v at path, or reports it and
// returns def.
func (d *decoder) duration(path []string, v duration, def time.Duration) time.Duration {
	if d.covered(path) {
		return def
	}
	dur, err := time.ParseDuration(string(v))
	switch {
	case err != nil:
		d.errAt(path, `must be a duration such as "500ms", "30s" or "1m30s", not %s`, d.show(path, string(v)))
	case dur <= 0:
		d.errAt(path, "must be positive, not %s", d.show(path, string(v)))
	default:
		return dur
	}
	return def
}

// percent parses the percentage v ("10%") at path into a fraction (0.1),
// or reports it and returns def.
func (d *decoder) percent(path []string, v percent, def float64) float64 {
	if d.covered(path) {
		return def
	}
	num, ok := strings.CutSuffix(strings.TrimSpace(string(v)), "%")
	f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if !ok || err != nil || math.IsNaN(f) || f < 0 || f > 100 {
		d.errAt(path, `must be a percentage from "0%%" to "100%%" such as "10%%", not %s`, d.show(path, string(v)))
		return def
	}
	return f / 100
}

// inflight checks inflight_batches at path, returning def when it is invalid.
func (d *decoder) inflight(path []string, v, def int) int {
	if d.covered(path) || !d.intRange(path, int64(v), 1, 64) {
		return def
	}
	return v
}

// malformedRetries checks malformed_retries at path, returning def when it
// is invalid.
func (d *decoder) malformedRetries(path []string, v, def int) int {
	if d.covered(path) || !d.intRange(path, int64(v), 0, 100) {
		return def
	}
	return v
}

// intRange reports v at path unless lo <= v <= hi; a hi of math.MaxInt32
// or more means "no upper bound worth mentioning" unless v exceeds it.
func (d *decoder) intRange(path []string, v, lo, hi int64) bool {
	if v >= lo && v <= hi {
		return true
	}
	switch {
	case hi < math.MaxInt32:
		d.errAt(path, "must be between %d and %d, not %d", lo, hi, v)
	case v < lo:
		d.errAt(path, "must be at least %d, not %d", lo, v)
	default:
		d.errAt(path, "must be at most %d, not %d", hi, v)
	}
	return false
}

// oneOf reports v at path unless it is one of allowed.
func (d *decoder) oneOf(path []string, v string, allowed ...string) {
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	d.errAt(path, "must be one of %s, not %s", quoteList(allowed), d.show(path, v))
}

// quoteList formats ["a", "b"] as `"a" or "b"`.
func quoteList(list []string) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = strconv.Quote(s)
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
