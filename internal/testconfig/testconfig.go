// Package testconfig is the one template of a daemon config that tests
// start daemons on: [daemon], [raw_store] and [publish], with what a test
// sets and nothing else, and the test's own tables after them. Tests then
// differ only in what they set, and a key renamed in the config changes
// here once.
package testconfig

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// Daemon is the config of a daemon under test. A field left empty leaves
// its key out, so the daemon's default applies, except the data dir and
// the raw store, which Dir places.
type Daemon struct {
	// Dir holds the daemon's files: data_dir is Dir/data and the raw
	// store a file store in Dir/raw, unless DataDir or RawStore say
	// otherwise.
	Dir string
	// DataDir is daemon.data_dir, when not Dir/data.
	DataDir string
	// HTTPAddr is daemon.http_addr (host:port, "127.0.0.1:0" for any
	// free port).
	HTTPAddr string
	// JSONLogs sets daemon.log_format = "json", for tests that read a
	// built daemon's logs.
	JSONLogs bool
	// ShutdownGrace is daemon.shutdown_grace ("10s").
	ShutdownGrace string
	// DaemonKeys are more [daemon] keys, one per line.
	DaemonKeys string
	// RawStore is the [raw_store] keys, when not a file store in Dir/raw.
	RawStore string
	// Publish and Ack are publish.endpoint and publish.ack_endpoint
	// (tcp://host:port); FreeEndpoints gives two on free loopback ports.
	Publish, Ack string
	// PublishKeys are more [publish] keys, one per line.
	PublishKeys string
	// Rest follows the three tables: the sources and any other table.
	Rest string
}

// FreeEndpoints returns publish and ack endpoints on free loopback ports.
func FreeEndpoints(t testing.TB) (publish, ack string) {
	t.Helper()
	return "tcp://" + testsync.FreePort(t), "tcp://" + testsync.FreePort(t)
}

// TOML returns c as a config file.
func (c Daemon) TOML() string {
	var b strings.Builder
	line := func(key, value string) {
		if value != "" {
			fmt.Fprintf(&b, "%s = %q\n", key, value)
		}
	}
	keys := func(lines string) {
		if lines = strings.TrimSpace(lines); lines != "" {
			b.WriteString(lines + "\n")
		}
	}
	b.WriteString("[daemon]\n")
	line("data_dir", c.dataDir())
	line("http_addr", c.HTTPAddr)
	if c.JSONLogs {
		line("log_format", "json")
	}
	line("shutdown_grace", c.ShutdownGrace)
	keys(c.DaemonKeys)
	b.WriteString("\n[raw_store]\n")
	if c.RawStore != "" {
		keys(c.RawStore)
	} else {
		line("url", "file://"+filepath.Join(c.Dir, "raw"))
	}
	b.WriteString("\n[publish]\n")
	line("endpoint", c.Publish)
	line("ack_endpoint", c.Ack)
	keys(c.PublishKeys)
	b.WriteString("\n")
	b.WriteString(c.Rest)
	return b.String()
}

func (c Daemon) dataDir() string {
	if c.DataDir != "" {
		return c.DataDir
	}
	return filepath.Join(c.Dir, "data")
}

// Write writes c to path and returns path.
func (c Daemon) Write(t testing.TB, path string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(c.TOML()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Parse returns c parsed as the file named file; a config that does not
// parse fails the test, showing its text.
func (c Daemon) Parse(t testing.TB, file string) *config.Config {
	t.Helper()
	text := c.TOML()
	cfg, err := config.Parse(file, []byte(text))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, text)
	}
	return cfg
}
