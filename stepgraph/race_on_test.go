//go:build race

package stepgraph

// raceEnabled trims the property test under -race: planning has no
// goroutines for the detector to check, so the slow-down buys nothing.
const raceEnabled = true
