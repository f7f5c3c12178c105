package model

import (
	"testing"

	"go.uber.org/goleak"
)

// Forward and Backward start goroutines when workers > 1; none may outlive
// the call.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
