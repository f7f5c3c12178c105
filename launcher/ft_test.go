package launcher

import (
	"syscall"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/wire"
)

// TestOwnFailure: which failures count as the program's own doing (and so
// may be deterministic) and which came from outside (always replaced).
func TestOwnFailure(t *testing.T) {
	for _, c := range []struct {
		code, signal int
		want         int
	}{
		{code: 1, want: 1},
		{code: 3, want: 3},
		{signal: int(syscall.SIGKILL), want: 0}, // the OOM killer, an operator, --inject
		{signal: int(syscall.SIGTERM), want: 0},
		{signal: int(syscall.SIGINT), want: 0},
		{signal: int(syscall.SIGSEGV), want: 128 + int(syscall.SIGSEGV)},
		{signal: int(syscall.SIGABRT), want: 128 + int(syscall.SIGABRT)},
		{signal: int(syscall.SIGBUS), want: 128 + int(syscall.SIGBUS)},
	} {
		if got := ownFailure(wire.Event{Code: c.code, Signal: c.signal}); got != c.want {
			t.Errorf("code %d signal %d: ownFailure %d, want %d", c.code, c.signal, got, c.want)
		}
	}
}
