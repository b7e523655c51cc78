package logattr

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// TestDurationSeconds: a JSON log line carries durations as seconds, in
// groups too, and leaves other values alone.
func TestDurationSeconds(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{ReplaceAttr: DurationSeconds}))
	log.Info("wait", "retry_in", 301549999530*time.Nanosecond, "n", 3, slog.Group("g", "d", 1500*time.Millisecond))
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got["retry_in"] != 301.54999953 || got["n"] != 3.0 || got["g"].(map[string]any)["d"] != 1.5 {
		t.Errorf("logged %s, want retry_in 301.54999953, n 3 and g.d 1.5", buf.String())
	}
}
