package comm_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
)

// BenchmarkAllReduce measures float32 sum all-reduce between 2 ranks in this
// process, over shared memory and over TCP loopback, from 8 B to 64 MiB.
// busbw follows nccl-tests: algbw · 2(n-1)/n, in GB/s (1e9 bytes).
//
//	go test -run '^$' -bench AllReduce ./comm/
func BenchmarkAllReduce(b *testing.B) {
	for _, medium := range []string{"shm", "tcp"} {
		for _, det := range []bool{false, true} {
			name := medium
			if det {
				name += "-det"
			}
			b.Run(name, func(b *testing.B) {
				cfg := comm.DefaultConfig()
				cfg.Deterministic = det
				j := newNetJob(b, 2, cfg, medium == "tcp")
				for _, size := range []int{8, 1 << 10, 64 << 10, 256 << 10, 2 << 20, 8 << 20, 32 << 20, 64 << 20} {
					if det && size < 64<<10 && size > 8 {
						continue
					}
					b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) { benchAllReduce(b, j.comms, size) })
				}
			})
		}
	}
}

func benchAllReduce(b *testing.B, comms []*comm.Comm, size int) {
	n := len(comms)
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, size/4)
	}
	ctx := context.Background()
	errs := make(chan error, n)
	start := make(chan int, n)
	for r := 1; r < n; r++ {
		go func() { // waited for through errs below
			iters := <-start
			buf := comm.Float32s(bufs[r])
			for range iters {
				if err := comms[r].AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	buf := comm.Float32s(bufs[0])
	run := func(iters int) {
		for r := 1; r < n; r++ {
			start <- iters
		}
		for range iters {
			if err := comms[0].AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
		for r := 1; r < n; r++ {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
	}
	run(5) // warm up: connections, scratch buffers
	for r := 1; r < n; r++ {
		go func() { // restart the peers for the measured loop
			iters := <-start
			bb := comm.Float32s(bufs[r])
			for range iters {
				if err := comms[r].AllReduce(ctx, bb, bb, comm.Sum).Wait(ctx); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(size)/sec/1e9*2*float64(n-1)/float64(n), "busbw_GB/s")
	b.ReportMetric(sec*1e6, "us/op")
}

// BenchmarkCallOverhead measures what issuing and completing a call costs
// apart from moving data: an 8-byte all-reduce on a group of one, issued
// with a cancellable context (as `gorun bench` and most programs issue)
// and waited for at once. Its allocations per call are the steady-state
// garbage of the latency path.
//
//	go test -run '^$' -bench CallOverhead -cpu 1 ./comm/
func BenchmarkCallOverhead(b *testing.B) {
	j := newMemJob(b, 1, comm.DefaultConfig())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	buf := comm.Float32s(make([]float32, 2))
	b.ReportAllocs()
	for b.Loop() {
		if err := j.comms[0].AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
