package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/internal/sqliteuri"
)

// Mode webhook-ceiling measures what the daemon's webhook path could at
// best reach on this machine: a server that does the least a durable
// webhook receiver must (net/http; per group of waiting requests one
// append of their bodies to a file and its fsync, then one SQLite
// transaction, WAL and synchronous as the daemon's, inserting each event
// under a unique key; each request answered after both), loaded by the
// same clients as -mode webhook. It runs the ceiling and the daemon's
// webhook mode alternately, -runs times each (runWebhookCeiling), and
// prints each run and the ratio of the daemon's throughput to the
// ceiling's.
const modeWebhookCeiling = "webhook-ceiling"

// ceilingGroupMax bounds one group commit of the ceiling server.
const ceilingGroupMax = 4096

// ceilingServer is the minimal durable webhook server.
type ceilingServer struct {
	srv  *http.Server
	ln   net.Listener
	reqs chan *ceilingReq
	raw  *os.File
	db   *sql.DB
	ins  *sql.Stmt
	done chan struct{}
	// groups counts the group commits, written by the writer and read
	// after it ended.
	groups int64
}

// ceilingReq is one request waiting for its group's commit.
type ceilingReq struct {
	id   string
	body []byte
	done chan error
}

// startCeiling starts the ceiling server on a loopback port, its raw file
// and database in dir.
func startCeiling(dir, synchronous string) (*ceilingServer, error) {
	raw, err := os.OpenFile(filepath.Join(dir, "raw.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	dsn, err := sqliteuri.File(filepath.Join(dir, "ceiling.db"), "_journal_mode=WAL&_synchronous="+synchronous+"&_txlock=immediate")
	if err != nil {
		return nil, errors.Join(err, raw.Close())
	}
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, errors.Join(err, raw.Close())
	}
	db.SetMaxOpenConns(1)
	c := &ceilingServer{reqs: make(chan *ceilingReq, ceilingGroupMax), raw: raw, db: db, done: make(chan struct{})}
	if _, err = db.Exec(`CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, off INTEGER NOT NULL)`); err == nil {
		c.ins, err = db.Prepare(`INSERT INTO events(key, off) VALUES (?, ?) ON CONFLICT(key) DO NOTHING`)
	}
	if err == nil {
		c.ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		return nil, errors.Join(err, db.Close(), raw.Close())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /ingest/hooks", c.handle)
	c.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go c.write()
	go func() { _ = c.srv.Serve(c.ln) }() // returns when stop closes it
	return c, nil
}

// handle reads one event, waits for its group's commit and answers 202.
func (c *ceilingServer) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	var ev struct {
		ID string `json:"id"`
	}
	if err == nil {
		err = json.Unmarshal(body, &ev)
	}
	if err != nil || ev.ID == "" {
		http.Error(w, "want a JSON object with an id", http.StatusBadRequest)
		return
	}
	req := &ceilingReq{id: ev.ID, body: body, done: make(chan error, 1)}
	c.reqs <- req
	if err := <-req.done; err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = fmt.Fprintf(w, `{"id":%q,"status":"stored"}`, ev.ID)
}

// write is the one writer: each group of waiting requests is appended to
// the raw file and fsynced, then inserted in one transaction, then
// answered.
func (c *ceilingServer) write() {
	defer close(c.done)
	var off int64
	buf := make([]byte, 0, 1<<20)
	for first := range c.reqs {
		group := []*ceilingReq{first}
		for more := true; more && len(group) < ceilingGroupMax; {
			select {
			case r, ok := <-c.reqs:
				if !ok {
					more = false
					break
				}
				group = append(group, r)
			default:
				more = false
			}
		}
		buf = buf[:0]
		offs := make([]int64, len(group))
		for i, r := range group {
			offs[i] = off + int64(len(buf))
			buf = append(append(buf, r.body...), '\n')
		}
		err := c.commit(buf, group, offs)
		off += int64(len(buf))
		c.groups++
		for _, r := range group {
			r.done <- err
		}
	}
}

// commit makes one group durable: raw bytes, fsync, then its rows.
func (c *ceilingServer) commit(buf []byte, group []*ceilingReq, offs []int64) error {
	if _, err := c.raw.Write(buf); err != nil {
		return err
	}
	if err := c.raw.Sync(); err != nil {
		return err
	}
	tx, err := c.db.Begin()
	if err != nil {
		return err
	}
	st := tx.Stmt(c.ins)
	for i, r := range group {
		if _, err := st.Exec(r.id, offs[i]); err != nil {
			return errors.Join(err, tx.Rollback())
		}
	}
	return tx.Commit()
}

// stop stops the server and its writer.
func (c *ceilingServer) stop(ctx context.Context) error {
	err := c.srv.Shutdown(ctx)
	close(c.reqs)
	<-c.done
	return errors.Join(err, c.ins.Close(), c.db.Close(), c.raw.Close())
}

// benchCeiling runs the ceiling server in dir under the webhook load.
func benchCeiling(ctx context.Context, o options, dir string) (*webhookResult, error) {
	c, err := startCeiling(dir, o.synchronous)
	if err != nil {
		return nil, fmt.Errorf("ceiling server: %w", err)
	}
	u0, err := getUsage()
	if err != nil {
		return nil, errors.Join(err, c.stop(ctx))
	}
	lat, wall, _, loadErr := loadWebhooks(ctx, o, c.ln.Addr().String())
	u1, uerr := getUsage()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := errors.Join(loadErr, uerr, c.stop(sctx)); err != nil {
		return nil, err
	}
	stored, err := countRows(filepath.Join(dir, "ceiling.db"), "events")
	if err != nil {
		return nil, err
	}
	if stored != int64(len(lat)) {
		return nil, fmt.Errorf("ceiling server stored %d events of %d answered", stored, len(lat))
	}
	res := webhookSummary(o, lat, wall, u0, u1)
	if c.groups > 0 {
		res.MeanGroupSize = round(float64(len(lat))/float64(c.groups), 1)
		res.GroupCommitsPerSec = round(float64(c.groups)/wall.Seconds(), 0)
	}
	return res, nil
}

// ceilingRound runs the ceiling for round, in a subdirectory of dir. The
// runs are labelled (bench=ceiling, bench=daemon), so that one
// -cpuprofile of this mode shows each alone: go tool pprof -tagfocus
// bench=daemon.
func ceilingRound(ctx context.Context, o options, dir string, round int) (c *webhookResult, err error) {
	cdir := filepath.Join(dir, fmt.Sprintf("ceiling-%d", round))
	if err := os.MkdirAll(cdir, 0o750); err != nil {
		return nil, err
	}
	co := o
	co.mode, co.signature = modeWebhookCeiling, "" // the ceiling checks no signature
	pprof.Do(ctx, pprof.Labels("bench", "ceiling"), func(ctx context.Context) { c, err = benchCeiling(ctx, co, cdir) })
	return c, err
}

// daemonRound runs the daemon's webhook mode for round, in a subdirectory
// of dir.
func daemonRound(ctx context.Context, o options, dir string, round int, log *slog.Logger) (d *webhookResult, err error) {
	ddir := filepath.Join(dir, fmt.Sprintf("daemon-%d", round))
	if err := os.MkdirAll(ddir, 0o750); err != nil {
		return nil, err
	}
	wo := o
	wo.mode, wo.sources = modeWebhook, 0
	cfg, err := benchConfig(wo, ddir)
	if err != nil {
		return nil, err
	}
	pprof.Do(ctx, pprof.Labels("bench", "daemon"), func(ctx context.Context) { d, err = benchWebhook(ctx, wo, cfg, log) })
	return d, err
}

// runWebhookCeiling runs the ceiling and the daemon's webhook mode
// alternately, rounds times each (-runs when given, else 2), in
// subdirectories of dir, and prints each run, then the ratio of the
// daemon's best throughput to the ceiling's best and the ratio within
// each round (a ceiling run and a daemon run one after the other, the
// ceiling first in even rounds, the daemon first in odd ones, each round
// printed ceiling first): on a host whose speed moves by 30% within
// minutes, the rounds' ratios show how far one figure can be trusted.
func runWebhookCeiling(ctx context.Context, o options, dir string, log *slog.Logger, stdout io.Writer) error {
	var best [2]*webhookResult // the ceiling's, the daemon's
	var ratios []float64
	for round := range o.ceilingRounds {
		// The side that runs second in a round ran faster in some
		// sittings (the disk, the caches): the order alternates.
		var c, d *webhookResult
		var err error
		if round%2 == 0 {
			if c, err = ceilingRound(ctx, o, dir, round); err == nil {
				d, err = daemonRound(ctx, o, dir, round, log)
			}
		} else if d, err = daemonRound(ctx, o, dir, round, log); err == nil {
			c, err = ceilingRound(ctx, o, dir, round)
		}
		if err != nil {
			return err
		}
		for i, r := range []*webhookResult{c, d} {
			if err := printWebhook(stdout, r, o.json); err != nil {
				return err
			}
			if best[i] == nil || r.PerSec > best[i].PerSec {
				best[i] = r
			}
		}
		ratios = append(ratios, d.PerSec/c.PerSec)
	}
	each := make([]string, len(ratios))
	for i, r := range ratios {
		each[i] = fmt.Sprintf("%.2f", r)
	}
	_, err := fmt.Fprintf(stdout, "webhook-ceiling: the daemon's webhook path reached %.2fx the ceiling (best of %d each: %.0f vs %.0f requests/s; p99 %.2f ms vs %.2f ms); within each round %s, median %.2fx\n",
		best[1].PerSec/best[0].PerSec, len(ratios), best[1].PerSec, best[0].PerSec, best[1].Latency.P99, best[0].Latency.P99,
		strings.Join(each, ", "), median(ratios))
	return err
}
