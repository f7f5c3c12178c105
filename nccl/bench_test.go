package nccl

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
)

// BenchmarkIssue measures what the binding adds to one call on the CPU:
// issuing a 1-element all-reduce (bind the context, record the ready event,
// make the stream wait on it, ncclAllReduce, record the done event: five C
// calls through purego) and, separately, the whole round trip through the
// stand-in's stream thread. "issue-ns" is the issue alone. With
// STANDIN_CUDA_INLINE=1 the stand-in runs stream work in the calling thread,
// so ns/op is the binding's own cost of a call and its Wait (what gorun adds
// to each NCCL call on the CPU, plus the stand-in's bookkeeping):
//
//	go test -run '^$' -bench Issue -benchtime 20000x ./nccl/
//	STANDIN_CUDA_INLINE=1 go test -run '^$' -bench Issue -benchtime 20000x ./nccl/
func BenchmarkIssue(b *testing.B) {
	cs, _ := startComms(&testing.T{}, 1, testConfig())
	c := cs[0]
	buf, err := c.Device().Alloc(comm.Float32, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer buf.Free()
	ctx := context.Background()
	var issue time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		h := c.AllReduce(ctx, buf, buf, comm.Sum)
		issue += time.Since(t0)
		if err := h.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(issue.Nanoseconds())/float64(b.N), "issue-ns")
	b.StopTimer()
	c.Close()
}

// BenchmarkCCall is one purego call into the stand-in (ncclGetVersion), the
// unit BenchmarkIssue's issue-ns is made of.
func BenchmarkCCall(b *testing.B) {
	l, err := Open(testConfig().Library)
	if err != nil {
		b.Fatal(err)
	}
	var v int32
	for range b.N {
		call(l.nc.getVersion, uintptr(unsafe.Pointer(&v)))
	}
}
