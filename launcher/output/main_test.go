package output

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a Job starts (its poller, a streamer per other reader)
// has ended when Wait returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
