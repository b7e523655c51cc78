package main

import (
	"os"
	"testing"

	"github.com/ingestorhq/ingestor/internal/earlysignal"
)

// TestMain gives the test binary Go's default SIGINT and SIGTERM back:
// package main imports earlysignal, whose init catches them for `ingestor
// run`, and main (which decides) never runs in a test.
func TestMain(m *testing.M) {
	earlysignal.Release()
	os.Exit(m.Run())
}
