package launcher

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
)

// TestMain makes the test binary every process the tests need: the job
// agent, the rank helpers, and — for the tests that SIGKILL gorun — a gorun
// itself (helperGorunEnv).
func TestMain(m *testing.M) {
	if supervisor.Is() {
		os.Exit(supervisor.Main())
	}
	if os.Getenv(helperGorunEnv) != "" {
		os.Exit(helperGorun())
	}
	launchertest.MaybeRunHelper()
	launchertest.FastRaceExit()
	goleak.VerifyTestMain(m)
}
