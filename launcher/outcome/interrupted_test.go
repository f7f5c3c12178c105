package outcome

import (
	"syscall"
	"testing"
)

// A signal that finds no rank to stop (each ended, some on the forwarded
// signal itself, or none had started) says so, instead of "stopped 0
// ranks".
func TestInterruptedErrorText(t *testing.T) {
	for _, c := range []struct {
		stopped int
		want    string
	}{
		{0, "received signal 2 (interrupt); no rank was left to stop (each had ended, or none had started)"},
		{1, "received signal 2 (interrupt); stopped 1 rank"},
		{3, "received signal 2 (interrupt); stopped 3 ranks"},
	} {
		e := &InterruptedError{Signal: syscall.SIGINT, Stopped: c.stopped}
		if got := e.Error(); got != c.want {
			t.Errorf("Stopped %d: %q, want %q", c.stopped, got, c.want)
		}
	}
}
