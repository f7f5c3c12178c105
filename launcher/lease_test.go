package launcher

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/supervisor"
)

// TestQuietJobKeepsItsLease runs a job whose ranks say nothing for longer
// than the lease allows even a supervisor the kernel shows alive
// (supervisor.StarvedLimitX leases): the supervisor's beats alone must keep its
// client from killing it, so the job succeeds.
func TestQuietJobKeepsItsLease(t *testing.T) {
	const lease = 200 * time.Millisecond
	quiet := supervisor.StarvedLimitX*lease + time.Second
	j := newJobRun(t, 1, "ticker:"+strconv.Itoa(int(quiet.Milliseconds())), nil)
	j.cfg.Lease = lease
	if err := j.launch(context.Background()); err != nil {
		t.Fatalf("a job quiet for %v under a lease of %v failed: %v", quiet, lease, err)
	}
}
