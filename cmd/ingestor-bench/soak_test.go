package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// flatSamples returns n samples 10 s apart, every series at the same
// level, the raw store's growing by growth per sample.
func flatSamples(n int, growth int64) []soakSample {
	var out []soakSample
	for i := range n {
		out = append(out, soakSample{At: time.Duration(i) * 10 * time.Second, RawBytes: 100<<20 + int64(i)*growth,
			QueueBytes: 8 << 20, ProcessorDBBytes: 4 << 20, DaemonRSS: 60 << 20, ProcessorRSS: 30 << 20,
			DaemonFDs: 50, ProcessorFDs: 20, Goroutines: 60})
	}
	return out
}

// deviceRows is flatSamples(n, 0) with from device rows at the first
// sample and every third sample step more (5 devices each taking a new
// id every 30 s).
func deviceRows(n int, from, step int64) []soakSample {
	s := flatSamples(n, 0)
	for i := range s {
		s[i].DeviceRows = from + int64(i/3)*step
	}
	return s
}

// bursts is flatSamples(30, 0) with one daemon RSS burst in the warm-up,
// in the first and in the last third, of the given MiB.
func bursts(warm, first, last int64) []soakSample {
	s := flatSamples(30, 0)
	s[3].DaemonRSS, s[9].DaemonRSS, s[27].DaemonRSS = warm<<20, first<<20, last<<20
	return s
}

// TestSoakCheckFails shows that the soak's check can fail: a series that
// grows past the limit, an event lost or applied twice, too few samples.
func TestSoakCheckFails(t *testing.T) {
	sent := map[string]int64{"firehose": 1000, "hooks": 10}
	for _, c := range []struct {
		name    string
		res     soakResult
		wantErr string
	}{
		{"flat", soakResult{Samples: flatSamples(30, 0), Warmup: time.Minute, Limit: 1.2, Sent: sent, Applied: sent}, ""},
		{"slow growth within the limit", soakResult{Samples: flatSamples(30, 1<<19), Warmup: time.Minute, Limit: 1.2, Sent: sent, Applied: sent}, ""},
		{"raw store grows", soakResult{Samples: flatSamples(30, 4<<20), Warmup: time.Minute, Limit: 1.2, Sent: sent, Applied: sent}, "raw store grew"},
		{"an event lost", soakResult{Samples: flatSamples(30, 0), Warmup: time.Minute, Limit: 1.2, Sent: sent,
			Applied: map[string]int64{"firehose": 999, "hooks": 10}}, "source firehose: 1000 events sent, the processor applied 999"},
		{"applied twice", soakResult{Samples: flatSamples(30, 0), Warmup: time.Minute, Limit: 1.2, Sent: sent,
			Applied: map[string]int64{"firehose": 1000, "hooks": 11}}, "source hooks: 10 events sent, the processor applied 11"},
		{"an unknown source", soakResult{Samples: flatSamples(30, 0), Warmup: time.Minute, Limit: 1.2, Sent: sent,
			Applied: map[string]int64{"firehose": 1000, "hooks": 10, "stray": 1}}, "source stray: nothing sent"},
		{"a source late", soakResult{Samples: flatSamples(30, 0), Warmup: time.Minute, Limit: 1.2, Sent: sent, Applied: sent,
			Late: []string{"quiet"}}, "sources late at the end: [quiet]"},
		{"an actor restarted", soakResult{Samples: flatSamples(30, 0), Warmup: time.Minute, Limit: 1.2, Sent: sent, Applied: sent,
			Restarts: 1}, "actor restarts: 1"},
		{"a burst that peaked low in the first third", soakResult{Samples: bursts(280, 226, 286), Warmup: time.Minute, Limit: 1.2, Sent: sent, Applied: sent}, ""},
		{"bursts growing past the warm-up's", soakResult{Samples: bursts(280, 300, 370), Warmup: time.Minute, Limit: 1.2, Sent: sent, Applied: sent}, "daemon peak RSS grew"},
		{"too few samples", soakResult{Samples: flatSamples(10, 0), Warmup: time.Minute, Limit: 1.2, Sent: sent, Applied: sent}, "too few"},
		{"device ids forgotten", soakResult{Samples: deviceRows(30, 10, 0), Warmup: time.Minute, Limit: 1.2, Sent: sent, Applied: sent, Devices: 5}, ""},
		{"device ids kept", soakResult{Samples: deviceRows(30, 10, 5), Warmup: time.Minute, Limit: 1.2, Sent: sent, Applied: sent, Devices: 5},
			"device rows grew: 55 device ids tracked after the warm-up, more than 15 for 5 devices"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.res.check()
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Errorf("check() = %v, want an error containing %q", err, c.wantErr)
			}
		})
	}
}

// TestSoakModeShort is the soak of `make bench` in three minutes: the
// built daemon and exactly-once processor, every kind of source at once
// (a paced firehose, a quiet API, a malformed one, a WebSocket feed that
// drops connections, webhooks and devices with duplicates and invalid
// envelopes, a page of 100,000 records and a 200 MB body refused at
// max_body_bytes, each three times), raw retention 1m, dedupe window 20s
// and the processor's retention 30s (bursts are a minute apart), `dlq drop` every
// 30s. It passes only if every
// series is flat after the warm-up (the last third's maximum at most 1.2x
// the highest before it) and the processor applied every event sent once.
func TestSoakModeShort(t *testing.T) {
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "s")
	chart := filepath.Join(t.TempDir(), "soak.svg")
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), filepath.Join(bin, "ingestor-bench"), "-mode", "soak", "-duration", "3m", "-warmup", "90s",
		"-sample", "5s", "-processor-retention", "30s", "-rate", "500", "-devices", "5", "-senders", "2", "-big-page", "100000", "-refused-body", "200000000",
		"-dir", dir, "-chart", chart, "-json")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	t.Logf("progress:\n%s", errOut.String())
	var res soakResult
	if jerr := json.Unmarshal(out.Bytes(), &res); jerr != nil {
		t.Fatalf("ingestor-bench -mode soak: %v; output %q: %v; logs in %s", err, out.String(), jerr, dir)
	}
	var table strings.Builder
	if perr := printSoak(&table, &res); perr != nil {
		t.Fatal(perr)
	}
	t.Logf("\n%s", table.String())
	if err != nil {
		t.Fatalf("ingestor-bench -mode soak: %v; logs in %s", err, dir)
	}
	for _, src := range []string{"firehose", "stream", "hooks", "devices", "big"} {
		if res.Sent[src] == 0 {
			t.Errorf("source %s: nothing sent", src)
		}
	}
	if res.Sent["big"] != 300000 || res.DLQDrops < 5 || res.StreamConnections < 2 {
		t.Errorf("big page records %d, dlq drops %d, stream connections %d; want 300000, at least 5 and at least 2",
			res.Sent["big"], res.DLQDrops, res.StreamConnections)
	}
	svg, err := os.ReadFile(chart)
	if err != nil || !bytes.HasPrefix(svg, []byte("<svg")) || bytes.Count(svg, []byte("<polyline")) != len(soakSeries) {
		t.Errorf("chart %s: %v, want an SVG with a line per series:\n%.300s", chart, err, svg)
	}
}

// TestSoakConfigLoads checks that the soak's config is valid, with the raw
// store's retention and without it.
func TestSoakConfigLoads(t *testing.T) {
	for _, keep := range []bool{false, true} {
		path, err := soakConfig(t.TempDir(), "http://127.0.0.1:1", soakOptions{retention: time.Minute, keepRaw: keep})
		if err != nil {
			t.Fatalf("keep-raw %v: %v", keep, err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want := `retention = "1m0s"`
		if keep {
			want = `retention = "0"`
		}
		if !strings.Contains(string(b), want) || !strings.Contains(string(b), `dedupe_window = "20s"`) {
			t.Errorf("keep-raw %v: config lacks %s or the dedupe window:\n%s", keep, want, b)
		}
	}
}
