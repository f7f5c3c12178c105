//go:build !linux

package comm

import (
	"runtime"
	"sync/atomic"
)

// The shared-memory waiter and its settings exist only on Linux
// (shm_linux.go); elsewhere SetTuning (export_test.go) stores into these
// and changes nothing, so that the package's tests build on every system.
var (
	cpuCheck, yieldIdle             atomic.Bool
	fastLimit                       atomic.Int64
	spinLimit, yieldAfter, slowWait = tunable(0), tunable(0), tunable(0)
)

const fastMaxPayload = 0

// SchedGroupTag has no meaning without shared memory.
func SchedGroupTag() uint32 { return 0 }

// OnlineCPUs is the host's CPU count.
func OnlineCPUs() int { return runtime.NumCPU() }
