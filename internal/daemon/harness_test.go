package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
)

type harness struct {
	t        *testing.T
	dir      string
	pub, ack string
	d        *Daemon
	logs     *testsync.LockedBuffer
	stopOnce sync.Once
	stopErr  error
}

// stop shuts h's daemon down, once: a test that stops it early leaves
// nothing for the cleanup to do.
func (h *harness) stop() error {
	h.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h.stopErr = h.d.Shutdown(ctx)
	})
	return h.stopErr
}

// startDaemon starts a daemon whose config is the given source blocks and
// extra settings; %[1]s in them is replaced by the data dir.
func startDaemon(t *testing.T, rawStore, publishExtra, sourcesTOML string) *harness {
	t.Helper()
	return startDaemonWith(t, "", rawStore, publishExtra, sourcesTOML, Options{})
}

// startDaemonWith is startDaemon with more [daemon] keys and options.
func startDaemonWith(t *testing.T, daemonExtra, rawStore, publishExtra, sourcesTOML string, o Options) *harness {
	t.Helper()
	return startDaemonIn(t, t.TempDir(), daemonExtra, rawStore, publishExtra, sourcesTOML, o)
}

// startDaemonIn is startDaemonWith on the data dir dir, which may hold an
// earlier run's state.
func startDaemonIn(t *testing.T, dir, daemonExtra, rawStore, publishExtra, sourcesTOML string, o Options) *harness {
	t.Helper()
	h := &harness{t: t, dir: dir, pub: "tcp://" + testsync.FreePort(t), ack: "tcp://" + testsync.FreePort(t), logs: &testsync.LockedBuffer{}}
	text := h.configText(daemonExtra, rawStore, publishExtra) + sourcesTOML
	cfg, err := config.Parse("test.toml", []byte(text))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, text)
	}
	return startConfig(t, h, cfg, o)
}

// configText is the config of h's daemon without sources: its data dir,
// an ops listener on a free port, its endpoints, and the extra keys of
// [daemon] and [publish]; the raw store is rawStore's keys, or h.dir/raw.
func (h *harness) configText(daemonExtra, rawStore, publishExtra string) string {
	if rawStore == "" {
		rawStore = fmt.Sprintf("url = %q", "file://"+h.dir+"/raw")
	}
	return testconfig.Daemon{DataDir: h.dir, HTTPAddr: "127.0.0.1:0", ShutdownGrace: "10s", DaemonKeys: daemonExtra,
		RawStore: rawStore, Publish: h.pub, Ack: h.ack, PublishKeys: publishExtra}.TOML()
}

// startConfig starts a daemon on cfg for h, whose dir and endpoints are
// cfg's and whose logs (debug level) are kept in h.logs, and shuts it down
// when the test ends, showing the logs if it failed.
func startConfig(t *testing.T, h *harness, cfg *config.Config, o Options) *harness {
	t.Helper()
	if h.logs == nil {
		h.logs = &testsync.LockedBuffer{}
	}
	o.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var err error
	h.d, err = Start(t.Context(), cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.stop(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("daemon logs:\n%s", h.logs.String())
		}
	})
	return h
}

// startProcessor runs a processor client against h until the test ends or
// stop is called.
func (h *harness) startProcessor(handler processor.Handler) (c *processor.Client, stop func()) {
	h.t.Helper()
	return h.startProcessorWith(processor.Options{}, handler)
}

// startProcessorWith is startProcessor with options; their endpoints and
// logger are h's.
func (h *harness) startProcessorWith(o processor.Options, handler processor.Handler) (c *processor.Client, stop func()) {
	h.t.Helper()
	o.Endpoint, o.AckEndpoint, o.Logger = h.pub, h.ack, slog.New(slog.NewTextHandler(h.logs, nil))
	c, err := processor.New(o)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx, handler); err != nil {
			h.t.Errorf("processor: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	h.t.Cleanup(stop)
	return c, stop
}

// metric returns the value of the metric name with the given label values
// (name=value pairs), or 0 when absent.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()) // a histogram: its count
			}
		}
	}
	return 0
}

// seenSet records delivered events by key.
type seenSet struct {
	mu         sync.Mutex
	keys       map[string]int
	deliveries map[int64]int // highest delivery number seen per frame
}

func newSeenSet() *seenSet {
	return &seenSet{keys: make(map[string]int)}
}

func (s *seenSet) add(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[key]++
}

func (s *seenSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

func (s *seenSet) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[key]
}
