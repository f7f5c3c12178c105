package bench

import (
	"errors"
	"fmt"
)

var (
	// ErrNoShm reports that --transport shm was asked for but some pair of
	// ranks is not connected through shared memory (different hosts, or a
	// comm build without it).
	ErrNoShm = errors.New("bench: shared memory transport not available")
	// ErrFormat reports a result file this package cannot read.
	ErrFormat = errors.New("bench: unrecognized result format")
)

// UsageError is a bad command line or Config: the user must change what was
// asked for. cmd/gorun maps it to the usage exit code.
type UsageError struct {
	Problem string
}

func (e *UsageError) Error() string { return "bench: " + e.Problem }

// WrongError reports that the correctness check found wrong elements. Run
// returns it after the whole sweep, so the table shows where they were.
type WrongError struct {
	Wrong int64 // wrong elements, summed over ranks, sizes and placements
	Rows  int   // rows (sizes) with at least one wrong element
}

func (e *WrongError) Error() string {
	return fmt.Sprintf("bench: %d wrong elements in %d sizes (results differ from the exact expected values)", e.Wrong, e.Rows)
}
