// Command ingestor is the ingestion daemon.
//
//	ingestor run [-c FILE]        run the daemon (embedded example config without -c)
//	ingestor validate -c FILE [--offline]   check a config; every problem is listed with file:line
//	ingestor check-source NAME -c FILE   poll one source once and print what it finds; writes nothing
//	ingestor replay -c FILE -source NAME re-ingest stored raw payloads through the current parser
//	ingestor doctor -c FILE       check the queue database and the raw bytes it references (daemon stopped)
//	ingestor dlq list|show|replay|drop -c FILE   inspect and act on the dead-letter list
//	ingestor quarantine list|show|clear -c FILE  inspect the refused webhook deliveries
//	ingestor reload -c FILE [-dry-run]   validate FILE and have the running daemon reload its config
//	ingestor status [-c FILE | -addr HOST:PORT] [-o json]   the running daemon's sources and queue
//	ingestor tap [-c FILE] [-source NAME ...] [-max-bytes N] [-format text|json] [-limit N]   follow the events as they commit
//	ingestor curve-keygen NAME    write a CURVE key pair, NAME.key (secret, 0600) and NAME.pub
//	ingestor edge [-c FILE]       run the device-side forwarder to a ws_ingress source
//	ingestor edge status          print the forwarder's outbox backlog
//	ingestor version
//
// Wherever a command takes -c FILE, FILE may be a directory (its *.toml
// files, in lexical order), and -c may be repeated: the files are merged
// into one config (docs/configuration.md, "Splitting the configuration").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/cpuprofile"
	"github.com/ingestorhq/ingestor/internal/daemon"
	"github.com/ingestorhq/ingestor/internal/earlysignal"
	"github.com/ingestorhq/ingestor/internal/malloctune"
)

const usage = `usage:
  ingestor run [-c FILE]       run the daemon (without -c: the embedded example config)
  ingestor validate -c FILE [--offline]
                               check a config and list every problem; --offline checks only
                               what needs nothing of the target machine: unset ${ENV} and the
                               key, token and certificate files are skipped, and listed
  ingestor check-source NAME -c FILE [-cursor VALUE] [-max-pages N] [-v]
                               poll one source once, enabled or not, and print the requests,
                               records, next cursor and any problem; writes nothing
  ingestor replay -c FILE -source NAME [-from RFC3339] [-to RFC3339] [-force] [-dry-run] [-include-deadletters]
                               parse stored raw payloads again with the current rules and queue
                               their events (daemon stopped); duplicates are skipped
  ingestor doctor -c FILE      check the data dir with the daemon stopped: PRAGMA integrity_check
                               on queue.db, and every raw object and page that pending and
                               dead-lettered events reference exists and matches its checksum;
                               exit 0 when sound, 1 on a problem (docs/operations.md: a damaged data dir)
  ingestor dlq list|show ID|replay [ID...|-source S -reason R -all]|drop [ID...|filters] [-yes] -c FILE
                               list, inspect, replay or drop dead letters (through the running
                               daemon's ops endpoints, or the queue when it is stopped)
  ingestor quarantine list [-source S] [-limit N] [-o json] | show ID [-o json] | clear -source S  -c FILE
                               list, inspect or clear the refused deliveries of webhook sources
                               (through the running daemon's admin endpoints, or the queue)
  ingestor reload -c FILE [-dry-run] [-o json]
                               validate FILE, then have the running daemon reload its config
                               file (as SIGHUP does) and print which sources start, stop,
                               restart and stay; -dry-run only prints it
  ingestor status [-c FILE | -addr HOST:PORT] [-o table|json]
                               print the running daemon's status (GET /status on daemon.http_addr):
                               each source's state (polling, waiting and why, failing and its last
                               error, stopped; receiving or idle for push sources), last poll and
                               success, lag, cursor, pending and dead letters; the queue's totals.
                               An aligned table, coloured on a terminal only; -o json for scripts.
                               Without -c or -addr (--addr): the default 127.0.0.1:9464. Exit 1
                               when the daemon cannot be reached
  ingestor tap [-c FILE] [-source NAME ...] [-max-bytes N] [-format text|json] [-limit N]
                               follow the running daemon's events live as they are committed:
                               source, key, seq, commit time and the payload's first bytes
                               (default 200); -format json prints one JSON object per line.
                               Through the admin endpoints, with the admin token, like dlq;
                               a tap too slow misses events and is told how many (ingestor tap -h)
  ingestor version             print the build's version and commit (also --version)
  ingestor curve-keygen NAME   write a ZeroMQ CURVE key pair: NAME.key (secret, mode 0600)
                               and NAME.pub (public), for publish.curve_* and processors
  ingestor edge -c FILE | -url URL -device-id ID -token-file FILE (-http ADDR|-socket PATH|-stdin)
                               run the edge forwarder on a device: store events in a local
                               outbox, send them to a ws_ingress source (ingestor edge -h)
  ingestor edge status (-c FILE | -outbox FILE)
                               print the forwarder's backlog: pending events, bytes, oldest, dead letters
  ingestor healthcheck [--addr HOST:PORT] [--timeout D]
                               exit 0 if the daemon's /healthz (at daemon.http_addr, default
                               127.0.0.1:9464) answers 200, else 1: a container HEALTHCHECK

-c FILE may name a directory (its *.toml files, in lexical order, as a conf.d) and may be
repeated (-c base.toml -c conf.d): the files are merged into one config, each [source.NAME]
and [rate_limiters.NAME] block in one file, and each other table in one file too.
`

func main() {
	malloctune.Apply() // ZeroMQ's message buffers are reused, not faulted in again
	// ingestor run stops cleanly on a SIGTERM however early it comes
	// (cmdRun takes the one caught during start-up); every other command
	// gets Go's default action back.
	if len(os.Args) < 2 || os.Args[1] != "run" {
		earlysignal.Release()
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stderr)
	case "validate":
		return cmdValidate(args[1:], stdout, stderr)
	case "check-source":
		return cmdCheckSource(args[1:], stdout, stderr)
	case "replay":
		return cmdReplay(args[1:], stdout, stderr)
	case "doctor":
		return cmdDoctor(args[1:], stdout, stderr)
	case "dlq":
		return cmdDLQ(args[1:], os.Stdin, stdout, stderr)
	case "quarantine":
		return cmdQuarantine(args[1:], stdout, stderr)
	case "reload":
		return cmdReload(args[1:], stdout, stderr)
	case "status":
		return cmdStatus(args[1:], stdout, stderr)
	case "tap":
		return cmdTap(args[1:], stdout, stderr)
	case "curve-keygen":
		return cmdCurveKeygen(args[1:], stdout, stderr)
	case "edge":
		return cmdEdge(args[1:], os.Stdin, stdout, stderr)
	case "healthcheck":
		return cmdHealthcheck(args[1:], stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "ingestor", daemon.Version())
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "ingestor: unknown command %q\n%s", args[0], usage)
		return 2
	}
}

func printConfigError(stderr io.Writer, err error) {
	var errs config.Errors
	if errors.As(err, &errs) {
		fmt.Fprintf(stderr, "%s\n%d problem(s) found\n", errs.Error(), len(errs))
		return
	}
	fmt.Fprintf(stderr, "ingestor: %v\n", err)
}

func cmdValidate(args []string, stdout, stderr io.Writer) int {
	sc := newSubcommand("validate", "", "config to check", stderr)
	offline := sc.fs.Bool("offline", false, "check only what needs nothing of the target machine: unset ${ENV} references "+
		"are skipped, and no key, token or certificate file is read (only that its path is given); what was skipped is listed")
	pos, code, done := sc.parse(args)
	switch {
	case done:
		return code
	case len(pos) > 0:
		return sc.fail("unexpected argument %q", pos[0])
	case !sc.needPath():
		return 2
	}
	cfg := sc.loadWith(config.Options{Offline: *offline})
	if cfg == nil {
		return 1
	}
	enabled := 0
	for _, s := range cfg.Sources {
		if s.Enabled {
			enabled++
		}
	}
	files := ""
	if len(cfg.Files) > 1 {
		files = fmt.Sprintf("%d files, ", len(cfg.Files))
	}
	mode := ""
	if *offline {
		mode = " offline"
	}
	fmt.Fprintf(stdout, "%s: ok%s (%s%d sources, %d enabled)\n", cfg.Name(), mode, files, len(cfg.Sources), enabled)
	if *offline {
		fmt.Fprintf(stdout, "skipped (offline): %s\n", cfg.SkippedSummary())
		for _, s := range cfg.Skipped {
			fmt.Fprintf(stdout, "  %s\n", s)
		}
	}
	return 0
}

func cmdRun(args []string, stderr io.Writer) int {
	// The signals first: a SIGTERM while the config loads, or while the
	// process initialised (earlysignal caught it), is a clean stop.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// SIGHUP reloads the config file (Go's default would end the process
	// without draining).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	select {
	case <-earlysignal.Take():
		return 0 // stopped before anything started
	default:
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	paths := configFlag(fs, "config (default: the embedded example config)")
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	cfg, err := loadConfig(*paths)
	if err != nil {
		printConfigError(stderr, err)
		return 1
	}
	if ctx.Err() != nil {
		return 0 // stopped while the config loaded: nothing started
	}
	log := daemon.NewLogger(cfg.Daemon)
	stopProfile, err := cpuprofile.Start(cpuprofile.DaemonEnv)
	if err != nil {
		log.Error("start failed", "err", err)
		return 1
	}
	defer func() {
		if err := stopProfile(); err != nil {
			log.Error("cpu profile", "err", err)
		}
	}()
	d, err := daemon.Start(ctx, cfg, daemon.Options{Logger: log})
	if err != nil && ctx.Err() != nil {
		// SIGTERM or SIGINT while starting: Start has closed what it
		// opened (the data dir's lock included), so this is a clean stop.
		log.Info("stopped during start", "err", err)
		return 0
	}
	if err != nil {
		log.Error("start failed", "err", err)
		return 1
	}
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case <-hup:
			log.Info("SIGHUP: reloading the config")
			rctx, cancel := context.WithTimeout(context.Background(), cfg.Daemon.ShutdownGrace)
			// Reload logs its outcome, every problem of a refused file
			// included, except when there is nothing to reload.
			if _, err := d.Reload(rctx, false); errors.Is(err, daemon.ErrNoConfigFile) || errors.Is(err, daemon.ErrStopping) {
				log.Warn("SIGHUP: nothing reloaded", "reason", err)
			}
			cancel()
		}
	}
	stop() // a second signal kills the process the usual way
	grace, cancel := context.WithTimeout(context.Background(), cfg.Daemon.ShutdownGrace)
	defer cancel()
	if err := d.Shutdown(grace); err != nil {
		log.Error("shutdown", "err", err)
		return 1
	}
	return 0
}
