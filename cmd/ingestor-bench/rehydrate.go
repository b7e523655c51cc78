package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/daemon"
	"github.com/ingestorhq/ingestor/internal/queue"
)

// rehydrateBacklog is the backlog of mode rehydrate unless -backlog is set.
const rehydrateBacklog = 1_000_000

// rehydrateResult is what mode rehydrate measures: how long the daemon takes
// to become ready on a queue holding Events pending events, and what memory
// it then holds.
type rehydrateResult struct {
	Mode        string  `json:"mode"`
	Events      int64   `json:"events"`
	FillSeconds float64 `json:"fill_seconds"`
	// ReadySeconds is the time daemon.Start takes to return, ready.
	ReadySeconds   float64 `json:"ready_seconds"`
	PendingEvents  int64   `json:"pending_events"`
	RSSBeforeMiB   float64 `json:"rss_before_mib"`
	RSSReadyMiB    float64 `json:"rss_ready_mib"`
	HeapBeforeMiB  float64 `json:"heap_inuse_before_mib"`
	HeapReadyMiB   float64 `json:"heap_inuse_ready_mib"`
	QueueFileBytes int64   `json:"queue_file_bytes"`
}

// rehydrate fills a queue with o.backlog pending events, directly through
// package queue, then starts the daemon on it with no source and no
// processor and measures the time to ready and the memory held.
func rehydrate(ctx context.Context, o options, cfg *config.Config, log *slog.Logger, progress io.Writer) (*rehydrateResult, error) {
	res := &rehydrateResult{Mode: o.mode, Events: o.backlog}
	dataDir := cfg.Daemon.DataDir
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	fillStart := time.Now()
	if err := fillQueue(ctx, dataDir, o.backlog, 10_000); err != nil {
		return nil, err
	}
	res.FillSeconds = round(time.Since(fillStart).Seconds(), 3)
	fmt.Fprintf(progress, "ingestor-bench: %d events queued in %.2f s; starting the daemon on them\n", o.backlog, res.FillSeconds)
	if fi, err := os.Stat(filepath.Join(dataDir, "queue.db")); err == nil {
		res.QueueFileBytes = fi.Size()
	}

	debug.FreeOSMemory()
	res.RSSBeforeMiB, res.HeapBeforeMiB = round(currentRSSMiB(), 1), heapInuseMiB()
	start := time.Now()
	d, err := daemon.Start(ctx, cfg, daemon.Options{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("start daemon: %w", err)
	}
	res.ReadySeconds = round(time.Since(start).Seconds(), 4)
	res.PendingEvents = d.Queue().PendingEvents()
	res.RSSReadyMiB, res.HeapReadyMiB = round(currentRSSMiB(), 1), heapInuseMiB()

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Daemon.ShutdownGrace)
	defer cancel()
	if err := d.Shutdown(sctx); err != nil {
		return nil, err
	}
	if res.PendingEvents != o.backlog {
		return nil, fmt.Errorf("daemon opened the queue with %d pending events, want %d", res.PendingEvents, o.backlog)
	}
	return res, nil
}

// heapInuseMiB returns the Go heap in use after a collection, in MiB.
func heapInuseMiB() float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return round(float64(ms.HeapInuse)/(1<<20), 1)
}

// backlogRawKey is the raw object every backlog event refers to.
const backlogRawKey = "backlog/2026/01/01/0-backlog.json"

// fillQueue writes n pending events, in Append batches of batch, into
// <dataDir>/queue.db, all referring to one raw object written once to the
// file raw store at <dataDir>/raw.
func fillQueue(ctx context.Context, dataDir string, n int64, batch int) (err error) {
	record := []byte(`{"id":"backlog","payload":"0123456789abcdef0123456789abcdef"}`)
	rawPath := filepath.Join(dataDir, "raw", filepath.FromSlash(backlogRawKey))
	if err := os.MkdirAll(filepath.Dir(rawPath), 0o750); err != nil {
		return fmt.Errorf("fill queue: %w", err)
	}
	if err := os.WriteFile(rawPath, record, 0o640); err != nil {
		return fmt.Errorf("fill queue: %w", err)
	}
	q, err := queue.Open(queue.Options{Path: filepath.Join(dataDir, "queue.db"), Synchronous: "normal",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("fill queue: %w", err)
	}
	defer func() { err = errors.Join(err, q.Close()) }()
	fetched := time.Now()
	for start := int64(0); start < n; start += int64(batch) {
		b := queue.Batch{Source: "backlog", FetchedAt: fetched, RawKey: backlogRawKey,
			Events: make([]queue.NewEvent, min(int64(batch), n-start))}
		for i := range b.Events {
			b.Events[i] = queue.NewEvent{Key: "ev-" + strconv.FormatInt(start+int64(i)+1, 10), EventTime: fetched,
				RawLen: len(record)}
		}
		if _, err := q.Append(ctx, b); err != nil {
			return fmt.Errorf("fill queue: %w", err)
		}
	}
	return nil
}

func printRehydrate(w io.Writer, r *rehydrateResult, asJSON bool) error {
	if asJSON {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode result: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	_, err := fmt.Fprintf(w, "ingestor-bench: mode=rehydrate events=%d queue.db=%.1f MiB (filled in %.2f s)\n"+
		"  ready in %.3f s with pending_events=%d\n"+
		"  RSS %.1f MiB before start, %.1f MiB ready; Go heap in use %.1f MiB before, %.1f MiB ready\n",
		r.Events, float64(r.QueueFileBytes)/(1<<20), r.FillSeconds, r.ReadySeconds, r.PendingEvents,
		r.RSSBeforeMiB, r.RSSReadyMiB, r.HeapBeforeMiB, r.HeapReadyMiB)
	return err
}
