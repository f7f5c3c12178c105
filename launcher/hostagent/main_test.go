package hostagent

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
)

// rankModeEnv makes the test binary a rank of relay_test's jobs.
const rankModeEnv = "GORUN_HOSTAGENT_TEST_RANK"

// TestMain makes the test binary every process the tests need: the job
// supervisor the agent starts, and the ranks it runs.
func TestMain(m *testing.M) {
	if supervisor.Is() {
		os.Exit(supervisor.Main())
	}
	switch os.Getenv(rankModeEnv) {
	case "":
	case "flight":
		os.Exit(flightRank())
	case "hang":
		time.Sleep(time.Hour)
		os.Exit(0)
	default:
		fmt.Fprintln(os.Stderr, "unknown rank mode", os.Getenv(rankModeEnv))
		os.Exit(2)
	}
	launchertest.MaybeRunHelper()
	launchertest.FastRaceExit()
	goleak.VerifyTestMain(m)
}

// flightRank says hello and leaves a flight record in the directory its
// agent gave it, as a rank's failing communicator would.
func flightRank() int {
	fmt.Println("hello from the rank")
	d := testDump(os.Getpid())
	if err := comm.WriteFlightDump(os.Getenv(comm.FlightDirEnv), d); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// testDump is the flight record flightRank writes.
func testDump(pid int) comm.FlightDump {
	return comm.FlightDump{Group: "0a0b", Rank: 0, WorldRank: 0, Host: "n1", Size: 2, PID: pid,
		Reason: "peer lost", Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}
