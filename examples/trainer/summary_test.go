package main

import "testing"

// The summary's means leave out the run's first step; the summary says so
// and names the steps it measured.
func TestMeasuredSteps(t *testing.T) {
	for _, c := range []struct {
		first, steps int
		want         string
	}{
		{0, 1, "step 1"},
		{0, 2, "step 2; step 1 warms up"},
		{0, 20, "steps 2-20; step 1 warms up"},
		{10, 20, "steps 12-20; step 11 warms up"},
		{19, 20, "no step measured: step 20 warms up"},
	} {
		if got := measuredSteps(c.first, c.steps); got != c.want {
			t.Errorf("measuredSteps(%d, %d) = %q, want %q", c.first, c.steps, got, c.want)
		}
	}
}
