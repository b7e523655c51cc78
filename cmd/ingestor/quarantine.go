package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/queue"
)

const quarantineUsage = `usage:
  ingestor quarantine list -c FILE [-source S] [-limit N] [-o json]
  ingestor quarantine show ID -c FILE [-o json]
  ingestor quarantine clear -c FILE -source S

The quarantine holds the last refused deliveries of each webhook source
(quarantine_size), newest first. With the daemon running, quarantine talks
to its admin endpoints, as ingestor dlq does; with it stopped, it opens the
queue itself.
`

// quarantineBackend is what `ingestor quarantine` needs: the running
// daemon's admin endpoints, or the queue opened directly.
type quarantineBackend interface {
	List(ctx context.Context, source string, limit int) ([]queue.Rejected, error)
	Show(ctx context.Context, id int64) (queue.Rejected, error)
	Clear(ctx context.Context, source string) (int, error)
}

func cmdQuarantine(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, quarantineUsage)
		return 2
	}
	sub := args[0]
	if isHelp(sub) {
		fmt.Fprint(stdout, quarantineUsage)
		return 0
	}
	sc := newSubcommand("quarantine "+sub, "", "config file", stderr)
	fs := sc.fs
	source := fs.String("source", "", "only deliveries of this source")
	limit := fs.Int("limit", 100, "list at most this many")
	output := fs.String("o", "", `output format: "json", or a table by default`)
	pos, code, done := sc.parse(args[1:])
	if done {
		return code
	}
	fail := sc.fail
	switch {
	case !slices.Contains([]string{"list", "show", "clear"}, sub):
		fmt.Fprintf(stderr, "ingestor quarantine: unknown command %q\n%s", sub, quarantineUsage)
		return 2
	case !sc.hasPath():
		return fail("-c FILE is required")
	case *output != "" && *output != "json":
		return fail("-o %q: want json", *output)
	case *limit <= 0:
		return fail("-limit %d: want a positive number", *limit)
	case sub == "show" && len(pos) != 1, sub != "show" && len(pos) != 0:
		return fail("give exactly one ID to show, none to list or clear")
	case sub == "clear" && *source == "":
		return fail("-source S is required")
	}
	var id int64
	if sub == "show" {
		n, err := strconv.ParseInt(pos[0], 10, 64)
		if err != nil || n <= 0 {
			return fail("%q is not a quarantined delivery id", pos[0])
		}
		id = n
	}

	cfg := sc.load()
	if cfg == nil {
		return 1
	}
	o := quarantineOptions{sub: sub, source: *source, limit: *limit, id: id, json: *output == "json"}
	return onBackend("quarantine", stderr,
		func(context.Context) (quarantineBackend, func() error, error) { return openQuarantine(cfg) },
		func(ctx context.Context, b quarantineBackend) int { return execQuarantine(ctx, b, o, stdout, stderr) })
}

// quarantineOptions are what an ingestor quarantine command line asks for.
type quarantineOptions struct {
	sub, source string
	limit       int
	id          int64 // show's
	json        bool  // -o json
}

// execQuarantine runs o's command on b and returns the exit status.
func execQuarantine(ctx context.Context, b quarantineBackend, o quarantineOptions, stdout, stderr io.Writer) int {
	var out any
	var err error
	switch o.sub {
	case "list":
		var list []queue.Rejected
		if list, err = b.List(ctx, o.source, o.limit); err == nil && !o.json {
			printQuarantineTable(stdout, list)
			return 0
		}
		out = list
	case "show":
		var e queue.Rejected
		if e, err = b.Show(ctx, o.id); err == nil && !o.json {
			printRejected(stdout, e)
			return 0
		}
		out = e
	case "clear":
		var n int
		if n, err = b.Clear(ctx, o.source); err == nil && !o.json {
			fmt.Fprintf(stdout, "%d quarantined delivery(ies) of %s cleared\n", n, o.source)
			return 0
		}
		out = map[string]int{"cleared": n}
	}
	if err == nil {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(out)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ingestor quarantine %s: %v\n", o.sub, err)
		return 1
	}
	return 0
}

// openQuarantine reaches the quarantine as openDLQ reaches the dead-letter
// list.
func openQuarantine(cfg *config.Config) (quarantineBackend, func() error, error) {
	q, remote, closeQ, err := openQueueOrDaemon(cfg, "quarantine")
	if err != nil {
		return nil, nil, err
	}
	if remote != nil {
		return httpQuarantine{remote}, closeQ, nil
	}
	return queueQuarantine{q}, closeQ, nil
}

// queueQuarantine is the quarantine of a queue opened directly.
type queueQuarantine struct{ q *queue.Queue }

func (b queueQuarantine) List(ctx context.Context, source string, limit int) ([]queue.Rejected, error) {
	return b.q.QuarantineList(ctx, source, limit)
}

func (b queueQuarantine) Show(ctx context.Context, id int64) (queue.Rejected, error) {
	return b.q.Quarantined(ctx, id)
}

func (b queueQuarantine) Clear(ctx context.Context, source string) (int, error) {
	return b.q.ClearQuarantine(ctx, source)
}

// httpQuarantine is the running daemon's quarantine, over its admin
// endpoints.
type httpQuarantine struct{ h *httpDLQ }

func (b httpQuarantine) List(ctx context.Context, source string, limit int) ([]queue.Rejected, error) {
	v := url.Values{"limit": {strconv.Itoa(limit)}}
	if source != "" {
		v.Set("source", source)
	}
	var list []queue.Rejected
	_, err := b.h.do(ctx, http.MethodGet, "/quarantine?"+v.Encode(), nil, &list)
	return list, err
}

func (b httpQuarantine) Show(ctx context.Context, id int64) (queue.Rejected, error) {
	var e queue.Rejected
	_, err := b.h.do(ctx, http.MethodGet, "/quarantine/"+strconv.FormatInt(id, 10), nil, &e)
	return e, err
}

func (b httpQuarantine) Clear(ctx context.Context, source string) (int, error) {
	var out struct {
		Cleared int `json:"cleared"`
	}
	_, err := b.h.do(ctx, http.MethodDelete, "/quarantine?"+url.Values{"source": {source}}.Encode(), nil, &out)
	return out.Cleared, err
}

// printQuarantineTable prints refused deliveries, newest first.
func printQuarantineTable(w io.Writer, list []queue.Rejected) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSOURCE\tTIME\tREASON\tCODE\tREQUEST ID\tREMOTE")
	for _, e := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.Source, e.At.Format(time.RFC3339), e.Reason, e.Code, e.RequestID, e.Remote)
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintf(w, "write table: %v\n", err)
	}
	fmt.Fprintf(w, "%d quarantined delivery(ies)\n", len(list))
}

// printRejected prints one refused delivery: its headers sorted, its body
// as text when it is UTF-8 (quoted when it holds control characters),
// else as base64.
func printRejected(w io.Writer, e queue.Rejected) {
	fmt.Fprintf(w, "id:          %d\nsource:      %s\ntime:        %s\nreason:      %s\ncode:        %d\nerror:       %s\n",
		e.ID, e.Source, e.At.Format(time.RFC3339Nano), e.Reason, e.Code, e.Detail)
	fmt.Fprintf(w, "request id:  %s\nremote:      %s\nrequest:     %s %s\nheaders:\n", e.RequestID, e.Remote, e.Method, e.Path)
	names := make([]string, 0, len(e.Headers))
	for name := range e.Headers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, v := range e.Headers[name] {
			fmt.Fprintf(w, "  %s: %s\n", name, v)
		}
	}
	text, enc := queue.BodyText(e.Body)
	if enc == "text" && strings.ContainsFunc(text, func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' }) {
		// The sender wrote it: no escape sequence reaches the terminal.
		text, enc = strconv.Quote(text), "text, quoted"
	}
	cut := ""
	if e.Truncated {
		cut = ", truncated"
	}
	fmt.Fprintf(w, "body (%d bytes, %s%s):\n%s\n", len(e.Body), enc, cut, text)
}
