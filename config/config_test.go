package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/sources"
)

const testdata = "../testdata/config"

// envOf returns a lookup func over a fixed environment.
func envOf(env map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}

// parseFile parses a file under testdata/config with env as the environment.
func parseFile(t *testing.T, name string, env map[string]string) (*Config, error) {
	t.Helper()
	path := filepath.Join(testdata, name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return ParseWithEnv(path, data, envOf(env))
}

// source returns the source called name, failing the test if there is none.
func source(t *testing.T, cfg *Config, name string) Source {
	t.Helper()
	for _, s := range cfg.Sources {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no source %q in %+v", name, cfg.Sources)
	return Source{}
}

// checkTestdata fails if a file matching pattern has no entry in names, so
// that a new testdata file cannot go untested.
func checkTestdata[V any](t *testing.T, pattern string, names map[string]V) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(testdata, pattern))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no %s files in %s", pattern, testdata)
	}
	for _, f := range files {
		if _, ok := names[filepath.Base(f)]; !ok {
			t.Errorf("%s has no entry in the test table", f)
		}
	}
}

func TestGoodFiles(t *testing.T) {
	tests := map[string]struct {
		env   map[string]string
		check func(t *testing.T, cfg *Config)
	}{
		"minimal.good.toml": {check: func(t *testing.T, cfg *Config) {
			want := &Config{
				Paths: []string{filepath.Join(testdata, "minimal.good.toml")},
				Files: []string{filepath.Join(testdata, "minimal.good.toml")},
				Daemon: Daemon{DataDir: "./data", HTTPAddr: "127.0.0.1:9464", LogLevel: "info",
					LogFormat: "text", ShutdownGrace: 30 * time.Second, MinFreeBytes: DefaultMinFreeBytes},
				RawStore: RawStore{URL: "file://./data/raw", Region: "us-east-1", MaxAttempts: 10, SpillDir: "./data/raw-spill", Retention: DefaultRawRetention},
				Publish: Publish{Endpoint: "tcp://127.0.0.1:5557", AckEndpoint: "tcp://127.0.0.1:5558",
					HighWaterMark: 1000, EventsPerFrame: 100, AckTimeout: 30 * time.Second,
					MaxInflightFrames: 256, MaxPendingEvents: 10_000_000, Synchronous: "full",
					DedupeWindow: time.Hour, PruneInterval: 30 * time.Second, DeadLetterRetention: 7 * 24 * time.Hour, AckMaxMessageBytes: 4 << 20, FrameCacheBytes: 16 << 20},
				Push:      Push{Addr: "127.0.0.1:9465"},
				Cluster:   Cluster{Name: "ingestor", LeaseTTL: 10 * time.Second, CheckpointInterval: time.Second, RebalanceDelay: 30 * time.Second, CompactInterval: 5 * time.Minute, MaxTxnOps: 128},
				Telemetry: Telemetry{Protocol: "grpc", SamplingRatio: 1, ServiceName: "ingestor", ExportTimeout: 10 * time.Second},
				Sources: []Source{{Name: "demo", Kind: "demo", Enabled: true, Interval: 10 * time.Second,
					Jitter: 0.1, Timeout: 30 * time.Second, InflightBatches: 2, MalformedRetries: 3, StartJitter: 5 * time.Second,
					Spec: &sources.DemoSpec{EventsPerTick: 100, EventSize: 256}, Line: 2}},
			}
			if !reflect.DeepEqual(cfg, want) {
				t.Errorf("got  %+v\nwant %+v", cfg, want)
			}
		}},
		"telemetry.good.toml": {check: func(t *testing.T, cfg *Config) {
			want := Telemetry{Endpoint: "https://otel.example:4318/custom/traces", Protocol: "http/protobuf",
				Headers: map[string]string{"x-api-key": "test-key"}, SamplingRatio: 0.01, ServiceName: "ingestor-eu", ExportTimeout: 10 * time.Second}
			if !reflect.DeepEqual(cfg.Telemetry, want) || !cfg.Telemetry.Enabled() {
				t.Errorf("telemetry = %+v, want %+v", cfg.Telemetry, want)
			}
		}},
		"empty.good.toml": {check: func(t *testing.T, cfg *Config) {
			if len(cfg.Sources) != 0 {
				t.Errorf("sources = %+v, want none", cfg.Sources)
			}
		}},
		"full_s3.good.toml": {check: func(t *testing.T, cfg *Config) {
			wantRaw := RawStore{URL: "s3://ingest-raw/prod/payloads", Endpoint: "http://127.0.0.1:9000",
				Region: "eu-west-1", PathStyle: true, MaxAttempts: 3, SpillDir: "/var/spool/ingestor/raw", Retention: 0}
			if cfg.RawStore != wantRaw {
				t.Errorf("raw store = %+v, want %+v", cfg.RawStore, wantRaw)
			}
			wantPub := Publish{Endpoint: "ipc:///run/ingestor/events.sock", AckEndpoint: "tcp://0.0.0.0:6001",
				HighWaterMark: 5000, EventsPerFrame: 500, AckTimeout: 45 * time.Second, MaxDeliveries: 10,
				MaxInflightFrames: 64, MaxPendingEvents: 2_000_000, Synchronous: "normal",
				DedupeWindow: 6 * time.Hour, PruneInterval: 150 * time.Second, DeadLetterRetention: 0, AckMaxMessageBytes: 8 << 20, FrameCacheBytes: 16 << 20}
			if cfg.Publish != wantPub {
				t.Errorf("publish = %+v, want %+v", cfg.Publish, wantPub)
			}
			wantDaemon := Daemon{DataDir: "/var/lib/ingestor", HTTPAddr: ":9464", AdminAddr: "unix:/run/ingestor/admin.sock", LogLevel: "debug",
				LogFormat: "json", ShutdownGrace: time.Minute, MinFreeBytes: 1 << 30}
			if cfg.Daemon != wantDaemon {
				t.Errorf("daemon = %+v, want %+v", cfg.Daemon, wantDaemon)
			}
			if names := []string{cfg.Sources[0].Name, cfg.Sources[1].Name}; names[0] != "orders-eu" || names[1] != "synthetic" {
				t.Errorf("sources = %v, want sorted [orders-eu synthetic]", names)
			}
			orders := source(t, cfg, "orders-eu")
			wantSpec := &sources.HTTPPollSpec{PollURL: "https://orders.example.com/api/orders?region=eu",
				Headers: map[string]string{"Accept": "application/json", "X-Client": "ingestor"},
				IDField: "order.id", CursorField: "order.updated_at", CursorParam: "updated_since",
				TimeField: "order.created_at", MaxBodyBytes: 1 << 20,
				// The kind's defaults for the keys the file leaves out.
				Method: "GET", Format: "json", CursorFrom: "record", Pagination: "none", PageStart: 1, MaxPages: 100, RateBurst: 1,
				SlowOnRateLimitHeaders: true}
			if !reflect.DeepEqual(orders.Spec, wantSpec) {
				t.Errorf("orders-eu spec = %+v, want %+v", orders.Spec, wantSpec)
			}
			if orders.Line != 41 || orders.Interval != 5*time.Second || orders.Jitter != 0 ||
				orders.Timeout != 3*time.Second || orders.InflightBatches != 8 {
				t.Errorf("orders-eu = %+v, want line 41 and [defaults] 5s 0%% 3s 8", orders)
			}
			synth := source(t, cfg, "synthetic")
			if synth.Enabled || !reflect.DeepEqual(synth.Spec, &sources.DemoSpec{EventsPerTick: 10, EventSize: 64, MalformedEvery: 3}) {
				t.Errorf("synthetic = %+v, spec %+v", synth, synth.Spec)
			}
		}},
		"env.good.toml": {
			env: map[string]string{"STATE_DIR": "/srv", "BUCKET": "acme-raw", "GITHUB_TOKEN": `s3cr3t"with'quotes`},
			check: func(t *testing.T, cfg *Config) {
				if cfg.Daemon.DataDir != "/srv/ingestor" || cfg.RawStore.URL != "s3://acme-raw/raw" {
					t.Errorf("data_dir %q, url %q: not interpolated", cfg.Daemon.DataDir, cfg.RawStore.URL)
				}
				gh := source(t, cfg, "github").Spec.(*sources.HTTPPollSpec)
				want := map[string]string{"Authorization": `Bearer s3cr3t"with'quotes`, "X-Literal": "${NOT_A_VAR}"}
				if !reflect.DeepEqual(gh.Headers, want) {
					t.Errorf("github headers = %q, want %q", gh.Headers, want)
				}
				// A disabled source is left as written.
				later := source(t, cfg, "later")
				if h := later.Spec.(*sources.HTTPPollSpec).Headers["Authorization"]; later.Enabled || h != "Bearer ${LATER_TOKEN}" {
					t.Errorf("later: enabled %v, Authorization %q", later.Enabled, h)
				}
			},
		},
		"ws_ingress.good.toml": {
			env: map[string]string{"DEVICES_TOKEN": "devices-0123456789abcdef", "DEVICE_TOKENS_FILE": "../testdata/config/device-tokens"},
			check: func(t *testing.T, cfg *Config) {
				want := &sources.WSIngressSpec{MaxMessageBytes: 1 << 20, Token: "devices-0123456789abcdef",
					TokensFile: "../testdata/config/device-tokens", MaxInflight: 8, ReadTimeout: "30s", PingInterval: "10s", MaxConnections: 500, SeqGapGrace: "1m", DeviceRetention: "720h"}
				if got := source(t, cfg, "devices").Spec; !reflect.DeepEqual(got, want) {
					t.Errorf("spec = %+v, want %+v", got, want)
				}
				if !source(t, cfg, "devices").Spec.(sources.PushSpec).Authenticated() {
					t.Error("a source with tokens is not Authenticated")
				}
			},
		},
		"admin.good.toml": {
			env: map[string]string{"INGESTOR_ADMIN_TOKEN": "0123456789abcdef0123456789abcdef"},
			check: func(t *testing.T, cfg *Config) {
				d := cfg.Daemon
				if d.HTTPAddr != "0.0.0.0:9464" || d.AdminAddr != "127.0.0.1:9465" || d.AdminToken != "0123456789abcdef0123456789abcdef" {
					t.Errorf("daemon = %+v", d)
				}
				if d.AdminListenAddr() != "127.0.0.1:9465" {
					t.Errorf("admin listen address %q, want admin_addr", d.AdminListenAddr())
				}
			},
		},
		"defaults.good.toml": {check: func(t *testing.T, cfg *Config) {
			for _, tc := range []struct {
				name              string
				interval, timeout time.Duration
				jitter            float64
				inflight          int
				malformedRetries  int
			}{
				{"inherits", time.Minute, 5 * time.Second, 0.25, 3, 5},
				{"overrides", 250 * time.Millisecond, time.Second, 0.025, 64, 0},
				{"partial", time.Minute, 12 * time.Second, 0.25, 3, 5},
			} {
				s := source(t, cfg, tc.name)
				if s.Interval != tc.interval || s.Timeout != tc.timeout || s.Jitter != tc.jitter || s.InflightBatches != tc.inflight ||
					s.MalformedRetries != tc.malformedRetries {
					t.Errorf("%s: interval %v timeout %v jitter %v inflight %d malformed_retries %d, want %v %v %v %d %d", tc.name,
						s.Interval, s.Timeout, s.Jitter, s.InflightBatches, s.MalformedRetries,
						tc.interval, tc.timeout, tc.jitter, tc.inflight, tc.malformedRetries)
				}
			}
			if spec := source(t, cfg, "partial").Spec.(*sources.HTTPPollSpec); spec.MaxBodyBytes != 64<<20 {
				t.Errorf("partial: max_body_bytes = %d, want the kind's default", spec.MaxBodyBytes)
			}
		}},
		"websocket_cursor.good.toml": {check: func(t *testing.T, cfg *Config) {
			spec, ok := source(t, cfg, "inurl").Spec.(*sources.WebSocketSpec)
			if !ok || spec.URL != "wss://stream.example.com/v1/events?since={cursor}" || spec.InitialCursor != "0" {
				t.Errorf("inurl spec %+v", spec)
			}
			if spec, ok := source(t, cfg, "inheader").Spec.(*sources.WebSocketSpec); !ok || spec.Headers["X-Since"] != "{cursor}" || spec.InitialCursor != "" {
				t.Errorf("inheader spec %+v", spec)
			}
		}},
		"webhook.good.toml": {
			env: map[string]string{"GITHUB_WEBHOOK_SECRET": "gh-secret", "STRIPE_WEBHOOK_SECRET": "whsec_x", "APP_TOKEN": "0123456789abcdef-app",
				"SVIX_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "SHOPIFY_SECRET": "shpss_0123", "CUSTOM_SECRET": "custom-0123", "NEW_SECRET": "new-0123", "OLD_SECRET": "old-4567"},
			check: func(t *testing.T, cfg *Config) {
				gh := source(t, cfg, "github").Spec.(*sources.WebhookSpec)
				if gh.Secret != "gh-secret" || gh.KeyHeader() != "X-GitHub-Delivery" || gh.KeyField() != "" || !gh.Authenticated() {
					t.Errorf("github = %+v: secret not interpolated or preset not applied", gh)
				}
				st := source(t, cfg, "stripe").Spec.(*sources.WebhookSpec)
				if st.KeyField() != "id" || st.KeyHeader() != "" || st.Tolerance() != 10*time.Minute {
					t.Errorf("stripe = %+v: preset or tolerance wrong", st)
				}
				app := source(t, cfg, "app").Spec.(*sources.WebhookSpec)
				if tok, err := app.BearerToken(); err != nil || tok != "0123456789abcdef-app" || app.KeyField() != "meta.event_id" || app.KeyHeader() != "X-Delivery" ||
					app.MaxBodyBytes != 65536 || app.Tolerance() != 5*time.Minute {
					t.Errorf("app = %+v (token %v)", app, err)
				}
				shop := source(t, cfg, "shop").Spec.(*sources.WebhookSpec)
				if shop.KeyHeader() != "X-Shopify-Webhook-Id" || shop.KeyField() != "" || shop.Secret != "shpss_0123" {
					t.Errorf("shop = %+v: key header %q, want X-Shopify-Webhook-Id", shop, shop.KeyHeader())
				}
				custom := source(t, cfg, "custom").Spec.(*sources.WebhookSpec)
				if custom.Secret != "custom-0123" || custom.HMACAlgorithm() != "sha512" || custom.HMACEncoding() != "base64" || custom.Prefix != "sha512=" ||
					custom.SignedContent != "{id}.{timestamp}.{body}" || custom.TimestampHeader != "X-Timestamp" || custom.KeyHeader() != "X-Event-Id" {
					t.Errorf("custom = %+v: the hmac keys not decoded", custom)
				}
				svix := source(t, cfg, "svix").Spec.(*sources.WebhookSpec)
				if keys, err := svix.SigningKeys(); err != nil || len(keys) != 1 || len(keys[0].Key) != 24 || svix.KeyHeader() != "webhook-id" || svix.KeyField() != "" {
					t.Errorf("svix = %+v: keys %v (%v), key header %q, want the whsec_ secret decoded and webhook-id",
						svix, len(keys), err, svix.KeyHeader())
				}
				if q, gh := source(t, cfg, "quarantined").Spec.(*sources.WebhookSpec), source(t, cfg, "github").Spec.(*sources.WebhookSpec); q.QuarantineSize != 0 ||
					q.QuarantineBodyBytes != 65536 || gh.QuarantineSize != 100 || gh.QuarantineBodyBytes != 4096 {
					t.Errorf("quarantine keys: quarantined %d/%d, want 0/65536; github %d/%d, want the defaults 100/4096",
						q.QuarantineSize, q.QuarantineBodyBytes, gh.QuarantineSize, gh.QuarantineBodyBytes)
				}
				for name, want := range map[string]string{"x": "crc_sha256", "github": "", "custom": ""} {
					if got := source(t, cfg, name).Spec.(*sources.WebhookSpec).HandshakeChallenge(); got != want {
						t.Errorf("%s: challenge %q, want %q", name, got, want)
					}
				}
				// secrets: a string, an inline table, an array of tables.
				end := time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC)
				for _, tc := range []struct {
					name string
					want []sources.SigningKey
				}{
					{"rotating", []sources.SigningKey{{Key: []byte("new-0123")}, {Key: []byte("old-4567"), NotAfter: end}}},
					{"rotating_tables", []sources.SigningKey{{Key: base64Key(t, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")},
						{Key: base64Key(t, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), NotAfter: end.Add(22 * time.Hour)}}},
				} {
					keys, err := source(t, cfg, tc.name).Spec.(*sources.WebhookSpec).SigningKeys()
					if err != nil || len(keys) != len(tc.want) {
						t.Fatalf("%s: keys %v (%v), want %v", tc.name, keys, err, tc.want)
					}
					for i, k := range keys {
						if string(k.Key) != string(tc.want[i].Key) || !k.NotAfter.Equal(tc.want[i].NotAfter) {
							t.Errorf("%s: key %d = %q not after %v, want %q not after %v", tc.name, i, k.Key, k.NotAfter, tc.want[i].Key, tc.want[i].NotAfter)
						}
					}
				}
			},
		},
		"cluster.good.toml": {
			env: map[string]string{"ETCD_PASSWORD": "etcd-s3cret"},
			check: func(t *testing.T, cfg *Config) {
				want := Cluster{Enabled: true, Name: "prod-eu", EtcdEndpoints: []string{"http://127.0.0.1:2379", "https://etcd-1.example:2379"},
					EtcdUsername: "ingestor", EtcdPassword: "etcd-s3cret", MemberName: "ingestor-0", AdvertiseHost: "ingestor-0.ingestor.svc",
					LeaseTTL: 15 * time.Second, CheckpointInterval: 2 * time.Second, RebalanceDelay: 0, CompactInterval: 10 * time.Minute, MaxTxnOps: 1024}
				if !reflect.DeepEqual(cfg.Cluster, want) {
					t.Errorf("cluster = %+v\nwant %+v", cfg.Cluster, want)
				}
				if m, err := cfg.Cluster.Member(); err != nil || m != "ingestor-0" {
					t.Errorf("member %q, %v", m, err)
				}
			},
		},
		"push_guard.good.toml": {
			env: pushGuardEnv(t),
			check: func(t *testing.T, cfg *Config) {
				if cfg.Push.ClientCAFile == "" || cfg.Push.TLSCertFile == "" {
					t.Errorf("push = %+v, want TLS and a client CA", cfg.Push)
				}
				gh := source(t, cfg, "github").Spec.(*sources.WebhookSpec)
				want := []string{"192.30.252.0/22", "2001:db8::/32", "203.0.113.7/32"}
				if p, err := gh.AllowedPrefixes(); err != nil || fmt.Sprint(p) != fmt.Sprint(want) || gh.LimiterName() != "hooks" || gh.RequireClientCert {
					t.Errorf("github = %+v: prefixes %v (%v), want %v and limiter hooks", gh.PushGuard, p, err, want)
				}
				dev := source(t, cfg, "devices").Spec.(*sources.WSIngressSpec)
				if !dev.RequireClientCert || dev.LimiterName() != "hooks" || len(dev.AllowCIDRs) != 1 {
					t.Errorf("devices = %+v", dev.PushGuard)
				}
			},
		},
		"has_more.good.toml": {check: func(t *testing.T, cfg *Config) {
			if spec, ok := source(t, cfg, "catchup").Spec.(*sources.HTTPPollSpec); !ok || spec.HasMoreField != "meta.has_more" {
				t.Errorf("catchup spec %+v", spec)
			}
		}},
		"rate_limiters.good.toml": {check: func(t *testing.T, cfg *Config) {
			if len(cfg.RateLimiters) != 1 {
				t.Fatalf("rate limiters = %+v, want one", cfg.RateLimiters)
			}
			l := cfg.RateLimiters[0]
			if l.Name != "github" || l.Burst != 10 || math.Abs(float64(l.Rate.Limit)-5000.0/3600) > 1e-9 || l.Line != 1 {
				t.Errorf("limiter = %+v, want github 5000/h burst 10 at line 1", l)
			}
			if n := source(t, cfg, "pulls").Spec.(*sources.HTTPPollSpec).LimiterName(); n != "github" {
				t.Errorf("pulls names limiter %q", n)
			}
		}},
	}
	checkTestdata(t, "*.good.toml", tests)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := parseFile(t, name, tc.env)
			if err != nil {
				t.Fatalf("unexpected error:\n%v", err)
			}
			tc.check(t, cfg)
			// Parsed again, the same file is the same config: a reload of
			// an unchanged file restarts nothing.
			again, err := parseFile(t, name, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if plan, err := diff(cfg, again, nil); err != nil || plan.Changes() {
				t.Errorf("the same file parsed twice differs: plan %v, err %v", plan, err)
			}
		})
	}
}

func TestBadFiles(t *testing.T) {
	tests := map[string]struct {
		env    map[string]string
		want   []string // each must appear in the error text
		absent []string // none may appear in it
	}{
		"unknown_key.bad.toml": {want: []string{
			`unknown_key.bad.toml:7: source "github": colour: unknown key`,
		}},
		"unknown_publish_key.bad.toml": {want: []string{
			`unknown_publish_key.bad.toml:5: publish.colour: unknown key`,
			`unknown_publish_key.bad.toml:6: publish.Ack_Timeout: unknown key`,
			`unknown_publish_key.bad.toml:8: deamon: unknown key`,
		}},
		"min_free_bytes.bad.toml": {want: []string{
			`min_free_bytes.bad.toml:3: daemon.min_free_bytes: must be 0 (no watermark) or more bytes, not -1`,
		}},
		"bad_duration.bad.toml": {want: []string{
			`bad_duration.bad.toml:4: daemon.shutdown_grace: must be a duration such as "500ms", "30s" or "1m30s", not "10 parsecs"`,
			`bad_duration.bad.toml:7: publish.ack_timeout: must be positive, not "-5s"`,
			`bad_duration.bad.toml:11: source "demo": interval: must be a duration`,
			`bad_duration.bad.toml:12: source "demo": timeout: must be a duration string such as "30s", not an integer`,
		}},
		"rate_limiters.bad.toml": {want: []string{
			`rate_limiters.bad.toml:2: rate_limiters.github.rate: "fast": want N/UNIT`,
			`rate_limiters.bad.toml:3: rate_limiters.github.burst: must be at least 1`,
			`rate_limiters.bad.toml:5: rate_limiters.empty.rate: is required, e.g. "10/s"`,
			`rate_limiters.bad.toml:10: source "issues": rate_limiter: no [rate_limiters.gitlab] block defines "gitlab"`,
			`rate_limiters.bad.toml:11: source "issues": rate_limit:`,
		}},
		"ws_ingress.bad.toml": {want: []string{
			`ws_ingress.bad.toml:3: source "devices": token: the token must be at least 16 characters`,
			`ws_ingress.bad.toml:4: source "devices": tokens_file: ../testdata/config/device-tokens.bad:3: want "DEVICE_ID TOKEN", found 1 fields`,
			`ws_ingress.bad.toml:5: source "devices": max_inflight: must be between 1 and 4096`,
			`ws_ingress.bad.toml:7: source "devices": ping_interval: must be shorter than read_timeout (10s)`,
			`ws_ingress.bad.toml:8: source "devices": max_connections: must be between 1 and 1000000`,
			`ws_ingress.bad.toml:9: source "devices": max_message_bytes: must be between 1 and 67108864`,
			`ws_ingress.bad.toml:11: source "devices": device_retention: must be "0" (keep every device) or a duration longer than seq_gap_grace (1h), such as "720h", not "30m"`,
			`ws_ingress.bad.toml:15: source "gateway": read_timeout: must be a positive duration such as "30s", not "soon"`,
			`ws_ingress.bad.toml:16: source "gateway": seq_gap_grace: must be a duration from "0s" to "24h", such as "1m", not "-1s"`,
		}, absent: []string{"tiny-tok", "0123456789abcdef"}},
		"webhook.bad.toml": {want: []string{
			`webhook.bad.toml:3: source "paths": id_field: must be a dotted path such as "id" or "meta.id", not "meta..id"`,
			`webhook.bad.toml:4: source "paths": time_field: must be a dotted path such as "id" or "meta.id", not ".at"`,
			`webhook.bad.toml:5: source "paths": required_fields: "" is not a dotted path`,
			`webhook.bad.toml:6: source "paths": id_header: "X Delivery" is not a valid header name`,
			`webhook.bad.toml:11: source "tokens": token_file: set token or token_file, not both`,
			`webhook.bad.toml:15: source "shorttoken": token: the token must be at least 16 characters`,
			`webhook.bad.toml:19: source "missingfile": token_file: read the token: open /nonexistent/hooks.token: no such file or directory`,
			`webhook.bad.toml:23: source "sig": signature: must be "github", "stripe", "slack", "standard", "shopify", "hmac" or "hmac_sha256", not "gitlab"`,
			`webhook.bad.toml:24: source "sig": signature_tolerance: must be a positive duration such as "30s", not "-1s"`,
			`webhook.bad.toml:26: source "nosecret": secret: is required with signature = "hmac_sha256"`,
			`webhook.bad.toml:26: source "nosecret": signature_header: is required with signature = "hmac_sha256" (e.g. "X-Signature")`,
			`webhook.bad.toml:32: source "secretonly": secret: is only used with a signature: set signature`,
			`webhook.bad.toml:33: source "secretonly": signature_header: is only used with signature = "hmac" or "hmac_sha256"`,
			`webhook.bad.toml:38: source "svix": secret: must be "whsec_" + base64 with signature = "standard" (the base64 of the signing key, as the provider shows it)`,
			`webhook.bad.toml:43: source "svixempty": secret: must be "whsec_" + base64 with signature = "standard"`,
			`webhook.bad.toml:45: source "shopnosecret": secret: is required with signature = "shopify"`,
			`webhook.bad.toml:49: source "hmacbad": signature_header: is required with signature = "hmac" (e.g. "X-Signature")`,
			`webhook.bad.toml:53: source "hmacbad": algorithm: must be "sha1", "sha256" or "sha512", not "md5"`,
			`webhook.bad.toml:54: source "hmacbad": encoding: must be "hex" or "base64", not "base32"`,
			`webhook.bad.toml:55: source "hmacbad": signed_content: unknown placeholder "{payload}" (want {body}, {timestamp} or {id})`,
			`webhook.bad.toml:62: source "hmacnobody": signed_content: must include {body}`,
			`webhook.bad.toml:64: source "hmacnobody": timestamp_header: is only used when signed_content has {timestamp}`,
			`webhook.bad.toml:70: source "hmacextra": algorithm: is only used with signature = "hmac"`,
			`webhook.bad.toml:71: source "hmacextra": encoding: is only used with signature = "hmac"`,
			`webhook.bad.toml:72: source "hmacextra": prefix: is only used with signature = "hmac"`,
			`webhook.bad.toml:73: source "hmacextra": signed_content: is only used with signature = "hmac"`,
			`webhook.bad.toml:74: source "hmacextra": timestamp_header: is only used with signature = "hmac"`,
			`webhook.bad.toml:80: source "bothsecrets": secrets: set secret or secrets, not both`,
			`webhook.bad.toml:85: source "emptysecrets": secrets: must list at least one secret`,
			`webhook.bad.toml:90: source "badsecrets": secrets.0: is empty`,
			`webhook.bad.toml:90: source "badsecrets": secrets.1: not_after must be an RFC 3339 time such as "2026-12-31T00:00:00Z", not "tomorrow"`,
			`webhook.bad.toml:90: source "badsecrets": secrets.2: unknown key "valu" (a secret is a string, or a table of value and an optional not_after)`,
			`webhook.bad.toml:90: source "badsecrets": secrets.3: must be a string, or a table of value and an optional not_after, not int64`,
			`webhook.bad.toml:90: source "badsecrets": secrets.4: must be "whsec_" + base64 with signature = "standard"`,
			`webhook.bad.toml:90: source "badsecrets": secrets.5: not_after needs a UTC offset, e.g. 2026-12-31T00:00:00Z`,
			`webhook.bad.toml:95: source "unsignedsecrets": secrets: is only used with a signature: set signature`,
			`webhook.bad.toml:101: source "badchallenge": challenge: must be "slack", "crc_sha256" or "none", not "twitter"`,
			`webhook.bad.toml:106: source "crcunsigned": challenge: "crc_sha256" needs a signature: its answer is an HMAC with the first secret`,
			`webhook.bad.toml:111: source "quarantine": quarantine_size: must be between 0 (keep none) and 10000, not -1`,
			`webhook.bad.toml:112: source "quarantine": quarantine_body_bytes: must be between 0 and 65536 (64 KiB), not 1048576`,
		}, absent: []string{"changeme", "s3cret-value", "not-base64"}},
		"telemetry.bad.toml": {want: []string{
			`telemetry.bad.toml:2: telemetry.endpoint: must be a URL: http://HOST:PORT (plaintext) or https://HOST:PORT (TLS), not "collector:4317"`,
			`telemetry.bad.toml:3: telemetry.protocol: must be one of "grpc" or "http/protobuf", not "zipkin"`,
			`telemetry.bad.toml:4: telemetry.sampling_ratio: must be from 0 to 1, not 1.5`,
			`telemetry.bad.toml:5: telemetry.cert_file: telemetry.cert_file and telemetry.key_file go together`,
			`telemetry.bad.toml:6: telemetry.service_name: must not be empty`,
			`telemetry.bad.toml:7: telemetry.export_timeout:`,
			`telemetry.bad.toml:9: telemetry.header_files: header "x-api-key" is set in telemetry.headers too`,
		}},
		"cluster.bad.toml": {want: []string{
			`cluster.bad.toml:3: cluster.name: must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit, not "prod/eu"`,
			`cluster.bad.toml:4: cluster.etcd_endpoints: "http://etcd-0.example:2379" is plain http beyond loopback: use https://`,
			`cluster.bad.toml:5: cluster.etcd_cert_file: needs cluster.etcd_key_file too: set both or neither`,
			`cluster.bad.toml:6: cluster.etcd_username: needs cluster.etcd_password or cluster.etcd_password_file`,
			`cluster.bad.toml:7: cluster.member_name: must be 1-63 letters`,
			`cluster.bad.toml:8: cluster.advertise_host: must be a host name or address that processors can reach, without a port, not "0.0.0.0"`,
			`cluster.bad.toml:9: cluster.lease_ttl: must be at least 2s (etcd grants leases in whole seconds), not "1s"`,
			`cluster.bad.toml:10: cluster.checkpoint_interval: must be at least 1s (etcd checkpoints`,
			`cluster.bad.toml:11: cluster.etcd_ca_file: ../testdata/config/device-tokens holds no PEM certificate`,
			`cluster.bad.toml:12: cluster.rebalance_delay: must be "0s" (off) or from 0s to 1h0m0s, not "2h"`,
			`cluster.bad.toml:13: cluster.compact_interval: must be "0s" (off) or from 10s to 24h0m0s, not "5s"`,
			`cluster.bad.toml:14: cluster.max_txn_ops: must be between 4 and 1048576, not 1`,
		}},
		"push.bad.toml": {want: []string{
			`push.bad.toml:6: push.tls_cert_file: needs push.tls_key_file too: set both or neither`,
			`push.bad.toml:9: source "hooks": kind: a webhook source on push.addr "0.0.0.0:9465", which is not loopback, must authenticate its senders`,
			`push.bad.toml:10: source "hooks": max_body_bytes: must be between 1 and 67108864 (64 MiB)`,
			`push.bad.toml:13: source "devices": kind: a ws_ingress source on push.addr "0.0.0.0:9465", which is not loopback, must authenticate its senders`,
		}},
		"push_guard.bad.toml": {want: []string{
			`push_guard.bad.toml:3: source "hooks": allow_cidrs: "10.0.0.0/33" is not a CIDR such as "192.30.252.0/22" or "2001:db8::/32"; ` +
				`"192.30.252.1/22" has bits set past its /22: did you mean "192.30.252.0/22"?; ` +
				`"github" is not a CIDR such as "192.30.252.0/22" or "2001:db8::/32", nor an address`,
			`push_guard.bad.toml:4: source "hooks": require_client_cert: needs push.client_ca_file, the CA that client certificates are verified against`,
			`push_guard.bad.toml:5: source "hooks": rate_limiter: no [rate_limiters.nope] block defines "nope"`,
			`push_guard.bad.toml:9: source "devices": allow_cidrs: "fe80::1%eth0" is not a CIDR`,
			`push_guard.bad.toml:10: source "devices": require_client_cert: needs push.client_ca_file`,
			`push_guard.bad.toml:20: source "typo": allow_cidr: unknown key`,
		}, absent: []string{`source "off"`}},
		"push_client_ca.bad.toml": {want: []string{
			`push_client_ca.bad.toml:2: push.client_ca_file: needs push.tls_cert_file and push.tls_key_file: client certificates are only asked for over TLS`,
		}},
		"push_client_ca_pem.bad.toml": {want: []string{
			`push_client_ca_pem.bad.toml:2: push.tls_cert_file: cannot load the certificate and key`,
			`push_client_ca_pem.bad.toml:4: push.client_ca_file: ../testdata/config/device-tokens holds no PEM certificate`,
		}},
		"missing_kind.bad.toml": {want: []string{
			`missing_kind.bad.toml:5: source "nokind": kind: is required (one of "demo", "http_poll", "sse", "webhook", "websocket" or "ws_ingress")`,
		}},
		"unknown_kind.bad.toml": {want: []string{
			`unknown_kind.bad.toml:3: source "feed": kind: unknown kind "rss" (want one of "demo", "http_poll", "sse", "webhook", "websocket" or "ws_ingress")`,
		}},
		"missing_poll_url.bad.toml": {want: []string{
			`missing_poll_url.bad.toml:3: source "github": poll_url: is required for kind http_poll`,
			`missing_poll_url.bad.toml:3: source "github": cursor_param: is required when cursor_field is set`,
		}},
		"malformed_retries.bad.toml": {want: []string{
			`malformed_retries.bad.toml:2: defaults.malformed_retries: must be between 0 and 100, not 101`,
			`malformed_retries.bad.toml:6: source "a": malformed_retries: must be between 0 and 100, not -1`,
			`malformed_retries.bad.toml:10: source "b": malformed_retries: must be an integer`,
		}},
		"bad_jitter.bad.toml": {want: []string{
			`bad_jitter.bad.toml:2: defaults.jitter: must be a percentage from "0%" to "100%" such as "10%", not "150%"`,
			`bad_jitter.bad.toml:6: source "a": jitter: must be a percentage from "0%" to "100%"`,
			`bad_jitter.bad.toml:10: source "b": jitter: must be a percentage string such as "10%", not an integer`,
		}},
		"credentials.bad.toml": {want: []string{
			`credentials.bad.toml:4: raw_store.access_key: credentials do not belong in the config file; ` +
				`use the standard AWS environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or credential chain`,
			`credentials.bad.toml:5: raw_store.aws_secret_access_key: credentials do not belong`,
		}, absent: []string{"AKIAEXAMPLE", "wJalrXUtnFEMI"}},
		"bad_retention.bad.toml": {want: []string{
			`bad_retention.bad.toml:3: raw_store.max_attempts: must be between 1 and 1000000, not 0`,
			`bad_retention.bad.toml:4: raw_store.spill_dir: must not be empty`,
			`bad_retention.bad.toml:5: raw_store.retention: must be "0" (keep every raw payload) or a duration of at least 1m0s such as "24h" or "168h", not "30s"`,
			`bad_retention.bad.toml:8: publish.dedupe_window: must be a duration such as "500ms", "30s" or "1m30s", not "a week"`,
			`bad_retention.bad.toml:9: publish.prune_interval: must be positive, not "0s"`,
			`bad_retention.bad.toml:10: publish.dead_letter_retention: must be "0" (keep every replayed and resolved dead letter) or a duration of at least 1s such as "168h" or "720h", not "forever"`,
		}},
		"bad_raw_store_url.bad.toml": {want: []string{
			`bad_raw_store_url.bad.toml:2: raw_store.url: must be file://DIR or s3://bucket[/prefix], not "/var/lib/ingestor/raw"`,
			`bad_raw_store_url.bad.toml:3: raw_store.endpoint: must be an absolute http or https URL`,
		}},
		"bad_s3_url.bad.toml": {want: []string{
			`bad_s3_url.bad.toml:2: raw_store.url: must be file://DIR or s3://bucket[/prefix] (invalid bucket name "My_Bucket")`,
		}},
		"unset_env.bad.toml": {env: map[string]string{"UNRELATED": "x"}, want: []string{
			`unset_env.bad.toml:4: raw_store.endpoint: environment variable S3_ENDPOINT is not set`,
			`unset_env.bad.toml:9: source "github": headers.Authorization: environment variable GITHUB_TOKEN is not set`,
		}},
		// Only the machine with its secrets has what it names: `ingestor
		// validate --offline` passes it (TestOffline).
		"offline.bad.toml": {want: []string{
			`offline.bad.toml:5: daemon.admin_token_file: read the admin token: open /nonexistent/secrets/admin.token: no such file or directory`,
			`offline.bad.toml:8: publish.curve_secret_key_file: stat /nonexistent/secrets/daemon.key: no such file or directory`,
			`offline.bad.toml:9: publish.curve_authorized_keys_file: open /nonexistent/secrets/processors.pub: no such file or directory`,
			`offline.bad.toml:13: push.tls_cert_file: cannot load the certificate and key: open /nonexistent/secrets/push.crt`,
			`offline.bad.toml:15: push.client_ca_file: read the client CAs: open /nonexistent/secrets/push-ca.crt`,
			`offline.bad.toml:20: cluster.etcd_ca_file: read the client CAs: open /nonexistent/secrets/etcd-ca.crt`,
			`offline.bad.toml:21: cluster.etcd_cert_file: cannot load the certificate and key: open /nonexistent/secrets/etcd.crt`,
			`offline.bad.toml:24: cluster.etcd_password_file: read the etcd password: open /nonexistent/secrets/etcd.password`,
			`offline.bad.toml:25: cluster.member_name: environment variable POD_NAME is not set`,
			`offline.bad.toml:26: cluster.advertise_host: environment variable POD_NAME is not set`,
			`offline.bad.toml:26: cluster.advertise_host: environment variable POD_NAMESPACE is not set`,
			`offline.bad.toml:31: source "orders": headers.Authorization: environment variable ORDERS_TOKEN is not set`,
			`offline.bad.toml:32: source "orders": tls_ca_file: open /nonexistent/secrets/orders-ca.crt`,
			`offline.bad.toml:36: source "hooks": token_file: read the token: open /nonexistent/secrets/hooks.token`,
			`offline.bad.toml:40: source "devices": tokens_file: read the device tokens: open /nonexistent/secrets/device-tokens`,
		}},
		"syntax.bad.toml": {want: []string{
			`syntax.bad.toml:5: invalid TOML: `,
		}},
		"curve.bad.toml": {want: []string{
			`curve.bad.toml:3: publish.curve_secret_key_file: stat ../testdata/curve/missing.key: no such file or directory`,
			`curve.bad.toml:4: publish.curve_authorized_keys_file: ../testdata/curve/bad_processors.pub:3: not a Z85 CURVE key: want 40 characters, got 39`,
		}, absent: []string{"TWcC#nTpAyRG"}},
		"curve_no_secret.bad.toml": {want: []string{
			`curve_no_secret.bad.toml:2: publish.curve_secret_key_file: is required when curve_authorized_keys_file is set`,
		}},
		"admin_public.bad.toml": {want: []string{
			`admin_public.bad.toml:3: daemon.http_addr: serves the admin endpoints (/dlq: read payloads, replay and drop dead letters) on ":9464", which is not loopback, ` +
				`so they need a token: set daemon.admin_token (e.g. "${INGESTOR_ADMIN_TOKEN}") or daemon.admin_token_file, ` +
				`or serve them on a private address with daemon.admin_addr`,
		}},
		"admin_keys.bad.toml": {want: []string{
			`admin_keys.bad.toml:4: daemon.admin_addr: must differ from daemon.http_addr`,
			`admin_keys.bad.toml:5: daemon.admin_token: the token must be at least 16 characters`,
		}, absent: []string{"changeme"}},
		"admin_token_file.bad.toml": {want: []string{
			`admin_token_file.bad.toml:5: daemon.admin_token_file: read the admin token: open /nonexistent/ingestor/admin.token: no such file or directory`,
		}, absent: []string{"not loopback"}},
		"admin_both.bad.toml": {want: []string{
			`admin_both.bad.toml:3: daemon.admin_addr: must be host:port or unix:PATH (the path is empty), not "unix:"`,
			`admin_both.bad.toml:5: daemon.admin_token_file: set daemon.admin_token or daemon.admin_token_file, not both`,
		}, absent: []string{"0123456789abcdef0123"}},
		"ack_max_message_bytes.bad.toml": {want: []string{
			`ack_max_message_bytes.bad.toml:3: publish.ack_max_message_bytes: must be between 65536 and 1073741824, not 1000`,
			`ack_max_message_bytes.bad.toml:4: publish.frame_cache_bytes: must be at least 0, not -1`,
		}},
		"websocket_cursor.bad.toml": {want: []string{
			`websocket_cursor.bad.toml:7: source "nowhere": cursor_field: is set but the cursor is sent nowhere, so every reconnect replays the feed from its start: put {cursor} in url, a header value or subscribe`,
			`websocket_cursor.bad.toml:11: source "nofield": url: uses {cursor} but cursor_field is not set`,
			`websocket_cursor.bad.toml:16: source "header": headers.X-Since: uses {cursor} but cursor_field is not set`,
			`websocket_cursor.bad.toml:21: source "initial": initial_cursor: is only used when the source keeps a cursor: set cursor_field`,
		}},
		"has_more.bad.toml": {want: []string{
			`has_more.bad.toml:8: source "record": has_more_field: requires cursor_from = "body" and cursor_body_field`,
			`has_more.bad.toml:17: source "path": has_more_field: must be a dotted path`,
		}},
		"many.bad.toml": {want: []string{
			`many.bad.toml:3: daemon.log_level: must be one of "debug", "info", "warn" or "error", not "verbose"`,
			`many.bad.toml:4: daemon.http_addr: must be host:port`,
			`many.bad.toml:8: publish.ack_endpoint: must differ from publish.endpoint`,
			`many.bad.toml:9: publish.events_per_frame: must be between 1 and 10000, not 0`,
			`many.bad.toml:10: publish.max_pending_events: must be an integer, not a string`,
			`many.bad.toml:11: publish.synchronous: must be one of "full" or "normal", not "off"`,
			`many.bad.toml:14: defaults.inflight_batches: must be between 1 and 64, not 100`,
			`many.bad.toml:15: defaults.retries: unknown key`,
			`many.bad.toml:17: source "bad name": invalid source name`,
			`many.bad.toml:19: source "bad name": interval: must be a duration`,
			`many.bad.toml:23: source "demo": events_per_tick: must be between 1 and 1000000`,
			`many.bad.toml:25: source "demo": colour: unknown key`,
			`many.bad.toml:27: source "api": cursor_param: is required when cursor_field is set`,
			`many.bad.toml:29: source "api": poll_url: must be an absolute http or https URL`,
			`many.bad.toml:30: source "api": cursor_field: must be a dotted path`,
			`many.bad.toml:31: source "api": headers.Authorization: must be a string, not an integer`,
		}},
	}
	checkTestdata(t, "*.bad.toml", tests)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := parseFile(t, name, tc.env)
			if err == nil {
				t.Fatalf("no error; config %+v", cfg)
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error is %T, want Errors: %v", err, err)
			}
			// Every listed error and nothing more: the count is that of
			// the list, as each entry names a distinct problem.
			if len(errs) != len(tc.want) {
				t.Errorf("got %d errors, want %d:\n%v", len(errs), len(tc.want), err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error output lacks %q; got:\n%v", w, err)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(err.Error(), a) {
					t.Errorf("error output reveals %q:\n%v", a, err)
				}
			}
			for _, e := range errs {
				if e.Line < 1 {
					t.Errorf("error without a line: %v", e)
				}
			}
		})
	}
}

func TestSecretsStayOutOfErrors(t *testing.T) {
	const secret = "hunter2-very-secret"
	data := []byte(`
[daemon]
shutdown_grace = "${GRACE}"
log_level = "${LEVEL}"
[raw_store]
url = "${STORE}"
[source.s]
kind = "${KIND}"
`)
	env := map[string]string{"GRACE": secret, "LEVEL": secret, "STORE": secret, "KIND": secret}
	_, err := ParseWithEnv("secret.toml", data, envOf(env))
	if err == nil {
		t.Fatal("no error")
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error reveals an environment value:\n%v", err)
	}
	for _, w := range []string{
		`secret.toml:3: daemon.shutdown_grace: must be a duration such as "500ms", "30s" or "1m30s", not "${GRACE}"`,
		`secret.toml:4: daemon.log_level: must be one of "debug", "info", "warn" or "error", not "${LEVEL}"`,
		`secret.toml:6: raw_store.url: must be file://DIR or s3://bucket[/prefix], not "${STORE}"`,
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error output lacks %q; got:\n%v", w, err)
		}
	}
}

func TestLoad(t *testing.T) {
	t.Setenv("STATE_DIR", "/srv")
	t.Setenv("BUCKET", "acme-raw")
	t.Setenv("GITHUB_TOKEN", "tok")
	path := filepath.Join(testdata, "env.good.toml")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Paths, []string{path}) || !slices.Equal(cfg.Files, []string{path}) || cfg.RawStore.URL != "s3://acme-raw/raw" {
		t.Errorf("paths %q, files %q, url %q", cfg.Paths, cfg.Files, cfg.RawStore.URL)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.toml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: %v, want os.ErrNotExist", err)
	}
}

func TestErrorFormat(t *testing.T) {
	es := Errors{
		{File: "ingestor.toml", Line: 12, Source: "github", Key: "poll_url", Msg: "is required for kind http_poll"},
		{File: "ingestor.toml", Line: 3, Key: "publish.ack_timeout", Msg: "must be positive"},
		{File: "ingestor.toml", Line: 1, Msg: "invalid TOML: oops"},
	}
	want := `ingestor.toml:12: source "github": poll_url: is required for kind http_poll
ingestor.toml:3: publish.ack_timeout: must be positive
ingestor.toml:1: invalid TOML: oops`
	if got := es.Error(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestKindKeysDoNotShadowCommonKeys guards against a kind declaring a key
// that every source block already takes, which the decoder would never fill.
func TestKindKeysDoNotShadowCommonKeys(t *testing.T) {
	common := map[string]bool{}
	rt := reflect.TypeFor[sourceTOML]()
	for i := range rt.NumField() {
		common[tagName(rt.Field(i))] = true
	}
	for _, kind := range sources.Kinds() {
		spec, _ := sources.NewSpec(kind)
		for _, f := range reflect.VisibleFields(reflect.TypeOf(spec).Elem()) {
			if name := tagName(f); common[name] {
				t.Errorf("kind %s declares %q, a key common to every source", kind, name)
			}
		}
	}
}

func TestDefaultAckMaxMessageBytes(t *testing.T) {
	for _, tc := range []struct {
		frames, events int
		want           int64
	}{
		{1024, 100, 4 << 20}, // the defaults: the entry cap counts
		{64, 500, 4 << 20},
		{80, 100, 2000 << 10},
		{10, 10, 1 << 20}, // the floor
		{1, 1, 1 << 20},
	} {
		if got := DefaultAckMaxMessageBytes(tc.frames, tc.events); got != tc.want {
			t.Errorf("DefaultAckMaxMessageBytes(%d, %d) = %d, want %d", tc.frames, tc.events, got, tc.want)
		}
	}
}

// base64Key returns b64 decoded.
func base64Key(t *testing.T, b64 string) []byte {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// pushGuardEnv writes a CA, a server certificate and its key for
// push_guard.good.toml and returns the environment naming them.
func pushGuardEnv(t *testing.T) map[string]string {
	pki := testsync.NewPKI(t)
	return map[string]string{"PUSH_TLS_CERT": pki.ServerCertFile, "PUSH_TLS_KEY": pki.ServerKeyFile, "PUSH_CLIENT_CA": pki.CAFile,
		"GITHUB_WEBHOOK_SECRET": "gh-secret", "DEVICES_TOKEN": "devices-0123456789abcdef"}
}
