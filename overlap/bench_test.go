package overlap

import (
	"context"
	"fmt"
	"testing"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// BenchmarkExecutorStep measures the executor's own cost per step of 200
// gradient tensors of 40 KB over a communicator that completes every call
// at once (no data moves): what the runtime adds on top of communication.
// "copy" hands separate buffers (packed and scattered), "view" computes into
// the bucket slots (Executor.View).
func BenchmarkExecutorStep(b *testing.B) {
	const tensors, bytes = 200, 40_000
	var items []buckets.Item
	for i := range tensors {
		items = append(items, buckets.Item{Tensor: fmt.Sprintf("t%d", i), Bytes: bytes, Group: "g",
			Op: buckets.AllReduce, DType: "f32", Direction: buckets.Backward, Region: "m"})
	}
	for _, capB := range []int64{1, 0} {
		for _, view := range []bool{false, true} {
			name := fmt.Sprintf("cap=%d/view=%v", capB, view)
			b.Run(name, func(b *testing.B) {
				bc := buckets.DefaultConfig()
				bc.CapBytes = capB
				p, err := buckets.Assign(items, []string{"m"}, bc)
				if err != nil {
					b.Fatal(err)
				}
				fc := newFakeComm(0, 2, newFakeClock(), nil)
				cfg := DefaultConfig()
				ex, err := New(p, map[string]Comm{"g": &noopComm{fc}}, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer ex.Close()
				bufs := make([]comm.Buffer, tensors)
				names := make([]string, tensors)
				for i := range bufs {
					names[i] = items[i].Tensor
					if view {
						bufs[i], _ = ex.View(names[i])
					} else {
						bufs[i] = comm.Float32s(make([]float32, bytes/4))
					}
				}
				ctx := context.Background()
				b.SetBytes(tensors * bytes)
				b.ResetTimer()
				for i := range b.N {
					if err := ex.Begin(i); err != nil {
						b.Fatal(err)
					}
					for t := range bufs {
						if err := ex.Ready(ctx, names[t], bufs[t], bufs[t]); err != nil {
							b.Fatal(err)
						}
					}
					if _, err := ex.Finish(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(len(p.Groups[0].Buckets)), "µs/bucket")
			})
		}
	}
}

// noopComm completes every call at once without touching the data.
type noopComm struct{ *fakeComm }

func (n *noopComm) AllReduce(context.Context, comm.Buffer, comm.Buffer, comm.Op) Handle {
	return n.handle(func() {})
}

// BenchmarkGraphRunnerStep measures what the graph runner adds per step
// on top of the executor (BenchmarkExecutorStep): the bucketing step of
// scripts/bench-step.sh, 200 gradients of 40 KB all-reduced, written one
// collective per tensor and bucketed by the passes into one bucket, its
// members computed into their slots (views), over a communicator that
// completes every call at once.
func BenchmarkGraphRunnerStep(b *testing.B) {
	const tensors, bytes = 200, 40_000
	g := gradsGraph(b, tensors, bytes, 25_000_000)
	ins := make([]string, tensors)
	for i := range ins {
		ins[i] = fmt.Sprintf("t%d", i)
	}
	r, err := NewGraphRunner(g, map[string]Comm{"g": &noopComm{newFakeComm(0, 2, newFakeClock(), nil)}}, DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	byName := map[string]comm.Buffer{"updated": comm.Float32s(nil)}
	for i := range tensors {
		v, ok := r.View(ins[i])
		if !ok {
			b.Fatalf("no view of %s", ins[i])
		}
		byName[ins[i]], byName[fmt.Sprintf("T%d", i)] = v, v
	}
	tens := func(name string) (comm.Buffer, error) { return byName[name], nil }
	kernel := func(context.Context, *stepgraph.Node) error { return nil }
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if _, err := r.Step(ctx, i, tens, kernel); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/tensors, "ns/tensor")
}
