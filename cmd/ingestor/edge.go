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
	"github.com/ingestorhq/ingestor/internal/edge"
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
	o, code := edgeSettings(args, stdin, stdout, stderr)
	if code >= 0 {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := edge.Run(ctx, o); err != nil {
		o.Logger.Error("edge forwarder", "err", err)
		return 1
	}
	return 0
}

// edgeSettings returns the forwarder's options from the flags in args and
// the -c file they name, validated, and -1; or, when the command is done
// (-h, or a problem it has reported on stderr), its exit code.
func edgeSettings(args []string, stdin io.Reader, stdout, stderr io.Writer) (edge.Options, int) {
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("c", "", "config `file` with an [edge] table (see config/edge.example.toml)")
	url := fs.String("url", "", "the daemon's ws_ingress `URL`, ws://HOST:PORT/ingest/NAME/ws or wss://...")
	tokenFile := fs.String("token-file", "", "read the bearer token from `file` (the token is never logged)")
	tokenEnv := fs.String("token-env", "", "read the bearer token from the environment variable `NAME`")
	caFile := fs.String("ca-file", "", "PEM `file` of the CAs that sign the daemon's certificate (wss://)")
	deviceID := fs.String("device-id", "", "device `id` filled into events that have none")
	outbox := fs.String("outbox", edge.DefaultOutbox, "the outbox's SQLite `file`")
	maxOutbox := fs.Int64("max-outbox-bytes", edge.DefaultMaxOutboxBytes, "refuse new events once the outbox holds `n` bytes")
	maxEnvelope := fs.Int("max-envelope-bytes", edge.DefaultMaxEnvelopeBytes, "refuse events larger than `n` bytes")
	httpAddr := fs.String("http", "", "serve POST /events on this loopback `address`, e.g. 127.0.0.1:9470")
	socket := fs.String("socket", "", "take NDJSON on a Unix socket at `path` (mode 0600), one reply line per event")
	useStdin := fs.Bool("stdin", false, "read NDJSON events from standard input")
	metrics := fs.String("metrics", "", "serve GET /metrics on this `address`, e.g. 127.0.0.1:9466")
	window := fs.Int("window", edge.DefaultWindow, "send at most `n` envelopes ahead of their ACKs")
	ackTimeout := fs.Duration("ack-timeout", edge.DefaultAckTimeout, "reconnect and resend when an envelope has no answer within `d`")
	reconnectBase := fs.Duration("reconnect-base", edge.DefaultReconnectBase, "first reconnection wait `d` (capped exponential backoff, full jitter)")
	reconnectMax := fs.Duration("reconnect-max", edge.DefaultReconnectMax, "longest reconnection wait `d`")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), edgeUsage)
		fs.PrintDefaults()
	}
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout)
			fs.Usage()
			return edge.Options{}, 0
		}
	}
	if err := fs.Parse(args); err != nil {
		return edge.Options{}, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ingestor edge: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return edge.Options{}, 2
	}
	o := edge.Options{URL: *url, CAFile: *caFile, DeviceID: *deviceID, Outbox: *outbox, MaxOutboxBytes: *maxOutbox,
		MaxEnvelopeBytes: *maxEnvelope, HTTPAddr: *httpAddr, Socket: *socket, MetricsAddr: *metrics, Window: *window,
		AckTimeout: *ackTimeout, ReconnectBase: *reconnectBase, ReconnectMax: *reconnectMax}
	stdinOn := *useStdin
	if *path != "" {
		cfg, err := config.LoadEdge(*path)
		if err != nil {
			printConfigError(stderr, err)
			return edge.Options{}, 1
		}
		o = edgeOptions(cfg)
		stdinOn = cfg.Stdin
		// Flags given on the command line override the file.
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "url":
				o.URL = *url
			case "ca-file":
				o.CAFile = *caFile
			case "device-id":
				o.DeviceID = *deviceID
			case "outbox":
				o.Outbox = *outbox
			case "max-outbox-bytes":
				o.MaxOutboxBytes = *maxOutbox
			case "max-envelope-bytes":
				o.MaxEnvelopeBytes = *maxEnvelope
			case "http":
				o.HTTPAddr = *httpAddr
			case "socket":
				o.Socket = *socket
			case "stdin":
				stdinOn = *useStdin
			case "metrics":
				o.MetricsAddr = *metrics
			case "window":
				o.Window = *window
			case "ack-timeout":
				o.AckTimeout = *ackTimeout
			case "reconnect-base":
				o.ReconnectBase = *reconnectBase
			case "reconnect-max":
				o.ReconnectMax = *reconnectMax
			}
		})
	}
	token, err := flagToken(*tokenFile, *tokenEnv)
	if err != nil {
		fmt.Fprintf(stderr, "ingestor edge: %v\n", err)
		return edge.Options{}, 1
	}
	if token != "" {
		o.Token = token
	}
	if stdinOn {
		o.Stdin = stdin
	}
	o.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	if err := o.Validate(); err != nil {
		fmt.Fprintf(stderr, "ingestor edge: invalid settings:\n  %s\n", strings.ReplaceAll(err.Error(), "\n", "\n  "))
		return edge.Options{}, 2
	}
	return o, -1
}

// edgeOptions returns the forwarder options of a loaded [edge] table.
func edgeOptions(c *config.Edge) edge.Options {
	return edge.Options{URL: c.URL, Token: c.Token, CAFile: c.CAFile, DeviceID: c.DeviceID, Outbox: c.Outbox,
		MaxOutboxBytes: c.MaxOutboxBytes, MaxEnvelopeBytes: c.MaxEnvelopeBytes, HTTPAddr: c.HTTP, Socket: c.Socket,
		MetricsAddr: c.Metrics, Window: c.Window, AckTimeout: c.AckTimeout,
		ReconnectBase: c.ReconnectBase, ReconnectMax: c.ReconnectMax}
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
	if msg := edge.CheckToken(token); msg != "" {
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
		return 2
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
