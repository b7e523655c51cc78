package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/ingestorhq/ingestor/config"
)

// maxIPCPath is the longest ipc:// path libzmq accepts (a Unix socket path,
// sun_path, is 108 bytes with its terminating NUL).
const maxIPCPath = 107

// benchConfig builds the daemon's config as TOML text, exactly as a user
// would write it, and loads it with the config package.
func benchConfig(o options, dir string) (*config.Config, error) {
	pub, ack := filepath.Join(dir, "pub.sock"), filepath.Join(dir, "ack.sock")
	if len(pub) > maxIPCPath {
		return nil, fmt.Errorf("-dir %s is too long for ipc:// endpoints (%d bytes, at most %d): use a shorter path",
			dir, len(pub), maxIPCPath)
	}
	data := filepath.Join(dir, "data")
	var b strings.Builder
	fmt.Fprintf(&b, `[daemon]
data_dir = %s
http_addr = "127.0.0.1:0"
shutdown_grace = "30s"

[raw_store]
url = %s

[publish]
endpoint = %s
ack_endpoint = %s
events_per_frame = %d
synchronous = %s
max_pending_events = 1000000000

[defaults]
interval = "1ms"
jitter = "0%%"
inflight_batches = 4
`, tomlString(data), tomlString("file://"+filepath.Join(data, "raw")),
		tomlString("ipc://"+pub), tomlString("ipc://"+ack), o.eventsPerFrame, tomlString(o.synchronous))
	for i := 1; i <= o.sources; i++ {
		fmt.Fprintf(&b, `
[source.bench%d]
kind = "demo"
events_per_tick = %d
event_size = %d
`, i, o.eventsPerTick, o.eventSize)
	}
	if o.mode == modeWebhook {
		webhookConfig(&b, o.signature)
	}
	cfg, err := config.Parse("ingestor-bench.toml", []byte(b.String()))
	if err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	if o.exactlyOnce {
		// The exactly-once processors are slower than the sources: pause
		// the sources at a modest queue, as an operator would, so the run
		// measures the processors instead of an ever-growing backlog.
		cfg.Publish.MaxPendingEvents = 100_000
	}
	return cfg, nil
}

// tomlString quotes s as a TOML basic string, with "${" escaped so that the
// config package does not read it as an environment variable.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range strings.ReplaceAll(s, "${", "$${") {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
