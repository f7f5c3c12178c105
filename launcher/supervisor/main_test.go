package supervisor

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// TestMain makes the test binary every process the tests need: a job
// reaper (the reaper's tests start this executable as one) and the helper
// ranks of launchertest.
func TestMain(m *testing.M) {
	if Is() {
		os.Exit(Main())
	}
	launchertest.MaybeRunHelper()
	launchertest.FastRaceExit()
	goleak.VerifyTestMain(m)
}
