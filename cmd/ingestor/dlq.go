package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/adminapi"
	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
)

const dlqUsage = `usage:
  ingestor dlq list -c FILE [-source S] [-reason TEXT] [-since RFC3339] [-until RFC3339] [-limit N] [-after ID] [-replayed]
  ingestor dlq show ID -c FILE
  ingestor dlq replay -c FILE (ID... | -source S -reason TEXT -since T -until T | -all)
  ingestor dlq drop -c FILE (ID... | -source S -reason TEXT -since T -until T | -all) [-yes]

With the daemon running, dlq talks to its admin endpoints at daemon.admin_addr
(or daemon.http_addr when that is not set), sending daemon.admin_token, and
replayed events are delivered at once; with it stopped, dlq opens the queue
itself (holding the data dir lock) and replayed events go out on the next start.
`

// dlqBackend is what `ingestor dlq` needs: the running daemon's admin
// endpoints, or the queue opened directly.
type dlqBackend interface {
	// List returns a page of the dead letters f selects and how many it
	// selects in all.
	List(ctx context.Context, f queue.DLQFilter) ([]queue.DeadLetter, int, error)
	Show(ctx context.Context, id int64) (queue.DeadLetter, error)
	Replay(ctx context.Context, r queue.DLQRequest) (int, error)
	Drop(ctx context.Context, r queue.DLQRequest) (int, error)
}

func cmdDLQ(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, dlqUsage)
		return 2
	}
	sub := args[0]
	if isHelp(sub) {
		fmt.Fprint(stdout, dlqUsage)
		return 0
	}
	sc := newSubcommand("dlq "+sub, "", "config file", stderr)
	o, code, ok := parseDLQ(sc, sub, args[1:], stderr)
	if !ok {
		return code
	}
	cfg := sc.load()
	if cfg == nil {
		return 1
	}
	return onBackend("dlq", stderr,
		func(ctx context.Context) (dlqBackend, func() error, error) { return openDLQ(ctx, cfg) },
		func(ctx context.Context, b dlqBackend) int { return execDLQ(ctx, b, o, stdin, stdout, stderr) })
}

// onBackend opens the backend of the command name (dlq, quarantine: the
// running daemon or the queue), runs run on it under a context that
// SIGINT and SIGTERM end, closes it and returns run's exit status.
func onBackend[B any](name string, stderr io.Writer, open func(context.Context) (B, func() error, error),
	run func(context.Context, B) int) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	b, closeB, err := open(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "ingestor %s: %v\n", name, err)
		return 1
	}
	defer func() {
		if err := closeB(); err != nil {
			fmt.Fprintf(stderr, "ingestor %s: %v\n", name, err)
		}
	}()
	return run(ctx, b)
}

// dlqOptions are what an ingestor dlq command line asks for.
type dlqOptions struct {
	sub    string
	req    queue.DLQRequest // the ids and filters, for replay and drop
	filter queue.DLQFilter  // the same, paged, for list, show and drop's question
	yes    bool             // drop without asking
}

// parseDLQ reads the flags and arguments of ingestor dlq sub; without ok
// the command ends with code.
func parseDLQ(sc *subcommand, sub string, args []string, stderr io.Writer) (o dlqOptions, code int, ok bool) {
	fs := sc.fs
	source := fs.String("source", "", "only dead letters of this source")
	reason := fs.String("reason", "", "only dead letters whose reason contains this text")
	since := fs.String("since", "", "only dead letters created at or after this time (RFC 3339)")
	until := fs.String("until", "", "only dead letters created before this time (RFC 3339)")
	limit := fs.Int("limit", 100, "list at most this many")
	after := fs.Int64("after", 0, "list only ids above this one (paging)")
	replayed := fs.Bool("replayed", false, "list replayed and resolved dead letters too")
	all := fs.Bool("all", false, "replay or drop every active dead letter the filters select")
	yes := fs.Bool("yes", false, "drop without asking")
	pos, code, done := sc.parse(args)
	if done {
		return o, code, false
	}
	if !sc.needPath() {
		return o, 2, false
	}
	var ids []int64
	for _, p := range pos {
		id, err := strconv.ParseInt(p, 10, 64)
		if err != nil || id <= 0 {
			fmt.Fprintf(stderr, "ingestor dlq %s: %q is not a dead-letter id\n", sub, p)
			return o, 2, false
		}
		ids = append(ids, id)
	}
	req := queue.DLQRequest{IDs: ids, Source: *source, Reason: *reason, All: *all}
	for _, t := range []struct {
		name, val string
		dst       *time.Time
	}{{"since", *since, &req.Since}, {"until", *until, &req.Until}} {
		if t.val == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.val)
		if err != nil {
			fmt.Fprintf(stderr, "ingestor dlq %s: -%s: %v\n", sub, t.name, err)
			return o, 2, false
		}
		*t.dst = v
	}
	switch sub {
	case "list", "replay", "drop":
	case "show":
		if len(ids) != 1 {
			fmt.Fprintln(stderr, "ingestor dlq show: give exactly one ID")
			return o, 2, false
		}
	default:
		fmt.Fprintf(stderr, "ingestor dlq: unknown command %q\n%s", sub, dlqUsage)
		return o, 2, false
	}
	if (sub == "replay" || sub == "drop") && len(ids) == 0 && req.Source == "" && req.Reason == "" &&
		req.Since.IsZero() && req.Until.IsZero() && !req.All {
		fmt.Fprintf(stderr, "ingestor dlq %s: name IDs, a filter (-source, -reason, -since, -until) or -all\n", sub)
		return o, 2, false
	}
	filter := queue.DLQFilter{IDs: ids, Source: req.Source, Reason: req.Reason, Since: req.Since, Until: req.Until,
		Limit: *limit, AfterID: *after, IncludeReplayed: *replayed}
	return dlqOptions{sub: sub, req: req, filter: filter, yes: *yes}, 0, true
}

// execDLQ runs o's command on b and returns the exit status.
func execDLQ(ctx context.Context, b dlqBackend, o dlqOptions, stdin io.Reader, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "ingestor dlq %s: %v\n", o.sub, err)
		return 1
	}
	switch o.sub {
	case "list":
		list, total, err := b.List(ctx, o.filter)
		if err != nil {
			return fail(err)
		}
		printDLQTable(stdout, list, total)
	case "show":
		e, err := b.Show(ctx, o.req.IDs[0])
		if err != nil {
			return fail(err)
		}
		printDLQEntry(stdout, e)
	case "replay":
		n, err := b.Replay(ctx, o.req)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "%d event(s) queued again\n", n)
	case "drop":
		if !o.yes {
			if code, asked := confirmDrop(ctx, b, o.filter, stdin, stdout, stderr); !asked {
				return code
			}
		}
		n, err := b.Drop(ctx, o.req)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "%d dead letter(s) dropped\n", n)
	}
	return 0
}

// confirmDrop asks before dropping the dead letters filter selects; it
// reports true when the answer is yes, else the exit status.
func confirmDrop(ctx context.Context, b dlqBackend, filter queue.DLQFilter, stdin io.Reader, stdout, stderr io.Writer) (code int, yes bool) {
	filter.Limit = 1 << 30
	sel, _, err := b.List(ctx, filter)
	if err != nil {
		fmt.Fprintf(stderr, "ingestor dlq drop: %v\n", err)
		return 1, false
	}
	if len(sel) == 0 {
		fmt.Fprintln(stdout, "no dead letter matches")
		return 0, false
	}
	fmt.Fprintf(stdout, "drop %d dead letter(s)? Their events are not delivered again. [y/N] ", len(sel))
	answer, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintf(stderr, "ingestor dlq drop: read answer: %v\n", err)
		return 1, false
	}
	if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
		fmt.Fprintln(stdout, "nothing dropped")
		return 1, false
	}
	return 0, true
}

// openDLQ reaches the dead-letter list: through the running daemon when it
// holds the data dir lock, otherwise through the queue, opened while
// holding the lock so that no daemon starts meanwhile.
func openDLQ(ctx context.Context, cfg *config.Config) (dlqBackend, func() error, error) {
	q, remote, closeQ, err := openQueueOrDaemon(cfg, "dlq")
	if err != nil {
		return nil, nil, err
	}
	if remote != nil {
		return remote, closeQ, nil
	}
	raw, err := rawstore.Open(ctx, rawstore.Options{URL: cfg.RawStore.URL, Endpoint: cfg.RawStore.Endpoint,
		Region: cfg.RawStore.Region, PathStyle: cfg.RawStore.PathStyle})
	if err != nil {
		return nil, nil, errors.Join(err, closeQ())
	}
	return queue.NewDLQ(q, raw, nil), closeQ, nil
}

// openQueueOrDaemon reaches the queue of cfg's data dir for the command
// cmd: remote is the running daemon's admin endpoints when it holds the
// data dir lock; otherwise q is the queue, opened while holding the lock
// so that no daemon starts meanwhile. closeQ closes what was opened.
func openQueueOrDaemon(cfg *config.Config, cmd string) (q *queue.Queue, remote *httpDLQ, closeQ func() error, err error) {
	dir := cfg.Daemon.DataDir
	qpath := filepath.Join(dir, "queue.db")
	if _, err := os.Stat(qpath); err != nil {
		return nil, nil, nil, fmt.Errorf("no queue in data dir %s: %w", dir, err)
	}
	unlock, err := datadir.Lock(dir)
	var inUse *datadir.InUseError
	if errors.As(err, &inUse) {
		addr := cfg.Daemon.AdminListenAddr()
		if addr == "" {
			return nil, nil, nil, fmt.Errorf("%w; its ops endpoints are off (daemon.http_addr is empty), so stop it to use %s", err, cmd)
		}
		return nil, newHTTPDLQ(addr, cfg.Daemon.AdminToken, cfg.Name()), func() error { return nil }, nil
	}
	if err != nil {
		return nil, nil, nil, err
	}
	q, err = queue.Open(queue.Options{Path: qpath, Synchronous: cfg.Publish.Synchronous, EventsPerFrame: cfg.Publish.EventsPerFrame})
	if err != nil {
		return nil, nil, nil, errors.Join(err, unlock())
	}
	return q, nil, func() error { return errors.Join(q.Close(), unlock()) }, nil
}

// adminURL is the base URL of the ops endpoints listening on addr
// (host:port); a wildcard host is reached on loopback.
func adminURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// httpDLQ is the running daemon's dead-letter list, over its admin endpoints.
type httpDLQ struct {
	base   string
	client *http.Client
	// token is daemon.admin_token, sent as a bearer token when set.
	token string
	// file is the config file, named in authorization errors.
	file string
}

// newHTTPDLQ reaches the admin endpoints at addr: host:port, or unix:PATH.
func newHTTPDLQ(addr, token, file string) *httpDLQ {
	h := &httpDLQ{base: adminURL(addr), client: &http.Client{Timeout: 30 * time.Second}, token: token, file: file}
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		var dialer net.Dialer
		h.base = "http://localhost"
		h.client.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", path)
		}}
	}
	return h
}

func (h *httpDLQ) List(ctx context.Context, f queue.DLQFilter) ([]queue.DeadLetter, int, error) {
	v := url.Values{}
	for _, id := range f.IDs {
		v.Add("id", strconv.FormatInt(id, 10))
	}
	set := func(k, val string) {
		if val != "" {
			v.Set(k, val)
		}
	}
	set("source", f.Source)
	set("reason", f.Reason)
	if !f.Since.IsZero() {
		v.Set("since", f.Since.Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		v.Set("until", f.Until.Format(time.RFC3339))
	}
	if f.Limit > 0 {
		v.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.AfterID > 0 {
		v.Set("after", strconv.FormatInt(f.AfterID, 10))
	}
	if f.IncludeReplayed {
		v.Set("replayed", "1")
	}
	var out []queue.DeadLetter
	resp, err := h.do(ctx, http.MethodGet, "/dlq?"+v.Encode(), nil, &out)
	if err != nil {
		return nil, 0, err
	}
	total, err := strconv.Atoi(resp.Get(adminapi.TotalCountHeader))
	if err != nil {
		return nil, 0, fmt.Errorf("GET /dlq: header %s: %w", adminapi.TotalCountHeader, err)
	}
	return out, total, nil
}

func (h *httpDLQ) Show(ctx context.Context, id int64) (queue.DeadLetter, error) {
	var e queue.DeadLetter
	_, err := h.do(ctx, http.MethodGet, "/dlq/"+strconv.FormatInt(id, 10), nil, &e)
	return e, err
}

func (h *httpDLQ) Replay(ctx context.Context, r queue.DLQRequest) (int, error) {
	var out struct {
		Replayed int `json:"replayed"`
	}
	_, err := h.do(ctx, http.MethodPost, "/dlq/replay", r, &out)
	return out.Replayed, err
}

func (h *httpDLQ) Drop(ctx context.Context, r queue.DLQRequest) (int, error) {
	var out struct {
		Dropped int `json:"dropped"`
	}
	_, err := h.do(ctx, http.MethodPost, "/dlq/drop", r, &out)
	return out.Dropped, err
}

// do sends a request to the admin endpoints, decodes the JSON response
// into out and returns the response headers.
func (h *httpDLQ) do(ctx context.Context, method, path string, body, out any) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil || method != http.MethodGet {
		// The admin endpoints want JSON on every request that changes
		// state, with a body or not (DELETE).
		req.Header.Set("Content-Type", "application/json")
	}
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("daemon admin endpoint: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, h.base+path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, h.refused(resp, data)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return nil, fmt.Errorf("%s %s: decode response: %w", method, h.base+path, err)
	}
	return resp.Header, nil
}

// refused is the error of an admin answer other than 200, whose body is
// data: the daemon's words, and which key to fix when it refused the
// token.
func (h *httpDLQ) refused(resp *http.Response, data []byte) error {
	var e struct {
		Error string `json:"error"`
	}
	msg := resp.Status
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		msg = e.Error
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized && h.token == "":
		return fmt.Errorf("the daemon requires an admin token (%s): set daemon.admin_token or daemon.admin_token_file in %s", msg, h.file)
	case resp.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("the daemon refused the admin token of %s (%s): it must match the running daemon's", h.file, msg)
	case resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("the daemon refused the request (403 Forbidden): %s", msg)
	}
	return fmt.Errorf("daemon: %s", msg)
}

// printDLQTable prints a page of dead letters, saying how many there are
// in all when the page holds fewer.
func printDLQTable(w io.Writer, list []queue.DeadLetter, total int) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSOURCE\tSEQ/KEY\tREASON\tDELIVERIES\tCOUNT\tCREATED\tLAST SEEN")
	for _, e := range list {
		what := "payload " + e.RawKey
		if e.Kind == "event" {
			what = fmt.Sprintf("%d/%s", e.Seq, e.Key)
		}
		reason := e.Reason
		if len(reason) > 60 {
			reason = reason[:57] + "..."
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", e.ID, e.Source, what, reason, e.Deliveries, e.Count,
			e.CreatedAt.Format(time.RFC3339), e.LastSeen.Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintf(w, "write table: %v\n", err)
	}
	if len(list) < total {
		fmt.Fprintf(w, "showing %d of %d dead letter(s)\n", len(list), total)
		return
	}
	fmt.Fprintf(w, "%d dead letter(s)\n", len(list))
}

func printDLQEntry(w io.Writer, e queue.DeadLetter) {
	fmt.Fprintf(w, "id:          %d\nkind:        %s\nsource:      %s\nreason:      %s\nraw object:  %s\n", e.ID, e.Kind, e.Source, e.Reason, e.RawKey)
	if e.Kind == "event" {
		fmt.Fprintf(w, "key:         %s\nseq:         %d\nframe:       %d\nraw range:   [%d,+%d)\n", e.Key, e.Seq, e.Frame, e.RawOff, e.RawLen)
	}
	fmt.Fprintf(w, "deliveries:  %d\ncount:       %d\ncreated:     %s\nlast seen:   %s\n", e.Deliveries, e.Count,
		e.CreatedAt.Format(time.RFC3339Nano), e.LastSeen.Format(time.RFC3339Nano))
	if !e.ReplayedAt.IsZero() {
		fmt.Fprintf(w, "replayed:    %s\n", e.ReplayedAt.Format(time.RFC3339Nano))
	}
	fmt.Fprintln(w, "history:")
	for _, h := range e.History {
		fmt.Fprintf(w, "  %s  %s  %s\n", h.At.Format(time.RFC3339Nano), h.Action, h.Detail)
	}
	if e.PayloadError != "" {
		fmt.Fprintf(w, "payload:     unavailable: %s\n", e.PayloadError)
		return
	}
	fmt.Fprintf(w, "payload:\n%s\n", e.Payload)
}
