//go:build !linux

package main

import "runtime"

const maxCPUs = 1024

// cpuMask marks runtime.NumCPU CPUs: where affinity cannot be read, each
// rank is taken to see all of the host's.
func cpuMask() []float64 {
	m := make([]float64, maxCPUs)
	for c := range min(runtime.NumCPU(), maxCPUs) {
		m[c] = 1
	}
	return m
}
