package overlap

import (
	"context"
	"fmt"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// Kernel runs one compute node of a graph (the program's forward, backward
// or optimizer code for it). Builtin nodes (split, concat, sum) never reach
// it: GraphRunner runs those itself.
type Kernel func(ctx context.Context, n *stepgraph.Node) error

// Tensors maps a tensor name to its buffer. The runner asks for every
// member input and output of every start and for the operands of builtins;
// the same name must give the same memory for the whole step.
type Tensors func(name string) (comm.Buffer, error)

// GraphRunner executes a (bucketed) step graph step after step over an
// Executor: compute in plan order, each start issued right after the compute
// that writes its last input (as early as data allows; the executor adds the
// group order), each wait taken right before the first compute that reads
// one of its outputs (as late as data allows), the rest at the end of the
// step. A start whose input is another collective's output (hybrid
// sharding: a reduce-scatter on the shard group, then an all-reduce of its
// result on the replica group) is issued only after that collective's wait,
// which the runner then takes at its plan position. Any number of process
// groups may appear, one communicator each. Both backends (Native, Grouped)
// run the same plan.
type GraphRunner struct {
	g  *stepgraph.Graph
	ex *Executor
	// after[i] lists the start nodes whose inputs are complete once node i
	// has run; after[len] those ready when the step begins.
	after map[int][]int
	// waitsBefore[i] lists the outputs compute node i must wait for.
	waitsBefore map[int][]string
	// waitFirst[i], for a wait node i, lists the outputs to wait for when
	// the runner reaches it: the inputs of starts that read a collective's
	// output (hybrid sharding's replica all-reduce of a reduce-scattered
	// shard). Those starts are in after[i]: issued right after the
	// producer's wait, never earlier, where the data would be stale.
	waitFirst map[int][]string
}

// NewGraphRunner validates g, extracts its plan (stepgraph.Plan) and
// prepares an Executor over comms.
func NewGraphRunner(g *stepgraph.Graph, comms map[string]Comm, cfg Config) (*GraphRunner, error) {
	plan, err := stepgraph.Plan(g)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPlan, err)
	}
	ex, err := New(plan, comms, cfg)
	if err != nil {
		return nil, err
	}
	gr := &GraphRunner{g: g, ex: ex, after: map[int][]int{}, waitsBefore: map[int][]string{}, waitFirst: map[int][]string{}}
	writer := map[string]int{}
	outOf := map[string]bool{}
	startAt := map[string]int{}
	waitedAt := map[string]int{} // collective output → its wait node
	for i := range g.Nodes {
		nd := &g.Nodes[i]
		switch nd.Kind {
		case stepgraph.Wait:
			if s, ok := startAt[nd.Of]; ok {
				for _, m := range g.Nodes[s].Members {
					waitedAt[m.Out] = i
				}
			}
		case stepgraph.Compute:
			for _, r := range nd.Reads {
				if outOf[r] {
					gr.waitsBefore[i] = append(gr.waitsBefore[i], r)
					outOf[r] = false // waited once is enough
				}
			}
			for _, w := range nd.Writes {
				writer[w] = i
			}
		case stepgraph.Start:
			startAt[nd.Name] = i
			// Issued after the last node that makes an input: the compute
			// that writes it, or the wait of the collective that delivers
			// it (Validate has checked that this wait precedes the start).
			last := -1
			var deps []string
			for _, m := range nd.Members {
				if w, ok := writer[m.In]; ok && w > last {
					last = w
				}
				if w, ok := waitedAt[m.In]; ok {
					deps = append(deps, m.In)
					last = max(last, w)
				}
			}
			// Waits are otherwise taken lazily, before their first compute
			// reader; a start that reads a collective's output must have
			// it complete first, wherever the start goes out (at the
			// producer's wait, or after a later compute input).
			if len(deps) > 0 {
				gr.waitFirst[last] = append(gr.waitFirst[last], deps...)
			}
			gr.after[last] = append(gr.after[last], i)
			for _, m := range nd.Members {
				outOf[m.Out] = true
			}
		}
	}
	return gr, nil
}

// Executor is the executor underneath, for its Timeline and Plan.
func (gr *GraphRunner) Executor() *Executor { return gr.ex }

// Close stops the executor.
func (gr *GraphRunner) Close() error { return gr.ex.Close() }

// Step runs the graph once.
func (gr *GraphRunner) Step(ctx context.Context, step int, tensors Tensors, kernel Kernel) (StepMetrics, error) {
	ex := gr.ex
	if err := ex.Begin(step); err != nil {
		return StepMetrics{}, err
	}
	fail := func(err error) (StepMetrics, error) {
		ex.inStep = false
		ex.broken = err
		return StepMetrics{}, err
	}
	issue := func(starts []int) error {
		for _, si := range starts {
			nd := &gr.g.Nodes[si]
			for _, m := range nd.Members {
				in, err := tensors(m.In)
				if err != nil {
					return fmt.Errorf("overlap: start %q: %w", nd.Name, err)
				}
				out, err := tensors(m.Out)
				if err != nil {
					return fmt.Errorf("overlap: start %q: %w", nd.Name, err)
				}
				if err := ex.Ready(ctx, m.In, in, out); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := issue(gr.after[-1]); err != nil {
		return fail(err)
	}
	waitDeps := func(i int) error {
		for _, out := range gr.waitFirst[i] {
			if err := ex.Wait(ctx, out); err != nil {
				return err
			}
		}
		return nil
	}
	for i := range gr.g.Nodes {
		nd := &gr.g.Nodes[i]
		if nd.Kind == stepgraph.Wait && len(gr.after[i]) > 0 {
			// A producer whose output another collective reads: wait for
			// it here, then issue its consumers.
			if err := waitDeps(i); err != nil {
				return fail(err)
			}
			if err := issue(gr.after[i]); err != nil {
				return fail(err)
			}
			continue
		}
		if nd.Kind != stepgraph.Compute {
			continue // starts were issued after their last writer; other waits are lazy
		}
		for _, out := range gr.waitsBefore[i] {
			if err := ex.Wait(ctx, out); err != nil {
				return fail(err)
			}
		}
		err := ex.Compute(ctx, nd.Name, nd.Region, func() error {
			if nd.Builtin != "" {
				return builtin(nd, tensors)
			}
			return kernel(ctx, nd)
		})
		if err != nil {
			return fail(fmt.Errorf("overlap: step %d: compute %q: %w", step, nd.Name, err))
		}
		if err := waitDeps(i); err != nil {
			return fail(err)
		}
		if err := issue(gr.after[i]); err != nil {
			return fail(err)
		}
	}
	return ex.Finish(ctx)
}

// builtin runs split, concat or sum on host buffers of any dtype (sum on
// float32 only, the dtype chunked gradients have here).
func builtin(nd *stepgraph.Node, tensors Tensors) error {
	host := func(name string) ([]byte, comm.Buffer, error) {
		b, err := tensors(name)
		if err != nil {
			return nil, nil, err
		}
		h, ok := b.Host()
		if !ok {
			return nil, nil, fmt.Errorf("%w: builtin %s: tensor %q not in host memory", ErrUsage, nd.Builtin, name)
		}
		return h, b, nil
	}
	if len(nd.Reads) == 0 || len(nd.Writes) == 0 {
		return fmt.Errorf("%w: builtin %s of node %q needs reads and writes", ErrUsage, nd.Builtin, nd.Name)
	}
	switch nd.Builtin {
	case stepgraph.Split:
		src, _, err := host(nd.Reads[0])
		if err != nil {
			return err
		}
		half := len(src) / len(nd.Writes)
		for i, w := range nd.Writes {
			dst, _, err := host(w)
			if err != nil {
				return err
			}
			copy(dst, src[i*half:(i+1)*half])
		}
	case stepgraph.Concat:
		dst, _, err := host(nd.Writes[0])
		if err != nil {
			return err
		}
		off := 0
		for _, r := range nd.Reads {
			src, _, err := host(r)
			if err != nil {
				return err
			}
			off += copy(dst[off:], src)
		}
	case stepgraph.Sum:
		_, db, err := host(nd.Writes[0])
		if err != nil {
			return err
		}
		if db.DType() != comm.Float32 {
			return fmt.Errorf("%w: builtin sum of %s: only float32", ErrUsage, db.DType())
		}
		d := comm.AsFloat32(db)
		for k, r := range nd.Reads {
			_, sb, err := host(r)
			if err != nil {
				return err
			}
			s := comm.AsFloat32(sb)
			if k == 0 {
				copy(d, s)
				continue
			}
			for j := range d {
				d[j] += s[j]
			}
		}
	default:
		return fmt.Errorf("%w: unknown builtin %q", ErrUsage, nd.Builtin)
	}
	return nil
}
