package comm_test

import (
	"fmt"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
)

// With foreign callers (libgorun: collectives called from C threads), the
// large steps of the ring and of the staggered exchanges run on the calling
// goroutine, sending and receiving in turns, instead of handing every send
// to a sender goroutine (comm's callerFrame): no message is posted, the
// results are the reference's, and steps whose messages are several times a
// ring's size complete, which needs the turns (a rank that sent its whole
// message before receiving would wait forever for room in its full ring
// while its neighbour does the same). The same calls from Go's own threads
// post their large sends, which shows the count can see a post.
func TestForeignCallersRunLargeStepsThemselves(t *testing.T) {
	// Rings of 64 KiB carry frames of at most 2 KiB (EagerLimit), so a
	// step of 100 KB is many frames and more than the ring holds.
	old := comm.SetCallerStepMinEager(0)
	t.Cleanup(func() { comm.SetCallerStepMinEager(old) })
	testRingBytes = 64 << 10
	t.Cleanup(func() { testRingBytes = 0 })
	const count = 40_000 // float32: 160 KB per block, 2.5 rings
	for _, n := range []int{3, 4} {
		for _, foreign := range []bool{true, false} {
			t.Run(fmt.Sprintf("n=%d/foreign=%v", n, foreign), func(t *testing.T) {
				comm.SetForeignCallers(foreign)
				t.Cleanup(func() { comm.SetForeignCallers(false) })
				cfg := comm.LocalConfig()
				cfg.LatencyNs = 1e-3 // the ring wherever the host is not crowded
				j := newNetJob(t, n, cfg, false)
				var tcs []tcase
				add := func(k comm.Kind, dt comm.DType, count int) {
					tc := tcase{kind: k, dt: dt, op: comm.Sum, count: count, idx: len(tcs)}
					tc.inplace = tc.idx%2 == 1
					tcs = append(tcs, tc)
				}
				// An all-reduce's ring steps carry a chunk of an n-th
				// of the vector; the others' steps a whole block.
				add(comm.KindAllReduce, comm.Float32, n*count+1)
				add(comm.KindAllReduce, comm.BFloat16, n*count) // reduced in float32 scratch
				add(comm.KindReduceScatter, comm.Float32, count)
				add(comm.KindAllGather, comm.Int64, count)
				add(comm.KindAllToAll, comm.Float32, count)
				runCases(t, j.comms, tcs, true)
				for r, c := range j.comms {
					switch posts := comm.Posts(c); {
					case foreign && posts != 0:
						t.Errorf("rank %d posted %d messages to its sender goroutines, want 0", r, posts)
					case !foreign && posts == 0:
						t.Errorf("rank %d posted no message from Go's threads: the count sees nothing", r)
					}
				}
			})
		}
	}
}
