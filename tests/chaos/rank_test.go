package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/ft"
	grank "github.com/gorun-hpc/gorun/rank"
	"github.com/gorun-hpc/gorun/rendezvous"
)

// The rank program. A process started with rankEnv set runs it instead of
// the tests. Every iteration runs the phases in order, checking every
// result element:
//
//	small    an 8-byte all-reduce (which also carries the "go on" vote)
//	large    a 1 MiB all-reduce
//	barrier  a barrier
//	bucket   eight 32 KiB all-reduces issued at once, then waited (a flush)
//
// The victim (chaosVictim) injects its own fault (chaosFault: kill, stop,
// hang: block for ever without being stopped, desync: at phase small
// only, call a barrier where the others all-reduce, or pmi-junk: at phase
// launch only, write junk to its PMI_FD and wait for the server's answer
// and end) at chaosPhase, in the first world only, so that a phase is hit
// exactly rather than by timing:
//
//	launch     before Init
//	formation  20 ms into Init (while it joins the rendezvous)
//	attached   once attached to its host leader, before the world formed
//	           (rank 1 holds formation back; see runRank)
//	small, barrier        just before the victim's call of iteration 3
//	large, bucket         1 ms after the victim issued it (mid-transfer)
//	shutdown   after the last call, before Close
//
// Faults gorun injects by time (slow, drop, delay, corrupt, partition)
// use phase "loop", and by step (after-steps=) "steps": the ranks go on
// until chaosRun has passed, reporting one step per iteration.
//
// Output: "chaos-result rank R iters N sum S longest MS ms" on success, "chaos-error
// rank R: ERR" (exit 6) on a failed call.
const (
	rankEnv     = "GORUN_CHAOS_RANK"
	chaosVictim = "GORUN_CHAOS_VICTIM"
	chaosFault  = "GORUN_CHAOS_FAULT"
	chaosPhase  = "GORUN_CHAOS_PHASE"
	chaosRun    = "GORUN_CHAOS_RUN" // a duration: how long the loop lasts at least
	chaosIters  = 6                 // iterations at least
	faultIter   = 3
)

func maybeRank() {
	if os.Getenv(rankEnv) == "" {
		return
	}
	if os.Getenv(ft.AddrEnv) != "" {
		os.Exit(runFTRank()) // gorun --fault-tolerant (ftrank_test.go)
	}
	os.Exit(runRank())
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func runRank() int {
	me := envInt("RANK", -1)
	victim := envInt(chaosVictim, -1)
	world := os.Getenv("GORUN_RESTART_COUNT")
	armed := me == victim && (world == "" || world == "0")
	phase := os.Getenv(chaosPhase)
	fault := func() { selfFault(me) }
	at := func(p string) bool { return armed && phase == p }
	if at("launch") {
		fault()
	}
	if at("formation") {
		go func() { // ends with the process
			time.Sleep(20 * time.Millisecond)
			fault()
		}()
	}
	if phase == "formation" && me != victim && (world == "" || world == "0") {
		// The others join 200 ms late, so the world cannot form before
		// the victim's fault: a job that formed, ran and ended within
		// 20 ms (seen under a PID namespace) would otherwise complete
		// before it.
		time.Sleep(200 * time.Millisecond)
	}
	// attached: the world must not form while the victim is attached
	// and frozen, so rank 1 (the holder, never the victim) does not join
	// in the first world: it waits to be ended, as a rank hung before
	// Init would. The victim freezes on the event of its attaching (the
	// rendezvous's Attached hook); a victim that is the host leader
	// (rank 0) freezes when rank 2 attached to it, told by a marker file
	// rank 2 writes from its hook.
	marker := filepath.Join(os.TempDir(), "chaos-attached")
	firstWorld := world == "" || world == "0"
	if phase == "attached" && firstWorld && me == 1 {
		select {} // ended by the job's teardown
	}
	var attached func()
	switch {
	case at("attached") && me != 0:
		attached = fault
	case phase == "attached" && firstWorld && me == 2 && victim == 0:
		attached = func() { _ = os.WriteFile(marker, nil, 0o600) }
	case at("attached"):
		go func() { // ends with the process
			for {
				if os.Remove(marker) == nil {
					fault()
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	run, _ := time.ParseDuration(os.Getenv(chaosRun))
	start := time.Now()
	ctx := context.Background()
	opts := grank.DefaultOptions()
	opts.Rendezvous = func(c *rendezvous.Config) { c.Attached = attached }
	// Warnings (the stall diagnosis, the flight recorder) go to stderr,
	// where a row looks for them.
	opts.Logger = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, NoColor: true, TimeFormat: "15:04:05.000"}).
		Level(zerolog.WarnLevel).With().Timestamp().Logger()
	r, err := grank.Init(ctx, opts)
	if err != nil {
		fmt.Printf("chaos-error rank %d: init: %v\n", me, err)
		return 6
	}
	c := r.Comm()
	n := c.Size()
	fail := func(err error) int {
		fmt.Printf("chaos-error rank %d: %v\n", me, err)
		r.Abort(err)
		_ = r.Close()
		return 6
	}
	tri := float64(n * (n - 1) / 2) // sum of the ranks
	check := func(what string, got []float64, base float64) error {
		for i, v := range got {
			if want := tri + float64(n)*(base+float64(i%7)); v != want {
				return fmt.Errorf("WRONG RESULT in %s: element %d = %v, want %v", what, i, v, want)
			}
		}
		return nil
	}
	fill := func(b []float64, base float64) {
		for i := range b {
			b[i] = float64(me) + base + float64(i%7)
		}
	}
	small := make([]float64, 1)
	vote := make([]float64, 1)
	large := make([]float64, 1<<17)
	buckets := make([][]float64, 8)
	for i := range buckets {
		buckets[i] = make([]float64, 4096)
	}
	var sum float64
	var longest time.Duration // the longest iteration: how long a slowed peer held this rank
	it := 0
	for ; ; it++ {
		t0 := time.Now()
		base := float64(it)
		// small, with the vote on going on folded in as a second call of
		// the same size class.
		if it == faultIter && at("small") {
			if os.Getenv(chaosFault) == "desync" {
				// A different call where the others all-reduce.
				if err := c.Barrier(ctx).Wait(ctx); err != nil {
					return fail(err)
				}
				return fail(errors.New("the desynced barrier succeeded"))
			}
			fault()
		}
		fill(small, base)
		if err := c.AllReduce(ctx, comm.Float64s(small), comm.Float64s(small), comm.Sum).Wait(ctx); err != nil {
			return fail(err)
		}
		if err := check("small", small, base); err != nil {
			return fail(err)
		}
		// large
		fill(large, base)
		h := c.AllReduce(ctx, comm.Float64s(large), comm.Float64s(large), comm.Sum)
		if it == faultIter && at("large") {
			time.Sleep(time.Millisecond)
			fault()
		}
		if err := h.Wait(ctx); err != nil {
			return fail(err)
		}
		if err := check("large", large, base); err != nil {
			return fail(err)
		}
		sum += large[len(large)-1]
		// barrier
		if it == faultIter && at("barrier") {
			fault()
		}
		if err := c.Barrier(ctx).Wait(ctx); err != nil {
			return fail(err)
		}
		// bucket flush
		hs := make([]comm.Handle, len(buckets))
		for i, b := range buckets {
			fill(b, base+float64(i))
			hs[i] = c.AllReduce(ctx, comm.Float64s(b), comm.Float64s(b), comm.Sum)
		}
		if it == faultIter && at("bucket") {
			time.Sleep(time.Millisecond)
			fault()
		}
		for i, h := range hs {
			if err := h.Wait(ctx); err != nil {
				return fail(err)
			}
			if err := check("bucket", buckets[i], base+float64(i)); err != nil {
				return fail(err)
			}
		}
		// Go on while any rank wants to: the ranks agree through the sum.
		vote[0] = 0
		if it+1 < chaosIters || time.Since(start) < run {
			vote[0] = 1
		}
		if err := c.AllReduce(ctx, comm.Float64s(vote), comm.Float64s(vote), comm.Sum).Wait(ctx); err != nil {
			return fail(err)
		}
		longest = max(longest, time.Since(t0))
		// One step per iteration: after-steps= faults (signals and the
		// data plane's) key to it.
		r.ReportStep(it + 1)
		if it == 0 {
			// The harness keys faults made from outside (iptables) to
			// this line from every rank: the world is formed and running.
			fmt.Printf("chaos-progress rank %d iter 1\n", me)
		}
		if vote[0] == 0 {
			break
		}
	}
	if at("shutdown") {
		fault()
	}
	if err := r.Close(); err != nil {
		fmt.Printf("chaos-error rank %d: close: %v\n", me, err)
		return 6
	}
	fmt.Printf("chaos-result rank %d iters %d sum %v longest %d ms\n", me, it+1, sum, longest.Milliseconds())
	return 0
}

// selfFault is the victim's own fault of chaosFault (see above; desync is
// runRank's, at its call).
func selfFault(me int) {
	switch os.Getenv(chaosFault) {
	case "kill":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	case "stop":
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	case "hang":
		select {} // running, not stopped: ended by the job's teardown
	case "pmi-junk":
		os.Exit(pmiJunk(me))
	}
}

// pmiJunk writes junk to the rank's PMI_FD, as a rank with a broken PMI
// client would, reads until the server ends the connection, and fails
// with what the server said. A server that stops reading but keeps the
// connection leaves it blocked here: a hang the row's bound catches.
func pmiJunk(me int) int {
	fd, err := strconv.Atoi(os.Getenv("PMI_FD"))
	if err != nil {
		fmt.Printf("chaos-error rank %d: no PMI_FD to write junk to: %v\n", me, err)
		return 6
	}
	f := os.NewFile(uintptr(fd), "pmi")
	if _, err := f.Write([]byte("\x00\x01\xfe not PMI at all\n")); err != nil {
		fmt.Printf("chaos-error rank %d: writing junk to PMI_FD: %v\n", me, err)
		return 6
	}
	reply, err := io.ReadAll(f)
	fmt.Printf("chaos-error rank %d: the PMI server answered junk with %q and ended the connection (%v)\n", me, strings.TrimSpace(string(reply)), err)
	return 6
}
