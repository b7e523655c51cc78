// Package cpuprofile starts a CPU profile of a whole process run when an
// environment variable names a file: a development aid for `ingestor run`
// (INGESTOR_CPUPROFILE) and the example processor
// (INGESTOR_PROCESSOR_CPUPROFILE), which ingestor-bench -mode real sets
// with -cpuprofile and -processor-cpuprofile. Read the file with go tool
// pprof. Neither program serves a pprof endpoint.
package cpuprofile

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
)

// The environment variables that name the profile's file.
const (
	DaemonEnv    = "INGESTOR_CPUPROFILE"
	ProcessorEnv = "INGESTOR_PROCESSOR_CPUPROFILE"
)

// Start starts profiling into the file the environment variable env names,
// if it is set, and returns the function that stops it and closes the
// file.
func Start(env string) (func() error, error) {
	path := os.Getenv(env)
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, fmt.Errorf("%s: %w", env, errors.Join(err, f.Close()))
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("%s: %w", env, err)
		}
		return nil
	}, nil
}
