//go:build race

package comm

// raceEnabled: the flight recorder's writer takes the readers' lock, so
// that the race detector sees no overlap between a copy and a reuse of a
// slot (which the readers detect and discard, see flight.go).
const raceEnabled = true
