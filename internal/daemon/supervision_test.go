package daemon

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
	"github.com/ingestorhq/ingestor/sources"
)

// crashingSpec is a source kind that panics on every fetch; no real kind
// can be made to crash on purpose.
type crashingSpec struct{ opens *atomic.Int64 }

func (crashingSpec) Validate() []sources.FieldError { return nil }

func (s crashingSpec) Open(sources.Env) (sources.Source, error) {
	s.opens.Add(1)
	return crashingSource{}, nil
}

type crashingSource struct{}

func (crashingSource) Fetch(context.Context, string) (*sources.Batch, error) {
	panic("this source always crashes")
}

func (crashingSource) Close() error { return errors.New("closed a crashed source") }

// TestCrashingSourceIsRestartedAlone runs a source that panics on every
// fetch next to a healthy one: the supervisor restarts the crashing one
// again and again, and the healthy one keeps delivering meanwhile; GET
// /status counts the crashing one's restarts and shows its last panic.
func TestCrashingSourceIsRestartedAlone(t *testing.T) {
	dir := t.TempDir()
	pub, ack := testconfig.FreeEndpoints(t)
	cfg := testconfig.Daemon{
		Dir: dir, DataDir: dir, HTTPAddr: "127.0.0.1:0", Publish: pub, Ack: ack,
		Rest: `
[source.healthy]
kind = "demo"
interval = "20ms"
events_per_tick = 10
`,
	}.Parse(t, "t.toml")
	var opens atomic.Int64
	cfg.Sources = append(cfg.Sources, config.Source{Name: "boom", Kind: "crashing", Enabled: true,
		Interval: 10 * time.Millisecond, Timeout: time.Second, InflightBatches: 1, Spec: crashingSpec{opens: &opens}})
	h := startConfig(t, &harness{t: t, dir: dir, pub: cfg.Publish.Endpoint, ack: cfg.Publish.AckEndpoint}, cfg, Options{})
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "the crashing source to be restarted 4 times", 60*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_actor_restarts_total", "actor", "source-boom") >= 4 && opens.Load() >= 4
	})
	before := seen.len()
	testsync.WaitFor(t, "the healthy source to keep delivering", 30*time.Second, func() bool { return seen.len() >= before+100 })
	if n := metric(t, h.d.Registry(), "ingestor_actor_restarts_total", "actor", "source-healthy"); n != 0 {
		t.Errorf("the healthy source was restarted %v times", n)
	}
	// GET /status counts the restarts and shows the last panic.
	for _, s := range getStatus(t, h.d.HTTPAddr()).Sources {
		switch {
		case s.Name == "boom" && (s.Restarts < 4 || !strings.Contains(s.LastPanic, "this source always crashes") || s.LastPanicAt == nil):
			t.Errorf("boom in /status: %d restarts, last panic %q at %v; want at least 4 and the panic", s.Restarts, s.LastPanic, s.LastPanicAt)
		case s.Name == "healthy" && (s.Restarts != 0 || s.LastPanic != ""):
			t.Errorf("healthy in /status: %d restarts, last panic %q", s.Restarts, s.LastPanic)
		}
	}
}
