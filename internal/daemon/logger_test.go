package daemon

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
)

// TestJSONLogsWriteSecondsForDurations: with log_format = "json" a wait is
// logged as seconds ("retry_in":301.5), not slog's integer nanoseconds;
// text logs keep "5m1.5s".
func TestJSONLogsWriteSecondsForDurations(t *testing.T) {
	for _, tc := range []struct{ format, want string }{
		{"json", `"retry_in":301.5`},
		{"text", `retry_in=5m1.5s`},
	} {
		var buf bytes.Buffer
		newLogger(config.Daemon{LogFormat: tc.format, LogLevel: "info"}, &buf).Info("waiting", "retry_in", 301500*time.Millisecond)
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("%s log %q, want %s", tc.format, buf.String(), tc.want)
		}
	}
}
