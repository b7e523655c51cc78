package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/buildinfo"
	"github.com/ingestorhq/ingestor/internal/edge"
	"github.com/ingestorhq/ingestor/internal/edge/edgeconfig"
	"github.com/ingestorhq/ingestor/internal/telemetry/otlp"
)

const edgeUsage = `usage:
  ingestor edge -c FILE [flags]       run the forwarder with the [edge] table of FILE
  ingestor edge -url URL -device-id ID -token-file FILE (-http ADDR | -socket PATH | -stdin) [flags]
  ingestor edge status (-c FILE | -outbox FILE)
                                      print the outbox's backlog (works while the forwarder runs)

The edge forwarder runs on a device. It accepts events from local producers
(NDJSON on stdin, POST /events on a loopback HTTP port, or NDJSON lines on a
Unix socket), commits each to its own SQLite outbox before answering OK, and
sends them over one WebSocket to a daemon's ws_ingress source. A row leaves
the outbox only when the daemon answers "stored" for it (after its own
durable commit); a "rejected" one moves to the outbox's dead letters. Nothing
accepted is lost, through crashes, reboots and daemon restarts; delivery is
at least once, and the daemon keeps one copy per event_id.

An event is one JSON object with at least "type" and "payload"; the forwarder
fills in what is missing of event_id, ts, session_id, device_id,
schema_version and seq. When the outbox is full, HTTP answers 503 with
Retry-After, the socket a "full" line, and stdin stops reading until there
is room.

Flags (each overrides the same key of -c FILE):
`

// cmdEdge is `ingestor edge`: the device-side forwarder, or its status.
func cmdEdge(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		return cmdEdgeStatus(args[1:], stdout, stderr)
	}
	o, tel, code := edgeSettings(args, stdin, stdout, stderr)
	if code >= 0 {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if tel.Enabled() {
		tr, err := otlp.Start(ctx, tel, buildinfo.Read().String(), o.Logger)
		if err != nil {
			o.Logger.Error("edge forwarder", "err", err)
			return 1
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tr.Shutdown(sctx); err != nil {
				o.Logger.Warn("tracing: exporting the last spans failed", "err", err)
			}
		}()
		o.TracerProvider = tr.Provider()
	}
	if err := edge.Run(ctx, o); err != nil {
		o.Logger.Error("edge forwarder", "err", err)
		return 1
	}
	return 0
}

// edgeFlags holds the flags of `ingestor edge` that are not options.
type edgeFlags struct {
	path, tokenFile, tokenEnv string
}

// newEdgeFlags returns the flag set of `ingestor edge`, its flags bound to
// the fields of o, each defaulting to the field's value.
func newEdgeFlags(o *edgeconfig.Config, f *edgeFlags, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&f.path, "c", "", "config `file` with an [edge] table (see config/edge.example.toml)")
	fs.StringVar(&f.tokenFile, "token-file", "", "read the bearer token from `file` (the token is never logged)")
	fs.StringVar(&f.tokenEnv, "token-env", "", "read the bearer token from the environment variable `NAME`")
	fs.StringVar(&o.URL, "url", o.URL, "the daemon's ws_ingress `URL`, ws://HOST:PORT/ingest/NAME/ws or wss://...")
	fs.StringVar(&o.CAFile, "ca-file", o.CAFile, "PEM `file` of the CAs that sign the daemon's certificate (wss://)")
	fs.StringVar(&o.DeviceID, "device-id", o.DeviceID, "device `id` filled into events that have none")
	fs.StringVar(&o.Outbox, "outbox", o.Outbox, "the outbox's SQLite `file`")
	fs.Int64Var(&o.MaxOutboxBytes, "max-outbox-bytes", o.MaxOutboxBytes, "refuse new events once the outbox holds `n` bytes")
	fs.IntVar(&o.MaxEnvelopeBytes, "max-envelope-bytes", o.MaxEnvelopeBytes, "refuse events larger than `n` bytes")
	fs.StringVar(&o.HTTPAddr, "http", o.HTTPAddr, "serve POST /events on this loopback `address`, e.g. 127.0.0.1:9470")
	fs.StringVar(&o.Socket, "socket", o.Socket, "take NDJSON on a Unix socket at `path` (mode 0600), one reply line per event")
	fs.BoolVar(&o.Stdin, "stdin", o.Stdin, "read NDJSON events from standard input")
	fs.StringVar(&o.MetricsAddr, "metrics", o.MetricsAddr, "serve GET /metrics on this `address`, e.g. 127.0.0.1:9466")
	fs.IntVar(&o.Window, "window", o.Window, "send at most `n` envelopes ahead of their ACKs")
	fs.DurationVar(&o.AckTimeout, "ack-timeout", o.AckTimeout, "reconnect and resend when an envelope has no answer within `d`")
	fs.DurationVar(&o.ReconnectBase, "reconnect-base", o.ReconnectBase, "first reconnection wait `d` (capped exponential backoff, full jitter)")
	fs.DurationVar(&o.ReconnectMax, "reconnect-max", o.ReconnectMax, "longest reconnection wait `d`")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), edgeUsage)
		fs.PrintDefaults()
	}
	return fs
}

// edgeSettings returns the forwarder's options from the flags in args and
// the -c file they name, validated, the file's [telemetry], and -1; or,
// when the command is done
// (-h, or a problem it has reported on stderr), its exit code. The flags
// are parsed twice when -c names a file: once to find it, then over the
// file's values, so that a flag given overrides the file's key.
func edgeSettings(args []string, stdin io.Reader, stdout, stderr io.Writer) (_ edge.Options, tel config.Telemetry, code int) {
	o := edge.Options{Config: edgeconfig.Default(), StdinReader: stdin}
	var f edgeFlags
	fs := newEdgeFlags(&o.Config, &f, stderr)
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout)
			fs.Usage()
			return edge.Options{}, tel, 0
		}
	}
	if err := fs.Parse(args); err != nil {
		return edge.Options{}, tel, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ingestor edge: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return edge.Options{}, tel, 2
	}
	if f.path != "" {
		cfg, err := config.LoadEdge(f.path)
		if err != nil {
			printConfigError(stderr, err)
			return edge.Options{}, tel, 1
		}
		o.Config, tel = cfg.Config, cfg.Telemetry
		if err := newEdgeFlags(&o.Config, &f, stderr).Parse(args); err != nil {
			return edge.Options{}, tel, 2 // parsed once already: not reached
		}
	}
	token, err := flagToken(f.tokenFile, f.tokenEnv)
	if err != nil {
		fmt.Fprintf(stderr, "ingestor edge: %v\n", err)
		return edge.Options{}, tel, 1
	}
	if token != "" {
		o.Token = token
	}
	o.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	if err := o.Validate(); err != nil {
		fmt.Fprintf(stderr, "ingestor edge: invalid settings:\n  %s\n", strings.ReplaceAll(err.Error(), "\n", "\n  "))
		if o.Token == "" {
			// The message names the file's keys; these are the flags'.
			fmt.Fprintln(stderr, "  (on the command line, -token-file or -token-env gives the token)")
		}
		return edge.Options{}, tel, 2
	}
	return o, tel, -1
}

// flagToken returns the token of -token-file or -token-env, "" when
// neither is set. There is no -token: a command line is visible to every
// user of the machine.
func flagToken(file, env string) (string, error) {
	var token, from string
	switch {
	case file != "" && env != "":
		return "", errors.New("set -token-file or -token-env, not both")
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("-token-file: read the token: %w", err)
		}
		token, from = strings.TrimSpace(string(data)), "the file "+file
	case env != "":
		v, ok := os.LookupEnv(env)
		if !ok {
			return "", fmt.Errorf("-token-env: environment variable %s is not set", env)
		}
		token, from = strings.TrimSpace(v), "environment variable "+env
	default:
		return "", nil
	}
	if token == "" {
		return "", fmt.Errorf("the token in %s is empty", from)
	}
	if msg := edgeconfig.CheckToken(token); msg != "" {
		return "", fmt.Errorf("the token in %s %s", from, msg)
	}
	return token, nil
}

// envOrPlaceholder looks name up in the environment, and stands in for
// one that is not set: the status needs only the outbox path of a config,
// not the token the forwarder's own environment holds.
func envOrPlaceholder(name string) (string, bool) {
	if v, ok := os.LookupEnv(name); ok {
		return v, true
	}
	return "unset-" + name, true
}

// cmdEdgeStatus is `ingestor edge status`: the backlog of an outbox.
func cmdEdgeStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edge status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("c", "", "the forwarder's config `file` (its [edge] outbox)")
	outbox := fs.String("outbox", "", "the outbox's SQLite `file`")
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	if (*path == "") == (*outbox == "") || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: ingestor edge status (-c FILE | -outbox FILE)")
		return 2
	}
	if *path != "" {
		data, err := os.ReadFile(*path)
		if err != nil {
			fmt.Fprintf(stderr, "ingestor edge status: %v\n", err)
			return 1
		}
		cfg, err := config.ParseEdgeWithEnv(*path, data, envOrPlaceholder)
		if err != nil {
			printConfigError(stderr, err)
			return 1
		}
		*outbox = cfg.Outbox
	}
	s, err := edge.ReadStatus(context.Background(), *outbox)
	if err != nil {
		fmt.Fprintf(stderr, "ingestor edge status: %v\n", err)
		return 1
	}
	if err := s.Print(stdout, *outbox, time.Now()); err != nil {
		fmt.Fprintf(stderr, "ingestor edge status: %v\n", err)
		return 1
	}
	return 0
}
