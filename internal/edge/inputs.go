package edge

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
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ingestorhq/ingestor/internal/telemetry"
)

// maxBatch bounds how many lines already buffered one commit takes.
const maxBatch = 256

// The statuses of a reply to a producer.
const (
	replyAccepted = "accepted"
	replyInvalid  = "invalid"
	replyFull     = "full"
	replyError    = "error"
)

// reply is what a producer is told about one event (Unix socket) or one
// request (HTTP).
type reply struct {
	Status   string   `json:"status"`
	EventID  string   `json:"event_id,omitempty"`
	EventIDs []string `json:"event_ids,omitempty"`
	Error    string   `json:"error,omitempty"`
	Errors   []string `json:"errors,omitempty"`
}

// line is one line of NDJSON input, numbered from 1.
type line struct {
	n    int
	data []byte
	err  error
}

// readBatches reads NDJSON lines from r and passes them to fn in batches:
// a line and the complete lines already buffered after it, so that one
// commit takes many lines when a producer writes fast and one when it
// writes slowly. A line longer than maxLine is passed with an error
// instead of its data. Blank lines are skipped. It returns when r ends
// (nil) or fails, or fn fails.
func readBatches(r io.Reader, maxLine int, fn func([]line) error) error {
	br := bufio.NewReaderSize(r, maxLine+1)
	n := 0
	var batch []line
	for {
		data, err := br.ReadSlice('\n')
		if len(data) > 0 || errors.Is(err, bufio.ErrBufferFull) {
			n++
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			batch = append(batch, line{n: n, err: fmt.Errorf("line longer than %d bytes", maxLine)})
		case len(bytes.TrimSpace(data)) > 0:
			batch = append(batch, line{n: n, data: bytes.Clone(data)})
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return errors.Join(flush(batch, fn), err)
		}
		if errors.Is(err, io.EOF) {
			return flush(batch, fn)
		}
		buffered, _ := br.Peek(br.Buffered()) // Peek of what is buffered cannot fail
		if len(batch) < maxBatch && bytes.IndexByte(buffered, '\n') >= 0 {
			continue
		}
		if err := flush(batch, fn); err != nil {
			return err
		}
		batch = batch[:0]
	}
}

// flush passes a non-empty batch to fn.
func flush(batch []line, fn func([]line) error) error {
	if len(batch) == 0 {
		return nil
	}
	return fn(batch)
}

// parseLines makes lines into envelopes; problems[i] says why lines[i]
// is not one (envs[i] is then nil).
// Each envelope without a traceparent of its own gets ctx's span's, when it
// is sampled (tracing on), so that the daemon continues that trace.
func (f *Forwarder) parseLines(ctx context.Context, lines []line) (envs []*envelope, problems []error) {
	parent, state := telemetry.Parent(trace.SpanContextFromContext(ctx))
	envs = make([]*envelope, len(lines))
	problems = make([]error, len(lines))
	for i, l := range lines {
		if l.err != nil {
			problems[i] = l.err
			continue
		}
		envs[i], problems[i] = parse(f.enc, l.data, parent, state)
	}
	return envs, problems
}

// store commits envs to the outbox and counts the outcome.
func (f *Forwarder) store(ctx context.Context, envs []*envelope) error {
	if len(envs) == 0 {
		return nil
	}
	err := f.ob.add(ctx, envs)
	switch {
	case err == nil:
		f.m.accepted.Add(float64(len(envs)))
	case errors.Is(err, ErrOutboxFull):
		f.m.refused.WithLabelValues("full").Add(float64(len(envs)))
	default:
		f.m.refused.WithLabelValues("error").Add(float64(len(envs)))
	}
	return err
}

// readStdin stores the NDJSON lines of r. An invalid line is reported on
// the log and skipped. When the outbox is full, or a commit fails, reading
// pauses and the same lines are tried again until they are stored, so a
// producer writing to a pipe is held back rather than losing events.
func (f *Forwarder) readStdin(ctx context.Context, r io.Reader) error {
	err := readBatches(r, f.enc.MaxBytes, func(lines []line) (err error) {
		bctx, span := f.acceptSpan(ctx, "stdin", len(lines))
		defer func() { telemetry.End(span, err) }()
		envs, problems := f.parseLines(bctx, lines)
		var valid []*envelope
		for i, p := range problems {
			if p != nil {
				f.m.refused.WithLabelValues("invalid").Inc()
				f.log.Error("stdin: event refused", "line", lines[i].n, "err", p)
				continue
			}
			valid = append(valid, envs[i])
		}
		for attempt := 0; ; attempt++ {
			err := f.store(bctx, valid)
			if err == nil {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			wait := f.opts.ReconnectBase
			if !errors.Is(err, ErrOutboxFull) {
				wait = f.retry.Delay(attempt)
			}
			if attempt == 0 || !errors.Is(err, ErrOutboxFull) {
				f.log.Warn("stdin: paused, events not stored yet", "lines", fmt.Sprintf("%d-%d", lines[0].n, lines[len(lines)-1].n), "err", err)
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("stdin: %w", err)
	}
	f.log.Info("stdin: end of input; the forwarder keeps sending the outbox")
	return nil
}

// serveSocket answers one Unix socket connection: one reply line per
// NDJSON line, in order, each written after the event's commit.
func (f *Forwarder) serveSocket(ctx context.Context, conn net.Conn) error {
	enc := json.NewEncoder(conn)
	err := readBatches(conn, f.enc.MaxBytes, func(lines []line) error {
		bctx, span := f.acceptSpan(ctx, "socket", len(lines))
		envs, problems := f.parseLines(bctx, lines)
		var valid []*envelope
		for i, p := range problems {
			if p == nil {
				valid = append(valid, envs[i])
			} else {
				f.m.refused.WithLabelValues("invalid").Inc()
			}
		}
		stored := f.store(bctx, valid)
		telemetry.End(span, stored)
		for i, p := range problems {
			r := reply{Status: replyAccepted}
			switch {
			case p != nil:
				r = reply{Status: replyInvalid, Error: fmt.Sprintf("line %d: %v", lines[i].n, p)}
			case errors.Is(stored, ErrOutboxFull):
				r = reply{Status: replyFull, Error: stored.Error()}
			case stored != nil:
				r = reply{Status: replyError, Error: stored.Error()}
			default:
				r.EventID = envs[i].EventID
			}
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	})
	return errors.Join(err, conn.Close())
}

// maxRequestBytes bounds an HTTP request body.
const maxRequestBytes = 16 << 20

// handleEvents is POST /events: a body of one JSON object, or NDJSON.
// The whole body is stored in one commit or not at all, and the answer
// goes out after the commit: 200 with the event ids, 400 naming every
// invalid line, 403 for a request a web page made, 413 for a body over
// maxRequestBytes, 503 with Retry-After when the outbox is full, 500 when
// the commit failed.
func (f *Forwarder) handleEvents(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		f.writeReply(w, http.StatusMethodNotAllowed, reply{Status: replyInvalid, Error: "use POST"})
		return
	}
	if why := fromBrowser(r); why != "" {
		f.writeReply(w, http.StatusForbidden, reply{Status: replyInvalid, Error: why})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			f.writeReply(w, http.StatusRequestEntityTooLarge, reply{Status: replyInvalid, Error: fmt.Sprintf("body over %d bytes", maxRequestBytes)})
			return
		}
		f.writeReply(w, http.StatusBadRequest, reply{Status: replyInvalid, Error: "read the body: " + err.Error()})
		return
	}
	var lines []line
	if trimmed := bytes.TrimSpace(body); json.Valid(trimmed) {
		lines = []line{{n: 1, data: trimmed}}
	} else if err := readBatches(bytes.NewReader(body), f.enc.MaxBytes, func(b []line) error {
		lines = append(lines, b...)
		return nil
	}); err != nil {
		f.writeReply(w, http.StatusBadRequest, reply{Status: replyInvalid, Error: err.Error()})
		return
	}
	if len(lines) == 0 {
		f.writeReply(w, http.StatusBadRequest, reply{Status: replyInvalid, Error: "empty body: send one JSON object, or NDJSON"})
		return
	}
	envs, problems := f.parseLines(r.Context(), lines)
	var bad []string
	for i, p := range problems {
		if p != nil {
			bad = append(bad, fmt.Sprintf("line %d: %v", lines[i].n, p))
		}
	}
	if len(bad) > 0 {
		f.m.refused.WithLabelValues("invalid").Add(float64(len(lines)))
		f.writeReply(w, http.StatusBadRequest, reply{Status: replyInvalid, Error: "nothing stored: " + bad[0], Errors: bad})
		return
	}
	switch err := f.store(r.Context(), envs); {
	case errors.Is(err, ErrOutboxFull):
		w.Header().Set("Retry-After", strconv.Itoa(int(fullRetryAfter/time.Second)))
		f.writeReply(w, http.StatusServiceUnavailable, reply{Status: replyFull, Error: err.Error()})
	case err != nil:
		f.log.Error("http: store events", "err", err)
		f.writeReply(w, http.StatusInternalServerError, reply{Status: replyError, Error: err.Error()})
	default:
		ids := make([]string, len(envs))
		for i, e := range envs {
			ids[i] = e.EventID
		}
		f.writeReply(w, http.StatusOK, reply{Status: replyAccepted, EventIDs: ids})
	}
}

// fromBrowser returns why r looks like a request a web page made, or "".
// The HTTP input has no authentication, so a page shown by a browser on
// the device must not post events to it: browsers mark cross-site
// requests with Origin and Sec-Fetch-Site, and a DNS rebinding attack
// shows as a Host that is not a loopback address or localhost.
func fromBrowser(r *http.Request) string {
	if r.Header.Get("Origin") != "" {
		return "requests from web pages (with an Origin header) are refused"
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "none" {
		return "requests from web pages (Sec-Fetch-Site " + site + ") are refused"
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
		return fmt.Sprintf("host %q is not a loopback address or localhost", r.Host)
	}
	return ""
}

// fullRetryAfter is the Retry-After of a 503 for a full outbox.
const fullRetryAfter = 5 * time.Second

// writeReply writes r as JSON with status.
func (f *Forwarder) writeReply(w http.ResponseWriter, status int, r reply) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(r); err != nil {
		f.log.Debug("http: write the reply", "status", status, "err", err)
	}
}

// acceptSpan starts the span of a batch of lines read from input (stdin,
// socket), the root of their traces, when tracing is on (the sampler
// decides); else it returns ctx and a no-op span.
func (f *Forwarder) acceptSpan(ctx context.Context, input string, lines int) (context.Context, trace.Span) {
	if f.opts.TracerProvider == nil {
		return ctx, noop.Span{}
	}
	return f.opts.TracerProvider.Tracer(telemetry.ScopeName).Start(ctx, "edge accept", trace.WithNewRoot(),
		trace.WithAttributes(attribute.String("ingestor.input", input), attribute.Int("ingestor.lines", lines)))
}
