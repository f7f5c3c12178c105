package nccl

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ebitengine/purego"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/overlap"
)

// hooks are the stand-ins' test-only functions.
var hooks struct {
	once sync.Once
	// delayedFill queues on a stream: sleep usec, then memset(p, v, n).
	delayedFill func(s uintptr, p uintptr, v int32, n uintptr, usec int32) int32
	// injectAsyncError makes a communicator report code asynchronously
	// and hang, as a broken network link does.
	injectAsyncError func(nc uintptr, code int32)
}

func loadHooks(t *testing.T) {
	hooks.once.Do(func() {
		cu, err := purego.Dlopen(standins.CUDA, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := purego.Dlopen(standins.NCCL, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			t.Fatal(err)
		}
		purego.RegisterLibFunc(&hooks.delayedFill, cu, "standinDelayedFill")
		purego.RegisterLibFunc(&hooks.injectAsyncError, nc, "standinInjectAsyncError")
	})
}

// The communicator must not start before the compute stream's work that
// produces the send buffer: a slow "kernel" fills it 200 ms after the call
// is issued, and the result must be the filled values.
func TestCallWaitsForComputeStream(t *testing.T) {
	loadHooks(t)
	const count = 4096
	cs, _ := startComms(t, 2, testConfig())
	onAll(t, cs, func(r int, c *Comm) error {
		s, err := c.Device().NewStream()
		if err != nil {
			return err
		}
		defer c.Device().DestroyStream(s)
		send := upload(t, c, comm.Uint8, make([]float64, count))
		recv := upload(t, c, comm.Uint8, make([]float64, count))
		hooks.delayedFill(uintptr(s), send.Ptr(), int32(r+1), count, 200_000)
		if err := wait(c.AllReduce(WithStream(context.Background(), s), send, recv, comm.Sum)); err != nil {
			return err
		}
		for i, v := range download(t, recv) {
			if v != 3 {
				return errors.New("element " + itoa(i) + " = " + itoa(int(v)) + ", want 1+2: the call ran before its input was ready")
			}
		}
		return nil
	})
}

// A compute stream made to wait on a collective (StreamWait) must see its
// result, without the CPU waiting: rank 1 issues 300 ms late, and a
// count-wrong "kernel" queued on rank 0's compute stream right after
// StreamWait must find no wrong element.
func TestStreamWaitOrdersComputeAfterCollective(t *testing.T) {
	const count = 2048
	cs, _ := startComms(t, 2, testConfig())
	onAll(t, cs, func(r int, c *Comm) error {
		send := upload(t, c, comm.Float32, inputs(r, count))
		recv := upload(t, c, comm.Float32, make([]float64, count))
		want := make([]float64, count)
		for i := range want {
			want[i] = input(0, i) + input(1, i)
		}
		wantBuf := upload(t, c, comm.Float32, want)
		counter := upload(t, c, comm.Int64, []float64{0})
		if r == 1 {
			time.Sleep(300 * time.Millisecond)
		}
		h := c.AllReduce(context.Background(), send, recv, comm.Sum)
		s, err := c.Device().NewStream()
		if err != nil {
			return err
		}
		defer c.Device().DestroyStream(s)
		if err := StreamWait(h, s); err != nil {
			return err
		}
		if err := c.Device().CountWrong(s, recv, wantBuf, counter); err != nil {
			return err
		}
		if err := c.Device().Synchronize(s); err != nil {
			return err
		}
		if n := download(t, counter)[0]; n != 0 {
			return errors.New(itoa(int(n)) + " wrong elements: the compute stream did not wait for the collective")
		}
		return wait(h)
	})
}

// Calls complete in issue order: whenever a later call is seen done, every
// earlier one is done too.
func TestInOrderCompletion(t *testing.T) {
	cs, _ := startComms(t, 2, testConfig())
	onAll(t, cs, func(r int, c *Comm) error {
		var hs []comm.Handle
		for k := range 40 {
			n := 1 + (k%5)*3000
			b := upload(t, c, comm.Float32, inputs(r, n))
			hs = append(hs, c.AllReduce(context.Background(), b, b, comm.Sum))
		}
		for !hs[len(hs)-1].Done() {
			// Look at later calls first: a done one must have every
			// earlier one done when we look right after.
			for k := len(hs) - 1; k > 0; k-- {
				if hs[k].Done() {
					for j := range k {
						if !hs[j].Done() {
							return errors.New("call " + itoa(k) + " done before call " + itoa(j))
						}
					}
					break
				}
			}
		}
		return wait(hs[len(hs)-1])
	})
}

// overlap's grouped backend mode issues a bucket set as one NCCL group: one
// completion for the set, every result right.
func TestGroupBackendIssuesOneGroup(t *testing.T) {
	const count = 500
	cs, _ := startComms(t, 3, testConfig())
	onAll(t, cs, func(r int, c *Comm) error {
		a := upload(t, c, comm.Float32, inputs(r, count))
		g := upload(t, c, comm.Float32, inputs(r, count))
		gOut := upload(t, c, comm.Float32, make([]float64, 3*count))
		rs := upload(t, c, comm.Float32, inputs(r, 3*count))
		rsOut := upload(t, c, comm.Float32, make([]float64, count))
		set := []overlap.Call{
			{Bucket: "b0", Op: buckets.AllReduce, Reduce: comm.Sum, Send: a, Recv: a},
			{Bucket: "b1", Op: buckets.AllGather, Send: g, Recv: gOut},
			{Bucket: "b2", Op: buckets.ReduceScatter, Reduce: comm.Max, Send: rs, Recv: rsOut},
		}
		hs := GroupBackend{}.IssueGroup(context.Background(), c, set)
		if len(hs) != 3 || hs[0].(*Handle).ref != hs[2].(*Handle).ref {
			return errors.New("the set was not issued as one group")
		}
		for _, h := range hs {
			if err := wait(h); err != nil {
				return err
			}
		}
		ar, ag, rsv := download(t, a), download(t, gOut), download(t, rsOut)
		for i := range count {
			if want := input(0, i) + input(1, i) + input(2, i); ar[i] != want {
				return errors.New("all-reduce element " + itoa(i) + " wrong")
			}
			if want := max(input(0, r*count+i), input(1, r*count+i), input(2, r*count+i)); rsv[i] != want {
				return errors.New("reduce-scatter element " + itoa(i) + " wrong")
			}
		}
		for i := range 3 * count {
			if ag[i] != input(i/count, i%count) {
				return errors.New("all-gather element " + itoa(i) + " wrong")
			}
		}
		return nil
	})
}

// An asynchronous NCCL error (a broken link) hangs the call on the GPU; the
// watcher must turn it into an abort within a second, and a peer whose
// partner is gone fails when the rendezvous loses it, naming it.
func TestAsyncErrorAbortsAndLossFailsPeer(t *testing.T) {
	loadHooks(t)
	cs, w := startComms(t, 2, testConfig())
	ctx := context.Background()
	bufs := make([]*DeviceBuffer, 2)
	for r, c := range cs {
		bufs[r] = upload(t, c, comm.Float32, inputs(r, 1000))
	}
	cs[0].issueMu.Lock()
	hooks.injectAsyncError(cs[0].nc, int32(SystemError))
	cs[0].issueMu.Unlock()
	h0 := cs[0].AllReduce(ctx, bufs[0], bufs[0], comm.Sum)
	h1 := cs[1].AllReduce(ctx, bufs[1], bufs[1], comm.Sum)
	start := time.Now()
	err := wait(h0)
	if !errors.Is(err, comm.ErrAborted) || !strings.Contains(err.Error(), "ncclCommGetAsyncError") || !strings.Contains(err.Error(), "system error") {
		t.Fatalf("rank 0: %v, want the asynchronous error as an abort", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("rank 0 failed after %v", d)
	}
	if h1.Done() {
		t.Fatal("rank 1's call completed without rank 0")
	}
	start = time.Now()
	w.lose(0) // rank 0's process would exit; the rendezvous notices
	err = wait(h1)
	if !errors.Is(err, comm.ErrPeerLost) || !strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("rank 1: %v, want a lost peer naming rank 0", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("rank 1 failed after %v", d)
	}
	// Future calls fail at once with the same error.
	if err2 := wait(cs[1].Barrier(ctx)); !errors.Is(err2, comm.ErrPeerLost) {
		t.Fatalf("later call: %v", err2)
	}
}

// A peer lost while the others wait in a collective (it never issued it)
// fails every pending and future call, naming it, within seconds.
func TestLostPeerFailsPendingAndFutureCalls(t *testing.T) {
	cs, w := startComms(t, 3, testConfig())
	ctx := context.Background()
	var hs []comm.Handle
	for r := range 2 {
		b := upload(t, cs[r], comm.Float32, inputs(r, 100))
		hs = append(hs, cs[r].AllReduce(ctx, b, b, comm.Sum), cs[r].Barrier(ctx))
	}
	time.Sleep(100 * time.Millisecond)
	for _, h := range hs {
		if h.Done() {
			t.Fatal("a call completed without rank 2")
		}
	}
	start := time.Now()
	w.lose(2)
	for _, h := range hs {
		if err := wait(h); !errors.Is(err, comm.ErrPeerLost) || !strings.Contains(err.Error(), "rank 2") {
			t.Fatalf("pending call: %v, want a lost peer naming rank 2", err)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("failed after %v", d)
	}
	if err := wait(cs[0].Barrier(ctx)); !errors.Is(err, comm.ErrPeerLost) {
		t.Fatalf("future call: %v", err)
	}
	if err := cs[0].Close(); !errors.Is(err, comm.ErrPeerLost) {
		t.Fatalf("Close: %v, want the failure", err)
	}
}

// A peer lost after the unique id went round but before it joined the
// communicator: the others are inside ncclCommInitRankConfig, which must be
// aborted, not left to hang.
func TestLostPeerDuringInit(t *testing.T) {
	w := newMemWorld(3)
	cfg := testConfig()
	cfg.InitTimeout = 15 * time.Second // a regression fails with a timeout, not a hung test
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			c, err := New(context.Background(), memBoot{me: r, w: w}, cfg)
			if c != nil {
				c.Close()
			}
			errs[r] = err
		})
	}
	// Rank 2 takes part in the id exchange, then dies.
	if _, err := (memBoot{me: 2, w: w}).AllGather(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	w.lose(2)
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, comm.ErrPeerLost) || !strings.Contains(err.Error(), "rank 2") || !strings.Contains(err.Error(), "initializing") {
			t.Errorf("rank %d: %v, want a lost peer during init naming rank 2", r, err)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("New returned %v after the loss", d)
	}
}

// A call's cancelled context aborts the communicator (there is no taking
// back one NCCL call).
func TestCancelledCallContextAborts(t *testing.T) {
	cs, _ := startComms(t, 2, testConfig())
	b := upload(t, cs[0], comm.Float32, inputs(0, 100))
	ctx, cancel := context.WithCancel(context.Background())
	h := cs[0].AllReduce(ctx, b, b, comm.Sum) // rank 1 never joins
	cancel()
	if err := wait(h); !errors.Is(err, comm.ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want an abort caused by the cancelled context", err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
