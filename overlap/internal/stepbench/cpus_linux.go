package main

import "golang.org/x/sys/unix"

// maxCPUs bounds the CPU numbers cpuMask reports.
const maxCPUs = 1024

// cpuMask marks the CPUs this rank may run on (1 each), for the union
// over the job's ranks: the cores the job has (a rank bound to one core
// still shares the host with the others).
func cpuMask() []float64 {
	m := make([]float64, maxCPUs)
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil {
		return nil
	}
	for c := range maxCPUs {
		if set.IsSet(c) {
			m[c] = 1
		}
	}
	return m
}
