package comm_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// A healthy peer that does not read for several leases — its receive
// window closed under a large send, then an idle link — is not a cut:
// its kernel answers the zero-window and keepalive probes. (With
// TCP_USER_TIMEOUT at the lease instead, the send fails with "connection
// timed out": Linux aborts a window closed that long.)
func TestLinkLeaseSparesSlowReader(t *testing.T) {
	if testing.Short() {
		t.Skip("waits three leases")
	}
	const lease = time.Second
	testLinkLease = lease
	defer func() { testLinkLease = 0 }()
	comms := newNetJob(t, 2, comm.LocalConfig(), true).comms
	const count = 16 << 20 // 64 MiB of float32: more than both sockets' buffers
	errs := onEach(t, 2, func(r int) error {
		ctx := context.Background()
		buf := make([]float32, count)
		if r == 0 {
			buf[count-1] = 7
			return comms[0].Send(ctx, comm.Float32s(buf), 1).Wait(ctx)
		}
		time.Sleep(3 * lease) // the window stays closed for three leases
		if err := comms[1].Recv(ctx, comm.Float32s(buf), 0).Wait(ctx); err != nil {
			return err
		}
		if buf[count-1] != 7 {
			t.Errorf("received %v, want 7", buf[count-1])
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d, reader slow for 3 leases: %v", r, err)
		}
	}
	time.Sleep(3 * lease) // idle: keepalive probes, answered
	errs = onEach(t, 2, func(r int) error {
		ctx := context.Background()
		x := []float32{1}
		return comms[r].AllReduce(ctx, comm.Float32s(x), comm.Float32s(x), comm.Sum).Wait(ctx)
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d after 3 idle leases: %v", r, err)
		}
	}
}
