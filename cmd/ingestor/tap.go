package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ingestorhq/ingestor/internal/adminapi"
)

const tapUsage = `usage: ingestor tap [-c FILE] [-source NAME ...] [-max-bytes N] [-format text|json] [-limit N]

Follow the running daemon's events live, as they are committed (durable):
source, key, seq, commit time and the first -max-bytes of each payload,
marked when cut. Nothing is stored or acked: tap only watches. A tap that
reads too slowly misses events, and a line says how many; the daemon never
waits for it. It reaches the daemon like ingestor dlq: at daemon.admin_addr
(or daemon.http_addr) of -c FILE (the embedded example config without it),
sending daemon.admin_token. Ctrl-C stops it.

  ingestor tap -c ingestor.toml -source orders,refunds
  ingestor tap -c ingestor.toml -format json -max-bytes 4096 | jq .payload

`

// sourceList is the -source flag: repeated, or a comma-separated list.
type sourceList []string

func (l *sourceList) String() string { return strings.Join(*l, ",") }

func (l *sourceList) Set(v string) error {
	for _, name := range strings.Split(v, ",") {
		if name = strings.TrimSpace(name); name != "" {
			*l = append(*l, name)
		}
	}
	return nil
}

// tapOptions are the flags of `ingestor tap`.
type tapOptions struct {
	sources  sourceList
	maxBytes int
	json     bool
	limit    int
}

// cmdTap follows the running daemon's GET /tap and prints its events.
func cmdTap(args []string, stdout, stderr io.Writer) int {
	sc := newSubcommand("tap", tapUsage, "config file: its daemon.admin_addr (or http_addr) and admin token reach the daemon (default: the embedded example config)", stderr)
	var o tapOptions
	sc.fs.Var(&o.sources, "source", "only the events of source `NAME`; repeat it or give a comma-separated list (default: every source)")
	sc.fs.IntVar(&o.maxBytes, "max-bytes", 200, "print at most this many bytes of each payload, 0 to 65536")
	format := sc.fs.String("format", "text", "output: text, or json (one JSON object per line, for jq)")
	sc.fs.IntVar(&o.limit, "limit", 0, "exit after this many events (0: until Ctrl-C)")
	pos, code, done := sc.parse(args)
	switch {
	case done:
		return code
	case len(pos) > 0:
		return sc.fail("unexpected argument %q", pos[0])
	case *format != "text" && *format != "json":
		return sc.fail("-format %q: want text or json", *format)
	case o.maxBytes < 0 || o.limit < 0:
		return sc.fail("-max-bytes and -limit must not be negative")
	}
	o.json = *format == "json"
	cfg, err := loadConfig(*sc.paths)
	if err != nil {
		printConfigError(stderr, err)
		return 1
	}
	file := cmp.Or(cfg.Name(), "the default config")
	addr := cfg.Daemon.AdminListenAddr()
	if addr == "" {
		fmt.Fprintf(stderr, "ingestor tap: %s has no admin listener (daemon.http_addr and admin_addr are empty)\n", file)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	h := newHTTPDLQ(addr, cfg.Daemon.AdminToken, file)
	if err := h.tap(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "ingestor tap: %v\n", err)
		return 1
	}
	return 0
}

// tap streams GET /tap with o's filters and prints it until the context
// ends (Ctrl-C) or o.limit events were printed; an end of the stream
// before is an error.
func (h *httpDLQ) tap(ctx context.Context, o tapOptions, stdout, stderr io.Writer) error {
	v := url.Values{"max_bytes": {strconv.Itoa(o.maxBytes)}}
	for _, s := range o.sources {
		v.Add("source", s)
	}
	where := h.base + adminapi.TapPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, where+"?"+v.Encode(), nil)
	if err != nil {
		return fmt.Errorf("tap %s: %w", where, err)
	}
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	// A stream has no overall timeout; the daemon must answer soon, though.
	tr, _ := h.client.Transport.(*http.Transport)
	if tr == nil {
		tr = &http.Transport{DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext}
	}
	tr.ResponseHeaderTimeout = 10 * time.Second
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("tap %s: is the daemon running? %w", where, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return h.refused(resp, data)
	}
	p := &tapPrinter{o: o, out: bufio.NewWriter(stdout), stderr: stderr, where: where}
	err = p.follow(bufio.NewReaderSize(resp.Body, 64<<10))
	if ctx.Err() != nil || errors.Is(err, errTapLimit) {
		err = nil
	}
	return errors.Join(err, p.out.Flush())
}

// errTapLimit ends a tap once -limit events were printed.
var errTapLimit = errors.New("limit reached")

// tapPrinter prints the lines of a GET /tap stream.
type tapPrinter struct {
	o       tapOptions
	out     *bufio.Writer
	stderr  io.Writer
	where   string
	printed int
}

// follow prints the stream's lines as they come, flushing whenever it has
// read all that arrived, until the stream ends (an error) or -limit.
func (p *tapPrinter) follow(br *bufio.Reader) error {
	for {
		if br.Buffered() == 0 {
			if err := p.out.Flush(); err != nil {
				return err
			}
		}
		line, err := readTapLine(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("the daemon closed the stream")
			}
			return fmt.Errorf("read %s: %w", p.where, err)
		}
		if len(line) == 0 {
			continue // a keepalive
		}
		if err := p.line(line); err != nil {
			return err
		}
	}
}

// readTapLine returns the next line of br without its newline.
func readTapLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		line = append(line, frag...)
		switch {
		case err == nil:
			return bytes.TrimRight(line, "\r\n"), nil
		case !errors.Is(err, bufio.ErrBufferFull):
			return nil, err
		case len(line) > 4<<20:
			return nil, errors.New("a line over 4 MiB")
		}
	}
}

// line prints one line of the stream.
func (p *tapPrinter) line(line []byte) error {
	var head struct{ Type string }
	if err := json.Unmarshal(line, &head); err != nil {
		return fmt.Errorf("%s: a line that is not JSON: %w", p.where, err)
	}
	switch head.Type {
	case adminapi.TapTypeStart:
		var st adminapi.TapStart
		if err := json.Unmarshal(line, &st); err != nil {
			return fmt.Errorf("%s: start line: %w", p.where, err)
		}
		which := "every source"
		if len(st.Sources) > 0 {
			which = strings.Join(st.Sources, ", ")
		}
		fmt.Fprintf(p.stderr, "tapping %s at %s, payloads cut at %d bytes; Ctrl-C stops\n", which, p.where, st.MaxBytes)
	case adminapi.TapTypeEvent:
		if err := p.event(line); err != nil {
			return err
		}
		if p.printed++; p.o.limit > 0 && p.printed >= p.o.limit {
			return errTapLimit
		}
	case adminapi.TapTypeDropped:
		var d adminapi.TapDropped
		if err := json.Unmarshal(line, &d); err != nil {
			return fmt.Errorf("%s: dropped line: %w", p.where, err)
		}
		if p.o.json {
			return p.write(line)
		}
		fmt.Fprintf(p.out, "… %d %s dropped (the terminal is too slow)\n", d.Dropped, plural(d.Dropped, "event"))
	case adminapi.TapTypeEnd:
		var e adminapi.TapEnd
		_ = json.Unmarshal(line, &e)
		return fmt.Errorf("the daemon ended the stream: %s", e.Reason)
	}
	// A line of a type this client does not know is skipped.
	return nil
}

// event prints an event line: as it came with -format json, else as text.
func (p *tapPrinter) event(line []byte) error {
	if p.o.json {
		return p.write(line)
	}
	var ev adminapi.TapEvent
	if err := json.Unmarshal(line, &ev); err != nil {
		return fmt.Errorf("%s: event line: %w", p.where, err)
	}
	payload := ""
	if ev.Payload != nil {
		payload = printable(*ev.Payload)
	} else if ev.PayloadB64 != "" {
		payload = "base64:" + ev.PayloadB64
	}
	fmt.Fprintf(p.out, "%s %s seq=%d key=%s %s", ev.CommittedAt.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		printable(ev.Source), ev.Seq, printable(ev.Key), payload)
	if ev.Truncated {
		fmt.Fprintf(p.out, "… (truncated: %d of %d bytes)", payloadLen(ev), ev.Size)
	}
	return p.out.WriteByte('\n')
}

// payloadLen is how many bytes of the payload ev carries.
func payloadLen(ev adminapi.TapEvent) int {
	if ev.Payload != nil {
		return len(*ev.Payload)
	}
	b, _ := base64.StdEncoding.DecodeString(ev.PayloadB64)
	return len(b)
}

// write writes line as it came, with a newline.
func (p *tapPrinter) write(line []byte) error {
	if _, err := p.out.Write(line); err != nil {
		return err
	}
	return p.out.WriteByte('\n')
}

// printable returns s with what a terminal would act on escaped: control
// characters (newlines and escape sequences included) and other
// characters that do not print, as Go escapes them.
func printable(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
	}
	return b.String()
}

// plural returns what, with an s unless n is 1.
func plural(n int64, what string) string {
	if n == 1 {
		return what
	}
	return what + "s"
}
