package nccl

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
	"github.com/gorun-hpc/gorun/overlap"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// The GPU-aware overlap executor, proven by running one step graph through
// overlap.GraphRunner twice: over comm's host communicator with host
// tensors, and over this package's communicator (the stand-ins) with
// device tensors, fused buffers in device memory, packs and scatters queued
// on the communicator's stream and waits turned into stream waits. Every
// tensor of every rank must come out bitwise equal.
//
// The device run is made hostile to missing order: every queued copy
// sleeps before it runs (standinSetCopyDelay), and every compute kernel
// writes its outputs late on the compute stream (standinDelayedWrite). A
// pack not ordered after the kernel that wrote its input, or a kernel not
// ordered after the scatter of the collective it reads, then reads stale
// bytes and the outputs differ.

var devHooks struct {
	once         sync.Once
	liveAllocs   func() int64
	setCopyDelay func(usec int32)
	delayedWrite func(s uintptr, dst uintptr, src unsafe.Pointer, n uintptr, usec int32) int32
	// groupedLaunches counts NCCL launches of several collectives (one
	// ncclGroupStart/End around them).
	groupedLaunches func() int64
}

func loadDevHooks(t *testing.T) {
	devHooks.once.Do(func() {
		cu, err := purego.Dlopen(standins.CUDA, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			t.Fatal(err)
		}
		purego.RegisterLibFunc(&devHooks.liveAllocs, cu, "standinLiveAllocs")
		purego.RegisterLibFunc(&devHooks.setCopyDelay, cu, "standinSetCopyDelay")
		purego.RegisterLibFunc(&devHooks.delayedWrite, cu, "standinDelayedWrite")
		nc, err := purego.Dlopen(standins.NCCL, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			t.Fatal(err)
		}
		purego.RegisterLibFunc(&devHooks.groupedLaunches, nc, "standinGroupedLaunches")
	})
}

const (
	ovShard = 4  // floats per parameter shard (all_gather input)
	ovGrad  = 16 // floats per gradient (divisible by 4 ranks for reduce_scatter, all_to_all)
)

// ovGraph is a data-parallel step whose buckets cover every op the
// executor fuses, each with a fused (two-member) bucket and most with a
// direct (one-member) one: parameter all-gathers before forward, and
// reduce-scatter, all-reduce, all-to-all and broadcast of gradients after
// backward, whose waits come right before the optimizer reads them.
func ovGraph(n int) *stepgraph.Graph {
	b := stepgraph.NewBuilder().Group("dp", n)
	f4 := func(k int) int64 { return int64(k * 4) }
	b.Input("x", f4(ovGrad))
	for i := range 3 {
		b.Input(fmt.Sprintf("p%d.s", i), f4(ovShard))
	}
	b.Tensor("a", f4(ovGrad), stepgraph.Batch).Tensor("h", f4(ovGrad), stepgraph.Batch)
	for i := range 9 {
		b.Tensor(fmt.Sprintf("g%d", i), f4(ovGrad), stepgraph.Partial)
	}
	m := func(in, out string, floats int) stepgraph.Member {
		return stepgraph.Member{In: in, Out: out, Bytes: f4(floats)}
	}
	b.Start("ag.ab", buckets.Forward, "layers.0", buckets.AllGather, "dp", "f32",
		[]stepgraph.Member{m("p0.s", "P0", ovShard), m("p1.s", "P1", ovShard)})
	b.Start("ag.c", buckets.Forward, "layers.0", buckets.AllGather, "dp", "f32", []stepgraph.Member{m("p2.s", "P2", ovShard)})
	b.Wait("ag.ab.w", "ag.ab", "layers.0").Wait("ag.c.w", "ag.c", "layers.0")
	b.Compute("fwd", buckets.Forward, "layers.0", 100*time.Microsecond, []string{"x", "P0", "P1", "P2"}, []string{"a"})
	b.Compute("bwd", buckets.Backward, "layers.0", 100*time.Microsecond, []string{"a", "P0", "P2"},
		[]string{"g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7", "g8"})
	b.Start("rs", buckets.Backward, "layers.0", buckets.ReduceScatter, "dp", "f32",
		[]stepgraph.Member{m("g0", "G0", ovGrad), m("g1", "G1", ovGrad)})
	b.Start("ar", buckets.Backward, "layers.0", buckets.AllReduce, "dp", "f32",
		[]stepgraph.Member{m("g2", "G2", ovGrad), m("g3", "G3", ovGrad)})
	b.Start("ar.one", buckets.Backward, "layers.0", buckets.AllReduce, "dp", "f32", []stepgraph.Member{m("g4", "G4", ovGrad)})
	b.Start("a2a", buckets.Backward, "layers.0", buckets.AllToAll, "dp", "f32",
		[]stepgraph.Member{m("g5", "G5", ovGrad), m("g6", "G6", ovGrad)})
	b.Start("bc", buckets.Backward, "layers.0", buckets.Broadcast, "dp", "f32",
		[]stepgraph.Member{m("g7", "G7", ovGrad), m("g8", "G8", ovGrad)})
	// Compute between the starts and the waits, which the collectives
	// hide behind.
	b.Compute("more", buckets.Backward, "layers.0", 100*time.Microsecond, []string{"a"}, []string{"h"})
	var reads []string
	for _, s := range []string{"rs", "ar", "ar.one", "a2a", "bc"} {
		b.Wait(s+".w", s, "")
	}
	for i := range 9 {
		reads = append(reads, fmt.Sprintf("G%d", i))
	}
	b.Compute("opt", buckets.Optimizer, "", 10*time.Microsecond, append(reads, "h"), []string{"u"})
	b.Tensor("u", f4(ovGrad), stepgraph.Batch)
	g, err := b.Graph()
	if err != nil {
		panic(err)
	}
	for i := range g.Nodes {
		if g.Nodes[i].Kind == stepgraph.Wait && g.Nodes[i].Region == "" {
			g.Nodes[i].Dir = buckets.Optimizer
		}
	}
	return g
}

// ovSizes is every tensor's size in floats on a rank of n.
func ovSizes(g *stepgraph.Graph, n int) map[string]int {
	size := map[string]int{}
	for _, t := range g.Tensors {
		size[t.Name] = int(t.Bytes / 4)
	}
	for _, nd := range g.Nodes {
		for _, m := range nd.Members {
			out := int(m.Bytes / 4)
			switch nd.Op {
			case buckets.AllGather:
				out *= n
			case buckets.ReduceScatter:
				out /= n
			}
			size[m.Out] = out
		}
	}
	return size
}

// ovInput is input tensor name's value on rank r: small integers, so that
// every sum is exact in float32 in any order.
func ovInput(name string, r, i int) float32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return float32((int(h.Sum32()%7) + (r+1)*(i%5) + i) % 9)
}

// ovKernel computes node nd's writes from its reads on the host: element j
// of a write is a small integer mixed from element j of every read (mod its
// length), the node and the step, so that any stale or misplaced element
// changes the result.
func ovKernel(nd *stepgraph.Node, step int, read func(string) []float32, write func(string, []float32)) {
	h := fnv.New32a()
	h.Write([]byte(nd.Name))
	c := int(h.Sum32()%11) + step
	ins := make([][]float32, len(nd.Reads))
	for k, r := range nd.Reads {
		ins[k] = read(r)
	}
	for w, name := range nd.Writes {
		out := make([]float32, ovGrad)
		for j := range out {
			acc := c + w
			for k, in := range ins {
				acc += int(in[j%len(in)]) * (k + 1)
			}
			out[j] = float32(acc % 13)
		}
		write(name, out)
	}
}

// ovRun runs steps steps of g on n ranks and returns every rank's tensors.
type ovRun func(t *testing.T, g *stepgraph.Graph, n, steps int, cfg overlap.Config) []map[string][]float32

// ovHost is the reference: comm's host communicator, host tensors.
func ovHost(t *testing.T, g *stepgraph.Graph, n, steps int, cfg overlap.Config) []map[string][]float32 {
	cs := commtest.StartComms(context.Background(), t, n, comm.DefaultConfig())
	out := make([]map[string][]float32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			bufs := map[string][]float32{}
			for name, k := range ovSizes(g, n) {
				bufs[name] = make([]float32, k)
				for i := range bufs[name] {
					bufs[name][i] = ovInput(name, r, i)
				}
			}
			gr, err := overlap.NewGraphRunner(g, map[string]overlap.Comm{"dp": cs[r]}, cfg)
			if err != nil {
				errs[r] = err
				return
			}
			defer gr.Close()
			tensors := func(name string) (comm.Buffer, error) { return comm.Float32s(bufs[name]), nil }
			for step := range steps {
				kernel := func(_ context.Context, nd *stepgraph.Node) error {
					ovKernel(nd, step, func(s string) []float32 { return bufs[s] }, func(s string, v []float32) { copy(bufs[s], v) })
					return nil
				}
				if _, err := gr.Step(context.Background(), step, tensors, kernel); err != nil {
					errs[r] = err
					return
				}
			}
			out[r] = bufs
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return out
}

// ovDevice runs the same graph over nccl.Comm with device tensors. Each
// kernel synchronizes the compute stream (so it reads what the stream's
// order says it may), reads its inputs to the host, and queues its outputs
// as a late write on the compute stream.
func ovDevice(t *testing.T, g *stepgraph.Graph, n, steps int, cfg overlap.Config) []map[string][]float32 {
	loadDevHooks(t)
	cs, _ := startComms(t, n, testConfig())
	devHooks.setCopyDelay(500)
	defer devHooks.setCopyDelay(0)
	before := devHooks.liveAllocs()
	defer func() {
		// Every rank has freed its tensors and closed its runner.
		if after := devHooks.liveAllocs(); after != before {
			t.Errorf("%d device allocations before the runs, %d after: the executor leaked fused buffers", before, after)
		}
	}()
	out := make([]map[string][]float32, n)
	onAll(t, cs, func(r int, c *Comm) error {
		return onComputeStream(c, func(ctx context.Context, dev *Device, s Stream) error {
			bufs := map[string]*DeviceBuffer{}
			defer func() {
				for _, b := range bufs {
					b.Free()
				}
			}()
			for name, k := range ovSizes(g, n) {
				b, err := dev.Alloc(comm.Float32, k)
				if err != nil {
					return err
				}
				bufs[name] = b
				v := make([]float32, k)
				for i := range v {
					v[i] = ovInput(name, r, i)
				}
				if err := b.CopyFrom(f32bytes(v)); err != nil {
					return err
				}
			}
			gr, err := overlap.NewGraphRunner(g, map[string]overlap.Comm{"dp": c}, cfg)
			if err != nil {
				return err
			}
			tensors := func(name string) (comm.Buffer, error) { return bufs[name], nil }
			var kerr error
			for step := range steps {
				kernel := func(_ context.Context, nd *stepgraph.Node) error {
					if err := dev.Synchronize(s); err != nil {
						return err
					}
					read := func(name string) []float32 {
						v := make([]float32, bufs[name].Len())
						if err := bufs[name].CopyTo(f32bytes(v)); err != nil {
							kerr = err
						}
						return v
					}
					write := func(name string, v []float32) {
						p := f32bytes(v)
						hooks := devHooks.delayedWrite(uintptr(s), bufs[name].Ptr(), unsafe.Pointer(&p[0]), uintptr(len(p)), 3000)
						if hooks != 0 {
							kerr = fmt.Errorf("standinDelayedWrite: %d", hooks)
						}
					}
					ovKernel(nd, step, read, write)
					return kerr
				}
				if _, err := gr.Step(ctx, step, tensors, kernel); err != nil {
					gr.Close()
					return err
				}
			}
			if err := gr.Close(); err != nil {
				return err
			}
			if err := dev.Synchronize(s); err != nil {
				return err
			}
			res := map[string][]float32{}
			for name, b := range bufs {
				v := make([]float32, b.Len())
				if err := b.CopyTo(f32bytes(v)); err != nil {
					return err
				}
				res[name] = v
			}
			out[r] = res
			return nil
		})
	})
	return out
}

func f32bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// TestGraphRunnerOnDeviceMatchesHost: native, grouped (nccl.GroupBackend:
// each bucket set in one ncclGroupStart/End) and serial, on 2 and 4 ranks,
// two steps (the second reuses the fused buffers from the pool). The
// executor must also free every device buffer it allocated at Close.
func TestGraphRunnerOnDeviceMatchesHost(t *testing.T) {
	loadDevHooks(t)
	for _, n := range []int{2, 4} {
		g := ovGraph(n)
		for _, mode := range []overlap.Mode{overlap.Native, overlap.Grouped, overlap.Serial} {
			t.Run(fmt.Sprintf("np%d/%v", n, mode), func(t *testing.T) {
				cfg := overlap.DefaultConfig()
				cfg.Mode = mode
				want := ovHost(t, g, n, 2, cfg)
				if mode == overlap.Grouped {
					cfg.Backend = GroupBackend{}
				}
				grouped := devHooks.groupedLaunches()
				got := ovDevice(t, g, n, 2, cfg)
				if t.Failed() {
					return
				}
				// Grouped mode brackets each bucket set in one
				// ncclGroupStart/End; the others issue call by call.
				switch k := devHooks.groupedLaunches() - grouped; {
				case mode == overlap.Grouped && k == 0:
					t.Errorf("grouped mode: no launch carried several collectives")
				case mode != overlap.Grouped && k != 0:
					t.Errorf("%v mode: %d launches carried several collectives", mode, k)
				}
				for r := range n {
					names := make([]string, 0, len(want[r]))
					for name := range want[r] {
						names = append(names, name)
					}
					sort.Strings(names)
					for _, name := range names {
						w, d := want[r][name], got[r][name]
						for i := range w {
							if math.Float32bits(w[i]) != math.Float32bits(d[i]) {
								t.Errorf("rank %d: %s[%d] = %v on the device, %v on the host", r, name, i, d[i], w[i])
								break
							}
						}
					}
				}
			})
		}
	}
}

// TestExecutorWaitDoesNotBlockCPU: on a device group, Executor.Wait makes
// the compute stream wait for the collective and its scatter instead of
// blocking the CPU. Rank 1 hands its gradients in 400 ms late; rank 0's
// Wait must return long before that, and a kernel queued on its compute
// stream right after must still see the sum (it reads after synchronizing
// that stream, which the stream wait holds back).
func TestExecutorWaitDoesNotBlockCPU(t *testing.T) {
	const late = 400 * time.Millisecond
	b := stepgraph.NewBuilder().Group("dp", 2)
	b.Tensor("g0", 64, stepgraph.Partial).Tensor("g1", 64, stepgraph.Partial).Tensor("y", 64, stepgraph.Batch).Input("x", 64)
	b.Compute("fwd", buckets.Forward, "layers.0", time.Millisecond, []string{"x"}, []string{"g0", "g1"})
	b.Start("ar", buckets.Forward, "layers.0", buckets.AllReduce, "dp", "f32",
		[]stepgraph.Member{{In: "g0", Out: "G0", Bytes: 64}, {In: "g1", Out: "G1", Bytes: 64}})
	b.Wait("ar.w", "ar", "layers.0")
	b.Compute("opt", buckets.Forward, "layers.0", time.Millisecond, []string{"G0", "G1"}, []string{"y"})
	g, err := b.Graph()
	if err != nil {
		t.Fatal(err)
	}
	plan, err := stepgraph.Plan(g)
	if err != nil {
		t.Fatal(err)
	}
	cs, _ := startComms(t, 2, testConfig())
	onAll(t, cs, func(r int, c *Comm) error {
		return onComputeStream(c, func(ctx context.Context, dev *Device, s Stream) error {
			ex, err := overlap.New(plan, map[string]overlap.Comm{"dp": c}, overlap.DefaultConfig())
			if err != nil {
				return err
			}
			defer ex.Close()
			bufs := map[string]*DeviceBuffer{}
			for _, name := range []string{"g0", "g1", "G0", "G1"} {
				v := make([]float64, 16)
				for i := range v {
					v[i] = float64((r + 1) * (i + len(name)))
				}
				bufs[name] = upload(t, c, comm.Float32, v)
			}
			if err := ex.Begin(0); err != nil {
				return err
			}
			if r == 1 {
				time.Sleep(late)
			}
			for _, m := range []string{"0", "1"} {
				if err := ex.Ready(ctx, "g"+m, bufs["g"+m], bufs["G"+m]); err != nil {
					return err
				}
			}
			t0 := time.Now()
			if err := ex.Wait(ctx, "G0"); err != nil {
				return err
			}
			if d := time.Since(t0); r == 0 && d > late/2 {
				return fmt.Errorf("Wait blocked the CPU for %v while the peer was %v late", d, late)
			}
			if err := dev.Synchronize(s); err != nil {
				return err
			}
			for _, m := range []string{"0", "1"} {
				for i, v := range download(t, bufs["G"+m]) {
					if want := float64(3 * (i + 2)); v != want {
						return fmt.Errorf("G%s[%d] = %v after the compute stream's wait, want %v", m, i, v, want)
					}
				}
			}
			_, err = ex.Finish(ctx)
			return err
		})
	})
}

// onComputeStream runs f with a fresh compute stream on c's device and a
// context whose calls are ordered after it (WithStream), and destroys the
// stream afterwards.
func onComputeStream(c *Comm, f func(ctx context.Context, dev *Device, s Stream) error) error {
	dev := c.Device()
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer dev.DestroyStream(s)
	return f(WithStream(context.Background(), s), dev, s)
}
