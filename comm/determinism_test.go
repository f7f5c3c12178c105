package comm_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
)

// In deterministic mode, bucketing two tensors together, the segment size
// and the algorithm (cost model) cannot change a single bit, and every rank
// gets the documented tree's bits. Five ranks, because with three the tree
// ((0+1)+2) is also the left fold, and a left fold would pass unnoticed.
func TestDeterministicBucketingInvariance(t *testing.T) {
	const n = 5
	a, b := 1001, 777
	data := make([][]float32, n)
	for r := range data {
		rng := rand.New(rand.NewPCG(7, uint64(r)))
		data[r] = make([]float32, a+b)
		for i := range data[r] {
			data[r][i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(8)-4)))
		}
	}
	run := func(mod func(*comm.Config), bucket bool) [][]float32 {
		cfg := comm.LocalConfig()
		cfg.Deterministic = true
		mod(&cfg)
		j := newMemJob(t, n, cfg)
		out := make([][]float32, n)
		errs := onEach(t, n, func(r int) error {
			ctx, cancel := waitCtx(t)
			defer cancel()
			buf := append([]float32(nil), data[r]...)
			if bucket {
				out[r] = buf
				return j.comms[r].AllReduce(ctx, comm.Float32s(buf), comm.Float32s(buf), comm.Sum).Wait(ctx)
			}
			x, y := buf[:a], buf[a:]
			h1 := j.comms[r].AllReduce(ctx, comm.Float32s(x), comm.Float32s(x), comm.Sum)
			h2 := j.comms[r].AllReduce(ctx, comm.Float32s(y), comm.Float32s(y), comm.Sum)
			out[r] = buf
			if err := h1.Wait(ctx); err != nil {
				return err
			}
			return h2.Wait(ctx)
		})
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	variants := map[string][][]float32{
		"bucketed/gather":     run(func(c *comm.Config) { c.LatencyNs = 1e9 }, true),
		"separate/gather":     run(func(c *comm.Config) { c.LatencyNs = 1e9 }, false),
		"bucketed/direct-4K":  run(func(c *comm.Config) { c.LatencyNs = 1e-3; c.SegmentBytes = 4096 }, true),
		"separate/direct-64K": run(func(c *comm.Config) { c.LatencyNs = 1e-3; c.SegmentBytes = 64 << 10 }, false),
	}
	// Reference: the documented tree, sequentially in float32.
	want := make([]float32, a+b)
	foldDiffers := 0
	for i := range want {
		want[i] = ((data[0][i] + data[1][i]) + (data[2][i] + data[3][i])) + data[4][i]
		fold := (((data[0][i] + data[1][i]) + data[2][i]) + data[3][i]) + data[4][i]
		if math.Float32bits(fold) != math.Float32bits(want[i]) {
			foldDiffers++
		}
	}
	// The control: for this data another order of the same sum gives other
	// bits somewhere, or matching the tree would prove nothing.
	if foldDiffers == 0 {
		t.Fatal("a left fold gives the tree's bits for every element: the data cannot tell orders apart")
	}
	for name, out := range variants {
		for r := range out {
			for i := range want {
				if math.Float32bits(out[r][i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s rank %d element %d: %v, want %v", name, r, i, out[r][i], want[i])
				}
			}
		}
	}
}

// Steady-state calls allocate a small constant, independent of message
// size and segment count: no per-message allocation.
func TestAllocationsPerCallAreConstant(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counting runs the full loop")
	}
	for _, medium := range []string{"shm", "tcp"} {
		cfg := comm.LocalConfig()
		cfg.TCPSegmentBytes = cfg.SegmentBytes // 16 segments each way on TCP too
		j := newNetJob(t, 2, cfg, medium == "tcp")
		var small float64
		for _, size := range []int{2, 1 << 20} { // 1 frame vs 16 segments each way
			bufs := [][]float32{make([]float32, size), make([]float32, size)}
			ctx, cancel := waitCtx(t)
			done := make(chan struct{})
			const runs = 20
			go func() { // the peer, waited for below
				defer close(done)
				for range runs + 1 {
					_ = j.comms[1].AllReduce(ctx, comm.Float32s(bufs[1]), comm.Float32s(bufs[1]), comm.Sum).Wait(ctx)
				}
			}()
			allocs := testing.AllocsPerRun(runs, func() {
				_ = j.comms[0].AllReduce(ctx, comm.Float32s(bufs[0]), comm.Float32s(bufs[0]), comm.Sum).Wait(ctx)
			})
			<-done
			cancel()
			// AllocsPerRun counts both ranks' goroutines.
			t.Logf("%s %d floats: %.1f allocations per call, both ranks", medium, size, allocs)
			if size == 2 {
				small = allocs
			}
			if allocs > 20 || allocs > small+4 {
				t.Errorf("%s %d floats: %.1f allocations per call (small messages: %.1f)", medium, size, allocs, small)
			}
		}
	}
}
