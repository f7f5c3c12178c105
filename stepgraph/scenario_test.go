package stepgraph

import (
	"testing"

	harness "github.com/gorun-hpc/gorun/internal/scenario"
)

// The golden-file harness lives in internal/scenario, shared by the planning
// packages; these names keep the tests short.
type scenario = harness.Case

func runScenarios(t *testing.T, glob string, run func(t *testing.T, sc scenario) string) {
	t.Helper()
	harness.Run(t, glob, run)
}
