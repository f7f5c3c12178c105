package overlap

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// TestStepEndsMemoryAccounting: an output no compute reads (a result of
// the step, such as a reduced gradient) stays with the program — the
// release hook is not called for it — but the timeline's collective
// memory counter returns to zero when the step ends, on every step, so a
// trace reader sees no memory held across steps that the runner no
// longer owns.
func TestStepEndsMemoryAccounting(t *testing.T) {
	// fourGathers with the last block's gathered parameter never read.
	g, err := stepgraph.Parse(strings.Replace(fourGathers, "reads=W3,x2", "reads=x2", 1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := commtest.StartComms(ctx, t, 1, comm.LocalConfig())[0]
	cfg := DefaultConfig()
	cfg.CheckPlan, cfg.Trace, cfg.PrefetchStarts = false, true, 0
	gr, err := NewGraphRunner(g, map[string]Comm{"g": c}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer gr.Close()
	bufs := map[string][]float32{}
	for _, k := range []string{"w0", "w1", "w2", "w3", "W0", "W1", "W2", "W3"} {
		bufs[k] = make([]float32, 4)
	}
	for _, k := range []string{"x0", "x1", "x2", "x3"} {
		bufs[k] = make([]float32, 1)
	}
	var released []string
	gr.SetRelease(func(name string) { released = append(released, name) })
	tensors := func(name string) (comm.Buffer, error) { return comm.Float32s(bufs[name]), nil }
	kernel := func(context.Context, *stepgraph.Node) error { return nil }
	for step := 1; step <= 2; step++ {
		released = nil
		m, err := gr.Step(ctx, step, tensors, kernel)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(released, " "); got != "W0 W1 W2" {
			t.Errorf("step %d: released %q, want the three read parameters (W3 is the step's result)", step, got)
		}
		if m.PeakBytes != 16 {
			t.Errorf("step %d: peak %d bytes, want 16 (one gathered parameter at a time, at plan positions)", step, m.PeakBytes)
		}
		var last any
		for _, e := range gr.ex.Timeline().Trace().TraceEvents {
			if e.Name == "collective memory" {
				last = e.Args["bytes"]
			}
		}
		if last != int64(0) {
			t.Errorf("step %d: the collective memory counter ends the step at %v bytes, want 0", step, last)
		}
	}
}
