//go:build !race

package stepgraph

const raceEnabled = false
