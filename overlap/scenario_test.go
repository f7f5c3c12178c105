package overlap

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/stepgraph"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.txt with the actual output")

// A scenario file is a sequence of cases:
//
//	case NAME
//	<commands, one per line; # comments>
//	----
//	<expected output>
//
// Commands (eager executor):
//
//	ranks N                          group size of the fake communicator
//	regions R1 R2 ...                forward block order for buckets.Assign
//	item T BYTES OP DIR REGION [out=O] one tensor of the plan (group "g", f32)
//	cap BYTES                        bucket cap
//	new [mode=native|grouped|serial] [flush] [peerhash]
//	                                 assign the plan, print it, make the executor
//	begin STEP | finish | compute NAME
//	ready T                          hand in T (filled with its item number)
//	wait OUT                         wait and print OUT
//	endregion R
//
// Graph commands: "graph" followed by stepgraph text lines up to "end",
// then "rungraph [mode=...]" runs one step printing each kernel call.
//
// The fake communicator prints every collective with its send buffer, so the
// output shows the executor's issue order and fused-buffer packing.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			cases := parseCases(t, file)
			changed := false
			for i := range cases {
				c := &cases[i]
				t.Run(c.name, func(t *testing.T) {
					got := runCase(t, c.cmds)
					if got != c.want {
						if *rewrite {
							c.want, changed = got, true
							return
						}
						t.Errorf("%s case %s: output differs (run with -rewrite and review the diff)\n--- got\n%s--- want\n%s", file, c.name, got, c.want)
					}
				})
			}
			if changed {
				var b strings.Builder
				for i, c := range cases {
					if i > 0 {
						b.WriteString("\n")
					}
					b.WriteString(c.head)
					fmt.Fprintf(&b, "case %s\n", c.name)
					for _, l := range c.cmds {
						b.WriteString(l + "\n")
					}
					b.WriteString("----\n" + c.want)
				}
				if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

type testCase struct {
	head string // comment lines before "case"
	name string
	cmds []string
	want string
}

func parseCases(t *testing.T, file string) []testCase {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cases []testCase
	var cur *testCase
	var head strings.Builder
	inWant := false
	for _, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, "case "):
			cases = append(cases, testCase{head: head.String(), name: strings.TrimPrefix(line, "case ")})
			head.Reset()
			cur, inWant = &cases[len(cases)-1], false
		case cur == nil:
			head.WriteString(line + "\n")
		case line == "----" && !inWant:
			inWant = true
		case inWant:
			cur.want += line + "\n"
		default:
			cur.cmds = append(cur.cmds, line)
		}
	}
	// Blank lines and comments after a case's output belong to the next
	// case's head.
	for i := range cases {
		w := cases[i].want
		lines := strings.Split(strings.TrimRight(w, "\n"), "\n")
		j := len(lines)
		for j > 0 && (lines[j-1] == "" || strings.HasPrefix(lines[j-1], "#")) {
			j--
		}
		if j < len(lines) && i+1 < len(cases) {
			cases[i+1].head = strings.Join(lines[j:], "\n") + "\n" + cases[i+1].head
			cases[i+1].head = strings.TrimLeft(cases[i+1].head, "\n")
		}
		if j > 0 {
			cases[i].want = strings.Join(lines[:j], "\n") + "\n"
		} else {
			cases[i].want = ""
		}
	}
	return cases
}

type runner struct {
	t       *testing.T
	out     strings.Builder
	n       int
	regions []string
	items   []buckets.Item
	cap     int64
	ex      *Executor
	fc      *fakeComm
	bufs    map[string][]float32
	gr      *GraphRunner
	graph   []string
}

func runCase(t *testing.T, cmds []string) string {
	r := &runner{t: t, n: 2, bufs: map[string][]float32{}}
	defer func() {
		if r.ex != nil {
			_ = r.ex.Close()
		}
		if r.gr != nil {
			_ = r.gr.Close()
		}
	}()
	ctx := context.Background()
	inGraph := false
	for _, line := range cmds {
		if inGraph {
			if line == "end" {
				inGraph = false
			} else {
				r.graph = append(r.graph, line)
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		fmt.Fprintf(&r.out, "> %s\n", line)
		var err error
		switch f[0] {
		case "ranks":
			r.n = atoi(t, f[1])
		case "regions":
			r.regions = f[1:]
		case "cap":
			r.cap = int64(atoi(t, f[1]))
		case "item":
			it := buckets.Item{Tensor: f[1], Bytes: int64(atoi(t, f[2])), Group: "g", Op: buckets.Op(f[3]), DType: "f32",
				Direction: buckets.Direction(f[4]), Region: f[5]}
			if f[4] == "-" {
				it.Direction, it.Region = buckets.None, ""
			}
			for _, kv := range f[6:] {
				if v, ok := strings.CutPrefix(kv, "out="); ok {
					it.Out = v
				}
			}
			r.items = append(r.items, it)
		case "new":
			err = r.newExecutor(f[1:])
		case "graph":
			inGraph = true
		case "rungraph":
			err = r.runGraph(ctx, f[1:])
		case "begin":
			err = r.ex.Begin(atoi(t, f[1]))
		case "compute":
			err = r.ex.Compute(ctx, f[1], "", func() error { return nil })
		case "ready":
			err = r.ready(ctx, f[1])
		case "wait":
			if err = r.ex.Wait(ctx, f[1]); err == nil {
				fmt.Fprintf(&r.out, "%s = %v\n", f[1], r.bufs[f[1]])
			}
		case "endregion":
			err = r.ex.EndRegion(ctx, f[1])
		case "finish":
			var m StepMetrics
			if m, err = r.ex.Finish(ctx); err == nil {
				fmt.Fprintf(&r.out, "finished: %d collectives, %d bytes\n", m.Collectives, m.Bytes)
			}
		default:
			t.Fatalf("unknown command %q", line)
		}
		if err != nil {
			fmt.Fprintf(&r.out, "error: %v\n", err)
			var ie *IncompleteError
			var pe *PlanMismatchError
			switch {
			case errors.As(err, &ie):
				fmt.Fprintf(&r.out, "  (IncompleteError missing %v)\n", ie.Missing)
			case errors.As(err, &pe):
				fmt.Fprintf(&r.out, "  (PlanMismatchError others %v)\n", pe.Others)
			}
		}
	}
	return r.out.String()
}

func atoi(t *testing.T, s string) int {
	v, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("bad number %q", s)
	}
	return v
}

func (r *runner) config(args []string) Config {
	cfg := DefaultConfig()
	for _, a := range args {
		switch {
		case a == "mode=native":
			cfg.Mode = Native
		case a == "mode=grouped":
			cfg.Mode = Grouped
		case a == "mode=serial":
			cfg.Mode = Serial
		case a == "flush":
			cfg.FlushPartial = true
		case a == "peerhash":
			r.fc.peerHash = 0x1234
		default:
			r.t.Fatalf("unknown option %q", a)
		}
	}
	return cfg
}

func (r *runner) newExecutor(args []string) error {
	r.fc = newFakeComm(0, r.n, newFakeClock(), &r.out)
	cfg := r.config(args)
	bc := buckets.DefaultConfig()
	bc.CapBytes = r.cap
	p, err := buckets.Assign(r.items, r.regions, bc)
	if err != nil {
		return err
	}
	r.out.WriteString(p.String())
	r.ex, err = New(p, map[string]Comm{"g": r.fc}, cfg)
	return err
}

// ready fills tensor T with its item number and hands it in.
func (r *runner) ready(ctx context.Context, name string) error {
	for i, it := range r.items {
		if it.Tensor != name {
			continue
		}
		in := make([]float32, it.Bytes/4)
		for j := range in {
			in[j] = float32(i + 1)
		}
		out := in
		outName := it.Out
		if outName == "" {
			outName = it.Tensor
		}
		switch it.Op {
		case buckets.AllGather:
			out = make([]float32, len(in)*r.n)
		case buckets.ReduceScatter:
			out = make([]float32, len(in)/r.n)
		}
		r.bufs[outName] = out
		return r.ex.Ready(ctx, name, comm.Float32s(in), comm.Float32s(out))
	}
	return r.ex.Ready(ctx, name, comm.Float32s(make([]float32, 1)), comm.Float32s(make([]float32, 1)))
}

// runGraph builds the graph from its text form and runs one step; every
// tensor is a float32 buffer of its declared or member size, inputs filled
// with 1.
func (r *runner) runGraph(ctx context.Context, args []string) error {
	g, err := stepgraph.Parse(strings.Join(r.graph, "\n"))
	if err != nil {
		return err
	}
	r.fc = newFakeComm(0, r.n, newFakeClock(), &r.out)
	cfg := r.config(args)
	cfg.Trace = true // the compute track shows where waits were taken
	comms := map[string]Comm{}
	for _, gr := range g.Groups {
		comms[gr.Name] = r.fc
	}
	gr, err := NewGraphRunner(g, comms, cfg)
	if err != nil {
		return err
	}
	r.gr = gr
	r.out.WriteString(gr.Executor().Plan().String())
	size := map[string]int64{}
	for _, tn := range g.Tensors {
		size[tn.Name] = tn.Bytes
	}
	for _, nd := range g.Nodes {
		for _, m := range nd.Members {
			size[m.In] = m.Bytes
			switch nd.Op {
			case buckets.AllGather:
				size[m.Out] = m.Bytes * int64(r.n)
			case buckets.ReduceScatter:
				size[m.Out] = m.Bytes / int64(r.n)
			default:
				size[m.Out] = m.Bytes
			}
		}
	}
	tensors := func(name string) (comm.Buffer, error) {
		b, ok := r.bufs[name]
		if !ok {
			b = make([]float32, max(size[name]/4, 1))
			for j := range b {
				b[j] = 1
			}
			r.bufs[name] = b
		}
		return comm.Float32s(b), nil
	}
	kernel := func(_ context.Context, n *stepgraph.Node) error {
		fmt.Fprintf(&r.out, "compute %s reads %v\n", n.Name, n.Reads)
		for _, w := range n.Writes {
			b, _ := tensors(w)
			for j, v := range comm.AsFloat32(b) {
				comm.AsFloat32(b)[j] = v + 1
			}
		}
		return nil
	}
	m, err := gr.Step(ctx, 0, tensors, kernel)
	if err == nil {
		fmt.Fprintf(&r.out, "finished: %d collectives, %d bytes\n", m.Collectives, m.Bytes)
		var track []string
		for _, e := range gr.Executor().Timeline().Trace().TraceEvents {
			if e.Cat == "compute" || e.Cat == "wait" {
				track = append(track, e.Name)
			}
		}
		fmt.Fprintf(&r.out, "compute track: %s\n", strings.Join(track, ", "))
	}
	return err
}
