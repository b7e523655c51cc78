// Command processor is the example processor: it connects to an ingestor
// daemon, acknowledges every event it receives, counts them per source and
// logs its progress. Counts are of deliveries: an event the daemon
// redelivers is counted again.
//
// Usage:
//
//	processor [-connect tcp://127.0.0.1:5557] [-ack tcp://127.0.0.1:5558] [-log-every 2s] [-log-format text|json]
//
// SIGINT or SIGTERM stops it gracefully: it sends its pending acks and logs
// a summary.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ingestorhq/ingestor/processor"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "processor:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	connect   string
	ack       string
	logEvery  time.Duration
	logFormat string
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("processor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.connect, "connect", "tcp://127.0.0.1:5557", "the daemon's event endpoint (its publish.endpoint) to connect to")
	fs.StringVar(&c.ack, "ack", "tcp://127.0.0.1:5558", "the daemon's ack endpoint (its publish.ack_endpoint) to connect to")
	fs.DurationVar(&c.logEvery, "log-every", 2*time.Second, "interval between progress logs")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if c.logEvery <= 0 {
		errs = append(errs, fmt.Errorf("-log-every must be positive, not %v", c.logEvery))
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		errs = append(errs, fmt.Errorf("-log-format must be text or json, not %q", c.logFormat))
	}
	return c, errors.Join(errs...)
}

// run runs the processor until ctx is cancelled, logging to logOut.
func run(ctx context.Context, args []string, logOut io.Writer) error {
	cfg, err := parseFlags(args, logOut)
	if err != nil {
		return err
	}
	var h slog.Handler = slog.NewTextHandler(logOut, nil)
	if cfg.logFormat == "json" {
		h = slog.NewJSONHandler(logOut, nil)
	}
	log := slog.New(h)
	client, err := processor.New(processor.Options{Endpoint: cfg.connect, AckEndpoint: cfg.ack, Logger: log})
	if err != nil {
		return err
	}

	counts := &counter{bySource: make(map[string]int64)}
	start := time.Now()
	reportCtx, stopReport := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { report(reportCtx, log, client, counts, cfg.logEvery) })
	err = client.Run(ctx, counts.handle)
	stopReport()
	wg.Wait()

	elapsed := time.Since(start)
	total, bySource := counts.snapshot()
	st := client.Stats()
	log.Info("summary", "elapsed", elapsed.Round(time.Millisecond), "events", total,
		"events_per_sec", rate(total, elapsed), sources(bySource),
		"frames", st.Frames, "acked", st.Acked, "redeliveries", st.Redeliveries, "malformed", st.Malformed)
	return err
}

// report logs progress every interval until ctx is done.
func report(ctx context.Context, log *slog.Logger, client *processor.Client, counts *counter, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last, lastAt := int64(0), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			total, bySource := counts.snapshot()
			st := client.Stats()
			log.Info("progress", "events_per_sec", rate(total-last, now.Sub(lastAt)), "events", total,
				sources(bySource), "redeliveries", st.Redeliveries, "malformed", st.Malformed)
			last, lastAt = total, now
		}
	}
}

// rate returns n per second over d, to one decimal.
func rate(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return math.Round(float64(n)/d.Seconds()*10) / 10
}

// sources returns per-source counts as a log group sorted by source.
func sources(bySource map[string]int64) slog.Attr {
	attrs := make([]any, 0, len(bySource))
	for _, s := range slices.Sorted(maps.Keys(bySource)) {
		attrs = append(attrs, slog.Int64(cmp.Or(s, `""`), bySource[s]))
	}
	return slog.Group("sources", attrs...)
}

// counter counts events in total and per source.
type counter struct {
	mu       sync.Mutex
	total    int64
	bySource map[string]int64
}

// handle is the processor's Handler: it counts the event and acks it.
func (c *counter) handle(_ context.Context, ev *processor.Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total++
	c.bySource[ev.Source]++
	return nil
}

func (c *counter) snapshot() (int64, map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total, maps.Clone(c.bySource)
}
