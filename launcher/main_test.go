package launcher

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// TestMain makes the test binary every process the tests need: the job
// agent, the rank helpers, and — for the tests that SIGKILL gorun — a gorun
// itself (helperGorunEnv).
func TestMain(m *testing.M) {
	if IsSupervisor() {
		os.Exit(SupervisorMain())
	}
	if os.Getenv(helperGorunEnv) != "" {
		os.Exit(helperGorun())
	}
	launchertest.MaybeRunHelper()
	launchertest.FastRaceExit()
	goleak.VerifyTestMain(m)
}
