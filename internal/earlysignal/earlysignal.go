// Package earlysignal catches SIGINT and SIGTERM from the moment the
// process initialises its packages, long before main runs: the daemon's
// dependencies (gRPC, etcd, the AWS SDK, protobuf) take tens of
// milliseconds to initialise, and a SIGTERM in that window would kill it
// with Go's default action (exit status 143) instead of a clean stop.
// Import it for its side effect from package main only, and call Take
// (the command that handles the signals itself) or Release (one that
// wants Go's default behaviour back) first thing in main.
package earlysignal

import (
	"os"
	"os/signal"
	"syscall"
)

// caught holds the first signal that came before Take or Release.
var caught = make(chan os.Signal, 1)

func init() {
	signal.Notify(caught, syscall.SIGINT, syscall.SIGTERM)
}

// Take returns a channel that yields the signal caught before the caller
// installed its own handling, if one was; call it once the caller's
// signal.Notify (or NotifyContext) is in place, so no signal falls
// between the two.
func Take() <-chan os.Signal {
	signal.Stop(caught)
	return caught
}

// Release gives SIGINT and SIGTERM back their default action (end the
// process) and, if one of them already came, ends the process with it
// now, as it would have without this package.
func Release() {
	signal.Stop(caught)
	select {
	case sig := <-caught:
		signal.Reset(sig)
		if s, ok := sig.(syscall.Signal); ok {
			_ = syscall.Kill(os.Getpid(), s) // the default action ends the process
		}
		select {} // the signal is on its way
	default:
	}
}
