package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/internal/daemon"
)

// cmdReload validates a config file, then asks the running daemon (at the
// admin address of that file) to reload its own config file, and prints
// what started, stopped, restarted and stayed.
func cmdReload(args []string, stdout, stderr io.Writer) int {
	sc := newSubcommand("reload", "", "config file: validated first; its daemon.admin_addr (or http_addr) and admin token reach the daemon", stderr)
	dry := sc.fs.Bool("dry-run", false, "only print what a reload would start, stop and restart")
	output := sc.fs.String("o", "text", "output: text or json")
	pos, code, done := sc.parse(args)
	if done {
		return code
	}
	if !sc.hasPath() || len(pos) > 0 || (*output != "text" && *output != "json") {
		return sc.fail("-c FILE is required; -o is text or json")
	}
	cfg := sc.load()
	if cfg == nil {
		return 1
	}
	addr := cfg.Daemon.AdminListenAddr()
	if addr == "" {
		fmt.Fprintf(stderr, "ingestor reload: %s has no ops listener (daemon.http_addr is empty): send the daemon SIGHUP instead\n", cfg.Name())
		return 1
	}
	q := ""
	if *dry {
		q = "?dry_run=1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Daemon.ShutdownGrace+10*time.Second)
	defer cancel()
	var res daemon.ReloadResult
	if _, err := newHTTPDLQ(addr, cfg.Daemon.AdminToken, cfg.Name()).do(ctx, "POST", "/-/reload"+q, nil, &res); err != nil {
		fmt.Fprintf(stderr, "ingestor reload: %v\n", err)
		return 1
	}
	theirs := res.Paths
	if theirs == nil { // a daemon that predates Paths
		theirs = []string{res.File}
	}
	if differentConfigs(cfg.Paths, theirs) {
		fmt.Fprintf(stderr, "ingestor reload: note: the daemon at %s read its own config %s, not %s\n", addr, res.File, cfg.Name())
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintf(stderr, "ingestor reload: %v\n", err)
			return 1
		}
		return 0
	}
	switch {
	case !res.Applied:
		fmt.Fprintf(stdout, "dry run of %s: nothing applied\n", res.File)
	case !res.Changes():
		fmt.Fprintf(stdout, "reloaded %s: no source changed\n", res.File)
	default:
		fmt.Fprintf(stdout, "reloaded %s\n", res.File)
	}
	for _, row := range []struct {
		what  string
		names []string
	}{{"start", res.Start}, {"stop", res.Stop}, {"restart", res.Restart}, {"stay", res.Stay}} {
		list := "-"
		if len(row.names) > 0 {
			list = strings.Join(row.names, ", ")
		}
		fmt.Fprintf(stdout, "  %-8s %3d  %s\n", row.what, len(row.names), list)
	}
	return 0
}

// differentConfigs reports whether the daemon's config paths theirs are
// known to differ from ours: in number, or a pair that are not the same
// file or directory.
func differentConfigs(ours, theirs []string) bool {
	if len(ours) != len(theirs) {
		return true
	}
	for i := range ours {
		if differentFiles(ours[i], theirs[i]) {
			return true
		}
	}
	return false
}

// differentFiles reports whether paths a and b both name files (or
// directories) here and not the same one (the daemon's path may be
// relative to its own working directory, so one that cannot be found
// says nothing).
func differentFiles(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && !os.SameFile(fa, fb)
}
