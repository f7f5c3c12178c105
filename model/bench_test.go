package model

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user+system CPU time. Benchmarks report it per
// op next to wall time because the machines this runs on are shared: wall
// time swings with other load, CPU time much less.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStep measures one forward+backward of the default model over a
// local batch: 4 samples is one rank's share of a global batch of 16 on 4
// ranks, 16 is the whole batch on one rank (with one or two goroutines).
func BenchmarkStep(b *testing.B) {
	for _, c := range []struct{ n, workers int }{{4, 1}, {16, 1}, {16, 2}} {
		n := c.n
		b.Run(fmt.Sprintf("samples=%d/workers=%d", n, c.workers), func(b *testing.B) {
			cfg := DefaultConfig()
			m, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			ws, err := m.NewWorkspace(n)
			if err != nil {
				b.Fatal(err)
			}
			ws.SetWorkers(c.workers)
			d := NewDataset(cfg)
			in, tg := make([]int32, n*cfg.SeqLen), make([]int32, n*cfg.SeqLen)
			if err := d.Batch(0, n, 0, n, in, tg); err != nil {
				b.Fatal(err)
			}
			params, grads := m.Init(), m.Layout().Alloc(1)
			var flops int64
			for r := 0; r < m.NumRegions(); r++ {
				f, bw := m.FLOPs(r)
				flops += int64(n) * (f + bw)
			}
			b.ResetTimer()
			cpu0 := cpuTime()
			for b.Loop() {
				if err := ws.SetBatch(in, tg); err != nil {
					b.Fatal(err)
				}
				if _, err := ws.Step(params, grads); err != nil {
					b.Fatal(err)
				}
			}
			cpu := cpuTime() - cpu0
			b.ReportMetric(float64(flops)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
		})
	}
}

// BenchmarkRegion measures forward and backward of each kind of region on one
// rank's share (4 samples) of the default model, to calibrate the step
// graph's compute costs against Model.FLOPs.
func BenchmarkRegion(b *testing.B) {
	cfg := DefaultConfig()
	m, _ := New(cfg)
	const n = 4
	ws, _ := m.NewWorkspace(n)
	in, tg := make([]int32, n*cfg.SeqLen), make([]int32, n*cfg.SeqLen)
	_ = NewDataset(cfg).Batch(0, n, 0, n, in, tg)
	params, grads := m.Init(), m.Layout().Alloc(1)
	_ = ws.SetBatch(in, tg)
	if _, err := ws.Step(params, grads); err != nil {
		b.Fatal(err)
	}
	for _, r := range []int{m.EmbedRegion(), m.BlockRegion(0), m.HeadRegion()} {
		name := m.Layout().Regions[r].Name
		fwd, bwd := m.FLOPs(r)
		b.Run(name+"/forward", func(b *testing.B) {
			for b.Loop() {
				if err := ws.Forward(r, params[r], 0, n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*fwd)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(name+"/backward", func(b *testing.B) {
			for b.Loop() {
				// Re-arm: backward consumes the gradient stream once. Marking
				// the region not yet done is the cheapest way in a benchmark.
				for s := 0; s < n; s++ {
					ws.w.bwd[r][s] = false
				}
				if err := ws.Backward(r, params[r], grads[r], 0, n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*bwd)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
