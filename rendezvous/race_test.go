//go:build race

package rendezvous

// raceEnabled: the race detector multiplies the CPU cost of a simulated
// member by five to ten, so the scale test shrinks under it.
const raceEnabled = true
