package overlap

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// loggingComm records the collectives issued, interleaved with compute.
type loggingComm struct {
	Comm
	log *[]string
}

func (c loggingComm) AllGather(ctx context.Context, send, recv comm.Buffer) Handle {
	// Parameter k is filled with k: the first element names the start.
	*c.log = append(*c.log, fmt.Sprintf("s%v", comm.AsFloat32(send)[0]))
	return c.Comm.AllGather(ctx, send, recv)
}

// fourGathers: four blocks, each reading a parameter gathered by its own
// start; every start's input exists when the step begins, so only the
// prefetch bounds decide when each goes out.
const fourGathers = `group g 1
region b0
region b1
region b2
region b3
tensor w0 16 input
tensor w1 16 input
tensor w2 16 input
tensor w3 16 input
start s0 fwd b0 all_gather g f32 w0>W0:16
wait s0.w fwd b0 of=s0
compute c0 fwd b0 10us reads=W0 writes=x0
start s1 fwd b1 all_gather g f32 w1>W1:16
wait s1.w fwd b1 of=s1
compute c1 fwd b1 10us reads=W1,x0 writes=x1
start s2 fwd b2 all_gather g f32 w2>W2:16
wait s2.w fwd b2 of=s2
compute c2 fwd b2 10us reads=W2,x1 writes=x2
start s3 fwd b3 all_gather g f32 w3>W3:16
wait s3.w fwd b3 of=s3
compute c3 fwd b3 10us reads=W3,x2 writes=x3`

// TestPrefetchBounds: how far ahead of their plan positions the runner
// issues starts whose inputs exist at step start, under each bound, and
// that the memory it measures is the plan's estimate when starts go out at
// their plan positions.
func TestPrefetchBounds(t *testing.T) {
	g, err := stepgraph.Parse(fourGathers)
	if err != nil {
		t.Fatal(err)
	}
	est, _, err := stepgraph.PeakCollectiveBytes(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		prefetch int
		maxBytes int64
		want     string
		peak     int64
	}{
		{"unbounded", -1, 0, "s0 s1 s2 s3 c0 c1 c2 c3", 64},
		{"at plan position", 0, 0, "s0 c0 s1 c1 s2 c2 s3 c3", est},
		{"one ahead", 1, 0, "s0 s1 c0 s2 c1 s3 c2 c3", 32},
		{"two in flight", -1, 32, "s0 s1 c0 s2 c1 s3 c2 c3", 32},
		{"bytes below one bucket", -1, 8, "s0 c0 s1 c1 s2 c2 s3 c3", 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := commtest.StartComms(ctx, t, 1, comm.LocalConfig())[0]
			var log []string
			cfg := DefaultConfig()
			cfg.CheckPlan = false
			cfg.PrefetchStarts, cfg.MaxInFlightBytes = tc.prefetch, tc.maxBytes
			gr, err := NewGraphRunner(g, map[string]Comm{"g": loggingComm{c, &log}}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer gr.Close()
			bufs := map[string][]float32{}
			for k := range 4 {
				bufs[fmt.Sprintf("w%d", k)] = []float32{float32(k), float32(k), float32(k), float32(k)}
				bufs[fmt.Sprintf("W%d", k)] = make([]float32, 4)
				bufs[fmt.Sprintf("x%d", k)] = make([]float32, 1)
			}
			var released []string
			gr.SetRelease(func(name string) { released = append(released, name) })
			tensors := func(name string) (comm.Buffer, error) { return comm.Float32s(bufs[name]), nil }
			kernel := func(_ context.Context, n *stepgraph.Node) error {
				log = append(log, n.Name)
				return nil
			}
			// Two steps: the bounds hold on every step, not only on the
			// first (the runner keeps its step state from step to step).
			for step := 1; step <= 2; step++ {
				log, released = nil, nil
				m, err := gr.Step(ctx, step, tensors, kernel)
				if err != nil {
					t.Fatal(err)
				}
				if got := strings.Join(log, " "); got != tc.want {
					t.Errorf("step %d: order %q, want %q", step, got, tc.want)
				}
				if m.PeakBytes != tc.peak {
					t.Errorf("step %d: measured peak %d bytes, want %d (plan estimate %d)", step, m.PeakBytes, tc.peak, est)
				}
				// Each gathered parameter is released after its reader ran.
				if got := strings.Join(released, " "); got != "W0 W1 W2 W3" {
					t.Errorf("step %d: released %q", step, got)
				}
			}
		})
	}
}

// TestFusedBuffersDropped: a bucket's fused buffers exist from its first
// packed member to its wait, not for the executor's life; buckets of one
// member never have any. Two steps of two 2-member buckets, waited one
// after the other: the peak is one bucket's buffer, and nothing stays
// allocated between steps.
func TestFusedBuffersDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := commtest.StartComms(ctx, t, 1, comm.LocalConfig())[0]
	p, err := buckets.Assign([]buckets.Item{
		{Tensor: "a", Bytes: 8, Group: "g", Op: buckets.AllReduce, DType: "f32", Direction: buckets.Backward, Region: "l1"},
		{Tensor: "b", Bytes: 8, Group: "g", Op: buckets.AllReduce, DType: "f32", Direction: buckets.Backward, Region: "l1"},
		{Tensor: "c", Bytes: 8, Group: "g", Op: buckets.AllReduce, DType: "f32", Direction: buckets.Backward, Region: "l0"},
		{Tensor: "d", Bytes: 8, Group: "g", Op: buckets.AllReduce, DType: "f32", Direction: buckets.Backward, Region: "l0"},
		{Tensor: "e", Bytes: 8, Group: "g", Op: buckets.AllReduce, DType: "f32", Direction: buckets.Optimizer, Region: "l0"},
	}, []string{"l0", "l1"}, buckets.Config{Model: buckets.DefaultModel(), CapBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.CheckPlan = false
	ex, err := New(p, map[string]Comm{"g": c}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	buf := map[string][]float32{}
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		buf[n] = []float32{1, 2}
	}
	for step := 1; step <= 2; step++ {
		if err := ex.Begin(step); err != nil {
			t.Fatal(err)
		}
		for _, pair := range [][]string{{"a", "b"}, {"c", "d"}, {"e"}} {
			for _, n := range pair {
				if err := ex.Ready(ctx, n, comm.Float32s(buf[n]), comm.Float32s(buf[n])); err != nil {
					t.Fatal(err)
				}
			}
			if err := ex.Wait(ctx, pair[0]); err != nil {
				t.Fatal(err)
			}
		}
		m, err := ex.Finish(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.FusedPeakBytes != 16 || ex.mem.cur != 0 {
			t.Fatalf("step %d: fused peak %d bytes (want 16: one 2-member bucket at a time), %d still allocated", step, m.FusedPeakBytes, ex.mem.cur)
		}
	}
}
