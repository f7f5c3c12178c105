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
