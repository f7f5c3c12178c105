//go:build !unix

package main

import "time"

// sleep is the modelled compute (see sleep_unix.go); elsewhere time.Sleep,
// with its coarser wake-up.
func sleep(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}

// processCPU is not read here: the hardware bound is then not printed.
func processCPU() time.Duration { return 0 }

// threadCPU is not read here; spin calibrates on wall time instead.
func threadCPU() time.Duration { return 0 }
