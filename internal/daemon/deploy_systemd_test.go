package daemon

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
)

// systemdUnitPath is the daemon's systemd unit.
const systemdUnitPath = "../../deploy/ingestor.service"

// TestDeploySystemdUnit checks the settings of deploy/ingestor.service that
// the daemon's behaviour depends on: SIGHUP reloads the config, so
// `systemctl reload` must send it; SIGTERM drains, so the stop timeout must
// outlast the default shutdown_grace.
func TestDeploySystemdUnit(t *testing.T) {
	data, err := os.ReadFile(systemdUnitPath)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	section := ""
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Errorf("%s: %q is not KEY=VALUE", systemdUnitPath, line)
			}
			keys[section+k] = append(keys[section+k], v)
		}
	}
	one := func(key string) string {
		t.Helper()
		v := keys["[Service]"+key]
		if len(v) != 1 {
			t.Errorf("[Service] %s is set %d times, want once", key, len(v))
			return ""
		}
		return v[0]
	}
	if got := one("ExecReload"); got != "/bin/kill -HUP $MAINPID" {
		t.Errorf("ExecReload=%q, want /bin/kill -HUP $MAINPID (SIGHUP reloads the config)", got)
	}
	if got := one("KillSignal"); got != "SIGTERM" {
		t.Errorf("KillSignal=%q, want SIGTERM (the signal that drains)", got)
	}
	stop, err := time.ParseDuration(one("TimeoutStopSec") + "s")
	if grace := config.Default().Daemon.ShutdownGrace; err != nil || stop <= grace {
		t.Errorf("TimeoutStopSec %s (%v) must exceed the default shutdown_grace %s", stop, err, grace)
	}
	if got := one("ExecStart"); !strings.HasPrefix(got, "/usr/local/bin/ingestor run -c ") {
		t.Errorf("ExecStart=%q, want /usr/local/bin/ingestor run -c FILE", got)
	}
}
