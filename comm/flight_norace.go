//go:build !race

package comm

// raceEnabled: see flight_race.go.
const raceEnabled = false
