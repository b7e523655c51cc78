package config

import (
	"time"

	"github.com/ingestorhq/ingestor/sources"
)

// Config is a loaded, validated configuration.
type Config struct {
	// Paths are what the config was loaded from, as given (each -c):
	// files, and directories standing for the *.toml files in them; none
	// for the embedded example. A reload reads them again, listing each
	// directory anew.
	Paths []string
	// Files are the files read, in order: Paths with each directory
	// replaced by its *.toml files in lexical order.
	Files []string
	// Skipped is what an offline check (Options.Offline) left unchecked;
	// empty otherwise. A config checked offline is for checking only: it
	// may hold ${NAME} references as written, and no secret read from a
	// file.
	Skipped  []Skipped
	Daemon   Daemon
	RawStore RawStore
	Publish  Publish
	Push     Push
	Cluster  Cluster
	// Telemetry is OpenTelemetry tracing ([telemetry]), off by default.
	Telemetry Telemetry
	// Sources holds every [source.NAME] block, enabled or not, sorted by name.
	Sources []Source
	// RateLimiters are the shared limiters, sorted by name.
	RateLimiters []RateLimiter
}

// Daemon holds process-wide settings ([daemon]).
type Daemon struct {
	// DataDir holds the SQLite queue and, by default, the raw store. Default "./data".
	DataDir string
	// HTTPAddr serves GET /metrics, /healthz and /readyz without
	// authentication and, unless AdminAddr is set, the admin endpoints
	// (GET /dlq, GET /dlq/{id}, POST /dlq/replay, POST /dlq/drop), which
	// require AdminToken when it is set. Default "127.0.0.1:9464".
	HTTPAddr string
	// AdminAddr, when set, serves the admin endpoints instead of HTTPAddr:
	// host:port, or unix:PATH for a Unix socket of mode 0600. Default "".
	AdminAddr string
	// AdminToken is the bearer token every admin request must carry, from
	// admin_token or admin_token_file; empty means none, which is allowed
	// only when the admin endpoints listen on loopback or a Unix socket.
	// It is never logged.
	AdminToken string
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
	// LogFormat is text or json. Default text.
	LogFormat string
	// ShutdownGrace bounds the drain on SIGTERM. Default 30s.
	ShutdownGrace time.Duration
	// WatchConfig reloads the config file when its contents change, as
	// SIGHUP does (checked every few seconds, so that a file replaced
	// through a symlink, as a Kubernetes ConfigMap is, counts too).
	// Default false.
	WatchConfig bool
	// MinFreeBytes is the free space the daemon keeps on the file systems
	// of its data dir and file raw store: below it, sources pause and push
	// sources answer 503 (delivery and acks go on, so retention frees
	// space), so the queue always has room to record acks. 0 turns the
	// watermark off; a write that fails for lack of space pauses them all
	// the same. Default DefaultMinFreeBytes.
	MinFreeBytes int64
}

// DefaultMinFreeBytes is daemon.min_free_bytes by default: 256 MiB.
const DefaultMinFreeBytes = 256 << 20

// RawStore says where raw payloads are made durable ([raw_store]).
type RawStore struct {
	// URL is file://DIR or s3://bucket/prefix. Default file://<data_dir>/raw.
	URL string
	// Endpoint overrides the S3 endpoint (S3-compatible servers).
	Endpoint string
	// Region is the S3 region. Default us-east-1.
	Region string
	// PathStyle selects path-style S3 addressing.
	PathStyle bool
	// MaxAttempts is how many failed writes of one batch are retried before
	// the batch is spilled to SpillDir (and then re-driven from there).
	// Default 10.
	MaxAttempts int
	// SpillDir holds batches the raw store could not take yet, until it
	// can. Default <data_dir>/raw-spill.
	SpillDir string
	// Retention is how long a raw object (a page segment, a whole
	// payload) is kept after its last write once nothing in the queue
	// needs it: no pending event and no dead letter points to it. 0 keeps
	// everything (for users who replay from raw). Default
	// DefaultRawRetention; at least MinRawRetention.
	Retention time.Duration
}

// DefaultRawRetention is [raw_store] retention's default: a day of raw
// payloads to replay or inspect, 24 times the default dedupe window.
const DefaultRawRetention = 24 * time.Hour

// DefaultDeadLetterRetention is [publish] dead_letter_retention's
// default: a week of replayed and resolved dead letters.
const DefaultDeadLetterRetention = 7 * 24 * time.Hour

// MinDeadLetterRetention is the least [publish] dead_letter_retention.
// Unlike raw retention it guards nothing but history: an inactive dead
// letter needs nothing more from the queue or the raw store.
const MinDeadLetterRetention = time.Second

// MinRawRetention is the least [raw_store] retention: a batch is committed
// (or given up and fetched again) within seconds of its raw write, and an
// object younger than this is never pruned whatever else holds.
const MinRawRetention = time.Minute

// Publish configures the write-ahead queue and ZeroMQ delivery ([publish]).
type Publish struct {
	// Endpoint is the ZeroMQ PUSH bind endpoint. Default tcp://127.0.0.1:5557.
	Endpoint string
	// AckEndpoint is the ZeroMQ PULL bind endpoint for acks. Default tcp://127.0.0.1:5558.
	AckEndpoint string
	// HighWaterMark is the ZeroMQ send/receive high-water mark in frames. Default 1000.
	HighWaterMark int
	// EventsPerFrame is how many events are packed into one frame. Default 100.
	EventsPerFrame int
	// AckTimeout is how long a sent frame waits for its ack before it is resent. Default 30s.
	AckTimeout time.Duration
	// MaxDeliveries caps deliveries of one frame; 0 means unlimited. Default 0.
	MaxDeliveries int
	// MaxInflightFrames caps frames sent and not yet acked; it also bounds
	// the frames ZeroMQ buffers in the daemon and in a processor that lags
	// (docs/performance.md, "Memory"). Default 256.
	MaxInflightFrames int
	// MaxPendingEvents is the queue limit: at or above it, polls pause. Default 10,000,000.
	MaxPendingEvents int64
	// Synchronous is the SQLite synchronous pragma, full or normal. Default full.
	Synchronous string
	// DedupeWindow is how long acked events are remembered so that a late
	// duplicate is recognised and dropped. Default 1h.
	DedupeWindow time.Duration
	// PruneInterval is how often remembered events older than DedupeWindow
	// are deleted. Default 30s.
	PruneInterval time.Duration
	// DeadLetterRetention is how long a dead letter stays readable after
	// it was replayed or resolved; then it is deleted, and its raw object
	// with it once raw retention passes. Active dead letters stay until
	// replayed or dropped. 0 keeps them all. Default
	// DefaultDeadLetterRetention, at least MinDeadLetterRetention.
	DeadLetterRetention time.Duration
	// CurveSecretKeyFile holds the daemon's CURVE secret key in Z85; with
	// it, both sockets are CURVE servers. Default "": plain sockets.
	CurveSecretKeyFile string
	// CurveAuthorizedKeysFile lists the processors' CURVE public keys, one
	// per line; only these may connect. Required with CurveSecretKeyFile.
	CurveAuthorizedKeysFile string
	// AckMaxMessageBytes is the largest ack message the ack socket takes
	// (ZMQ_MAXMSGSIZE). Default DefaultAckMaxMessageBytes.
	AckMaxMessageBytes int64
	// FrameCacheBytes bounds the committed frames the sender holds in
	// memory until they are sent, so that frames waiting for the in-flight
	// window are not read back; 0 holds none. Default DefaultFrameCacheBytes (16 MiB).
	FrameCacheBytes int64
}

// Source is one [source.NAME] block after inheriting [defaults].
type Source struct {
	// Name is NAME in [source.NAME].
	Name string
	// Kind selects the implementation in package sources.
	Kind string
	// Enabled sources are started; default true.
	Enabled bool
	// Interval is the time between fetches. Default 10s.
	Interval time.Duration
	// Jitter is the +/- fraction of Interval applied to each wait (0.1 for "10%"). Default 0.1.
	Jitter float64
	// Timeout bounds one fetch. Default 30s.
	Timeout time.Duration
	// StartJitter spreads the first poll after a start over
	// [0, min(StartJitter, Interval)], so that sources started together do
	// not fire at once, while a new feed polls within seconds, whatever
	// its interval; 0 polls at once. Default 5s.
	StartJitter time.Duration
	// InflightBatches is how many fetched batches may wait for durability
	// before the source stops fetching. Default 2.
	InflightBatches int
	// MalformedRetries is how many times a malformed answer to one request
	// is fetched again before it is dead-lettered; 0 dead-letters it at
	// once, as is always done for a payload that cannot be fetched again
	// (sources.MalformedError.Refetch). Default 3.
	MalformedRetries int
	// Spec is the kind-specific configuration, validated.
	Spec sources.Spec
	// Line is the line of the [source.NAME] header.
	Line int
}
