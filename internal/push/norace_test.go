//go:build !race

package push

// raceSlowdown scales down tests that load the push path (see
// race_test.go); without the race detector they run the whole load.
const raceSlowdown = 1
