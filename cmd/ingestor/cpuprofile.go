package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
)

// cpuProfileEnv names the environment variable that makes `ingestor run`
// write a CPU profile of the whole run, until it exits, to the file it
// names: a development aid (ingestor-bench -mode real -cpuprofile sets it),
// read with go tool pprof. The daemon serves no pprof endpoint.
const cpuProfileEnv = "INGESTOR_CPUPROFILE"

// startCPUProfile starts profiling into the file $INGESTOR_CPUPROFILE
// names, if it is set, and returns the function that stops it and closes
// the file.
func startCPUProfile() (func() error, error) {
	path := os.Getenv(cpuProfileEnv)
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, errors.Join(err, f.Close()))
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("%s: %w", cpuProfileEnv, err)
		}
		return nil
	}, nil
}
