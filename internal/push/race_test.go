//go:build race

package push

// raceSlowdown scales down tests that load the push path with many
// goroutines: the race detector's cost grows with their number, so under
// it they run a fifth of the load.
const raceSlowdown = 5
