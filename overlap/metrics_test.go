package overlap

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
)

func twoBucketPlan(t *testing.T) *buckets.Plan {
	t.Helper()
	cfg := buckets.DefaultConfig()
	cfg.CapBytes = 8
	p, err := buckets.Assign([]buckets.Item{
		{Tensor: "a", Bytes: 8, Group: "g", Op: buckets.AllReduce, DType: "f32", Direction: buckets.Backward, Region: "l1"},
		{Tensor: "b", Bytes: 8, Group: "g", Op: buckets.AllReduce, DType: "f32", Direction: buckets.Backward, Region: "l0"},
	}, []string{"l0", "l1"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMetricsAndTimeline drives one step on a fake clock: bucket a is
// issued at 0 and completes at 4 ms inside a 10 ms compute (hidden); bucket b
// is issued at 10 ms and the program waits 3 ms for it (exposed).
func TestMetricsAndTimeline(t *testing.T) {
	clock := newFakeClock()
	fc := newFakeComm(0, 2, clock, nil)
	fc.hold = true
	cfg := DefaultConfig()
	cfg.Clock, cfg.CheckPlan, cfg.Trace = clock, false, true
	ex, err := New(twoBucketPlan(t), map[string]Comm{"g": fc}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	ctx := context.Background()
	a, b := make([]float32, 2), make([]float32, 2)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ex.Begin(7))
	must(ex.Ready(ctx, "a", comm.Float32s(a), comm.Float32s(a)))
	must(ex.Compute(ctx, "backward l0", "l0", func() error {
		clock.Advance(4 * time.Millisecond)
		fc.release()
		clock.Advance(6 * time.Millisecond)
		return nil
	}))
	must(ex.Ready(ctx, "b", comm.Float32s(b), comm.Float32s(b)))
	var wg sync.WaitGroup
	wg.Go(func() {
		// Waits so far: the watcher on a, the watcher on b, Finish on b
		// (the group's last, waited for first). Once Finish blocks on b,
		// 3 ms pass and b completes.
		fc.awaitWaits(3)
		clock.Advance(3 * time.Millisecond)
		fc.release()
	})
	m, err := ex.Finish(ctx)
	wg.Wait()
	must(err)
	want := StepMetrics{Step: 7, Time: 13 * time.Millisecond, Compute: 10 * time.Millisecond,
		Comm: 7 * time.Millisecond, Exposed: 3 * time.Millisecond, Collectives: 2, Bytes: 16}
	if m != want {
		t.Fatalf("metrics\n got %v\nwant %v", m, want)
	}
	if f := m.ExposedFraction(); f < 0.428 || f > 0.429 {
		t.Errorf("exposed fraction %v, want 3/7", f)
	}

	tr := ex.Timeline().Trace()
	var names []string
	for _, e := range tr.TraceEvents {
		if e.Ph != "M" {
			names = append(names, e.Ph+":"+e.Name)
		}
	}
	got := strings.Join(names, " ")
	wantEv := "X:backward l0 X:wait g/backward/l0/1 X:wait g/backward/l1/0 X:g/backward/l1/0 b:g/backward/l1/0 e:g/backward/l1/0 X:g/backward/l0/1 b:g/backward/l0/1 e:g/backward/l0/1 X:step 7"
	if got != wantEv {
		t.Errorf("events\n got %s\nwant %s", got, wantEv)
	}

	// Round trip and merge with a second rank's trace.
	var buf bytes.Buffer
	if _, err := ex.Timeline().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	r0, err := ReadTrace(&buf)
	must(err)
	r1 := r0
	r1.TraceEvents = append([]Event(nil), r0.TraceEvents...)
	for i := range r1.TraceEvents {
		r1.TraceEvents[i].PID = 1
		r1.TraceEvents[i].TS += 500
	}
	var merged bytes.Buffer
	must(MergeTraces(&merged, r0, r1))
	m2, err := ReadTrace(&merged)
	must(err)
	if len(m2.TraceEvents) != 2*len(r0.TraceEvents) {
		t.Fatalf("merged %d events, want %d", len(m2.TraceEvents), 2*len(r0.TraceEvents))
	}
	seenData := false
	for i, e := range m2.TraceEvents {
		if e.Ph == "M" && seenData {
			t.Fatalf("metadata event %d after data events", i)
		}
		if e.Ph != "M" {
			seenData = true
			if i > 0 && m2.TraceEvents[i-1].Ph != "M" && m2.TraceEvents[i-1].TS > e.TS {
				t.Fatalf("merged events out of time order at %d", i)
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []func(*Config){
		func(c *Config) { c.Mode = 9 },
		func(c *Config) { c.TraceLimit = -1 },
		func(c *Config) { c.Clock = nil },
	} {
		cfg := DefaultConfig()
		c(&cfg)
		if err := cfg.Validate(); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := New(twoBucketPlan(t), map[string]Comm{}, DefaultConfig()); err == nil {
		t.Fatal("New without the group's communicator: no error")
	}
}
