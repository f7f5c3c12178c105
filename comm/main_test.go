package comm_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The test binary is also the rank program of the multi-process tests.
	if os.Getenv(desyncChildEnv) != "" {
		os.Exit(desyncChildMain())
	}
	if os.Getenv(schedChildEnv) != "" {
		os.Exit(schedChildMain())
	}
	if os.Getenv("GORUN_COMM_CHILD") != "" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m)
}
