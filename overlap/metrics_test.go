package overlap

import (
	"bytes"
	"context"
	"errors"
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

// untimedComm hands out the fake's handles without their CompletedAt, as
// a backend that cannot say when a call completed: the executor's watcher
// goroutines must time those.
type untimedComm struct{ *fakeComm }

type untimedHandle struct{ Handle }

func (u untimedComm) AllReduce(ctx context.Context, send, recv comm.Buffer, op comm.Op) Handle {
	return untimedHandle{u.fakeComm.AllReduce(ctx, send, recv, op)}
}

// TestMetricsAndTimeline drives one step on a fake clock: bucket a is
// issued at 0 and completes at 4 ms inside a 10 ms compute (hidden); bucket b
// is issued at 10 ms and the program waits 3 ms for it (exposed). Handles
// that know their completion time and handles timed by the watchers give
// the same metrics and timeline.
func TestMetricsAndTimeline(t *testing.T) {
	for _, timed := range []bool{true, false} {
		t.Run(map[bool]string{true: "timed", false: "watched"}[timed], func(t *testing.T) { metricsAndTimeline(t, timed) })
	}
}

func metricsAndTimeline(t *testing.T, timed bool) {
	clock := newFakeClock()
	fc := newFakeComm(0, 2, clock, nil)
	fc.hold = true
	cfg := DefaultConfig()
	cfg.Clock, cfg.CheckPlan, cfg.Trace = clock, false, true
	var cm Comm = fc
	if !timed {
		cm = untimedComm{fc}
	}
	ex, err := New(twoBucketPlan(t), map[string]Comm{"g": cm}, cfg)
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
		// Waits so far: Finish on b (the group's last, waited for
		// first), and, untimed, the watchers on a and b. Once Finish
		// blocks on b, 3 ms pass and b completes.
		if timed {
			fc.awaitWaits(1)
		} else {
			fc.awaitWaits(3)
		}
		clock.Advance(3 * time.Millisecond)
		fc.release()
	})
	m, err := ex.Finish(ctx)
	wg.Wait()
	must(err)
	want := StepMetrics{Step: 7, Time: 13 * time.Millisecond, Compute: 10 * time.Millisecond,
		Comm: 7 * time.Millisecond, Exposed: 3 * time.Millisecond, Collectives: 2, Bytes: 16}
	if !timed {
		// A watcher stamps a's completion when it wakes, which on the
		// fake clock is anywhere from its release (4 ms) to the end of
		// the compute (10 ms): Comm is 7 to 13 ms.
		if m.Comm < 7*time.Millisecond || m.Comm > 13*time.Millisecond {
			t.Fatalf("comm %v, want 7 to 13 ms", m.Comm)
		}
		want.Comm = m.Comm
	}
	if m != want {
		t.Fatalf("metrics\n got %v\nwant %v", m, want)
	}
	if f := m.ExposedFraction(); timed && (f < 0.428 || f > 0.429) {
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
		func(c *Config) { c.MinProcs = -1 },
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

// TestReadyTwice: a tensor handed in again in a step where the plan sends
// it once is refused, naming the tensor, and its first place keeps the
// first buffer handed in.
func TestReadyTwice(t *testing.T) {
	fc := newFakeComm(0, 2, newFakeClock(), nil)
	fc.hold = true
	cfg := DefaultConfig()
	cfg.CheckPlan = false
	// Bucket a waits for nothing; b is held so that a second Ready of b
	// finds b's bucket open.
	ex, err := New(twoBucketPlan(t), map[string]Comm{"g": fc}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	ctx := context.Background()
	b1, b2 := make([]float32, 2), make([]float32, 2)
	if err := ex.Begin(0); err != nil {
		t.Fatal(err)
	}
	if err := ex.Ready(ctx, "b", comm.Float32s(b1), comm.Float32s(b1)); err != nil {
		t.Fatal(err)
	}
	err = ex.Ready(ctx, "b", comm.Float32s(b2), comm.Float32s(b2))
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), `"b" handed in more often`) {
		t.Fatalf("second Ready of b: %v, want a usage error naming b", err)
	}
}
