package main

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/daemon"
)

// Webhook mode: -clients keep-alive HTTP clients each POST one event per
// request to a webhook source of the daemon in this process, as fast as
// the answers come; every answer is a durable commit (raw fsync, then the
// queue's transaction). Processors ack meanwhile, so the queue never fills.
const (
	modeWebhook = "webhook"
	// webhookRequests is -events' default in webhook mode.
	webhookRequests = 200_000
)

// webhookResult is what a webhook run measured. Its JSON form is the
// -json output of that mode.
type webhookResult struct {
	Mode        string  `json:"mode"`
	Signature   string  `json:"signature"`
	Clients     int     `json:"clients"`
	Requests    int64   `json:"requests"`
	EventSize   int     `json:"event_size"`
	Synchronous string  `json:"synchronous"`
	WallSeconds float64 `json:"wall_seconds"`
	PerSec      float64 `json:"requests_per_sec"`
	// Latency is request to answer, in milliseconds.
	Latency    latencyMs `json:"latency_ms"`
	CPUSeconds float64   `json:"cpu_seconds"`
	PeakRSSMiB float64   `json:"peak_rss_mib"`
	// AllocKiBPerRequest is what the process's Go heap allocated per
	// request (the in-process clients' share included), and GCCycles
	// the collections during the run.
	AllocKiBPerRequest float64 `json:"alloc_kib_per_request"`
	GCCycles           uint64  `json:"gc_cycles"`
	Acked              int64   `json:"events_acked"`
	MeanGroupSize      float64 `json:"mean_commit_group"`
	GroupCommitsPerSec float64 `json:"group_commits_per_sec"`
}

// webhookSignature is the one scheme -signature knows, and
// webhookSecret the bench source's secret.
const (
	webhookSignature = "github"
	webhookSecret    = "ingestor-bench-webhook-secret"
)

// webhookConfig adds the push listener and one webhook source to cfg,
// which checks signature (one of webhookSignature, or "" for none).
func webhookConfig(b *strings.Builder, signature string) {
	b.WriteString(`
[push]
addr = "127.0.0.1:0"

[source.hooks]
kind = "webhook"
id_field = "id"
`)
	if signature != "" {
		fmt.Fprintf(b, "signature = %q\nsecret = %q\n", signature, webhookSecret)
	}
}

// benchWebhook runs webhook mode.
func benchWebhook(ctx context.Context, o options, cfg *config.Config, log *slog.Logger) (*webhookResult, error) {
	rec := newRecorder(o.events)
	u0, err := getUsage()
	if err != nil {
		return nil, err
	}
	d, err := daemon.Start(ctx, cfg, daemon.Options{Logger: log, OnAck: rec.onAck})
	if err != nil {
		return nil, fmt.Errorf("start daemon: %w", err)
	}
	procs := &processors{log: log, endpoint: cfg.Publish.Endpoint, ack: cfg.Publish.AckEndpoint}
	defer func() {
		if err := procs.stop(); err != nil {
			log.Error("processors", "err", err)
		}
	}()
	if err := procs.start(o.processors); err != nil {
		return nil, errors.Join(err, d.Shutdown(context.WithoutCancel(ctx)))
	}

	lat, wall, next, loadErr := loadWebhooks(ctx, o, d.PushAddr())
	u1, uerr := getUsage()
	// Wait briefly for the acks of what was stored, so the processors are
	// known to have received it; the measure above does not include this.
	done := min(next, o.events)
	ackDeadline := time.Now().Add(30 * time.Second)
	for rec.acked.Load() < done && time.Now().Before(ackDeadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	groups, groupSum := groupStats(d)
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Daemon.ShutdownGrace)
	shutErr := d.Shutdown(sctx)
	scancel()
	procErr := procs.stop()
	if err := errors.Join(loadErr, uerr, shutErr, procErr); err != nil {
		return nil, err
	}
	res := webhookSummary(o, lat, wall, u0, u1)
	res.Acked = rec.acked.Load()
	if groups > 0 {
		res.MeanGroupSize = round(groupSum/groups, 1)
		res.GroupCommitsPerSec = round(groups/wall.Seconds(), 0)
	}
	return res, nil
}

// loadWebhooks has -clients keep-alive clients POST one event each per
// request to /ingest/hooks at addr, as fast as the answers come, until
// -events requests (or -duration), and returns every request's latency,
// the wall time and how many requests were started.
func loadWebhooks(ctx context.Context, o options, addr string) (lat []time.Duration, wall time.Duration, started int64, err error) {
	pad := strings.Repeat("x", max(0, o.eventSize-40))
	var next atomic.Int64
	lats := make([][]time.Duration, o.clients)
	errs := make([]error, o.clients)
	runCtx, cancel := context.WithCancel(ctx)
	if o.duration > 0 {
		runCtx, cancel = context.WithTimeout(ctx, o.duration)
	}
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range o.clients {
		wg.Go(func() {
			body := make([]byte, 0, o.eventSize+32)
			pc, err := dialPoster(addr, "/ingest/hooks", o.signature != "")
			if err != nil {
				errs[c] = err
				cancel()
				return
			}
			defer pc.close()
			for runCtx.Err() == nil {
				n := next.Add(1)
				if n > o.events {
					return
				}
				body = fmt.Appendf(body[:0], `{"id":"e%d","pad":"%s"}`, n, pad)
				t0 := time.Now()
				if err := pc.post(body); err != nil {
					if runCtx.Err() == nil {
						errs[c] = err
						cancel()
					}
					return
				}
				lats[c] = append(lats[c], time.Since(t0))
			}
		})
	}
	wg.Wait()
	return slices.Concat(lats...), time.Since(start), next.Load(), errors.Join(errs...)
}

// webhookSummary is the result of a webhook load: lat, the requests'
// latencies, over wall, with the process's usage from u0 to u1.
func webhookSummary(o options, lat []time.Duration, wall time.Duration, u0, u1 usage) *webhookResult {
	slices.Sort(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return round(lat[min(len(lat)-1, int(p/100*float64(len(lat))))].Seconds()*1000, 2)
	}
	return &webhookResult{Mode: o.mode, Signature: o.signature, Clients: o.clients, Requests: int64(len(lat)), EventSize: o.eventSize,
		Synchronous: o.synchronous, WallSeconds: round(wall.Seconds(), 3),
		PerSec:     round(float64(len(lat))/wall.Seconds(), 0),
		Latency:    latencyMs{P50: pct(50), P90: pct(90), P99: pct(99), Max: pct(100)},
		CPUSeconds: round((u1.user + u1.sys - u0.user - u0.sys).Seconds(), 2), PeakRSSMiB: round(float64(u1.maxRSSKiB)/1024, 1),
		AllocKiBPerRequest: round(float64(u1.allocated-u0.allocated)/1024/float64(max(len(lat), 1)), 2), GCCycles: u1.gcCycles - u0.gcCycles}
}

// poster is one keep-alive HTTP/1.1 connection that POSTs events: a
// minimal client (one goroutine, requests written from a prepared header,
// answers parsed by net/http), so that the measure is of the daemon more
// than of the load generator, which shares its two cores.
type poster struct {
	conn net.Conn
	br   *bufio.Reader
	head string
	buf  []byte
	// sign is set when each request carries X-Hub-Signature-256.
	sign bool
	sum  []byte
}

func dialPoster(addr, path string, sign bool) (*poster, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &poster{conn: conn, br: bufio.NewReader(conn), sign: sign,
		head: "POST " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nContent-Length: "}, nil
}

// post sends one event and checks it was stored (202, or 200 for a
// duplicate).
func (p *poster) post(body []byte) error {
	p.buf = strconv.AppendInt(append(p.buf[:0], p.head...), int64(len(body)), 10)
	if p.sign {
		m := hmac.New(sha256.New, []byte(webhookSecret))
		m.Write(body)
		p.sum = m.Sum(p.sum[:0])
		p.buf = hex.AppendEncode(append(p.buf, "\r\nX-Hub-Signature-256: sha256="...), p.sum)
	}
	p.buf = append(append(p.buf, "\r\n\r\n"...), body...)
	if _, err := p.conn.Write(p.buf); err != nil {
		return err
	}
	resp, err := http.ReadResponse(p.br, nil)
	if err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	answer, err := io.ReadAll(resp.Body)
	err = errors.Join(err, resp.Body.Close())
	if err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	if resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST answered %d: %s", resp.StatusCode, answer)
	}
	return nil
}

func (p *poster) close() { _ = p.conn.Close() }

// groupStats reads the push commit group histogram: how many groups and
// how many requests in all.
func groupStats(d *daemon.Daemon) (groups, requests float64) {
	mfs, err := d.Registry().Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() == "ingestor_push_commit_group_size" && len(mf.GetMetric()) > 0 {
			h := mf.GetMetric()[0].GetHistogram()
			return float64(h.GetSampleCount()), h.GetSampleSum()
		}
	}
	return 0, 0
}

// printWebhook prints a webhook run: one line holding "webhook" and
// "N requests/s", or JSON.
func printWebhook(w io.Writer, r *webhookResult, asJSON bool) error {
	if asJSON {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	signed := "no signature"
	if r.Signature != "" {
		signed = "signature " + r.Signature + " checked"
	}
	_, err := fmt.Fprintf(w, "%s: %.0f requests/s durable (synchronous = %s, %s), %d clients keep-alive, one %d-byte event per request; "+
		"latency p50 %.2f ms, p99 %.2f ms, max %.2f ms; %d requests in %.2f s, %.1f requests per group commit; CPU %.2f s, peak RSS %.1f MiB; %.2f KiB allocated per request, %d collections\n",
		r.Mode, r.PerSec, r.Synchronous, signed, r.Clients, r.EventSize, r.Latency.P50, r.Latency.P99, r.Latency.Max, r.Requests, r.WallSeconds,
		r.MeanGroupSize, r.CPUSeconds, r.PeakRSSMiB, r.AllocKiBPerRequest, r.GCCycles)
	return err
}
