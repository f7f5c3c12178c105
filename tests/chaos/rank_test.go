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
// Output: "chaos-result rank R iters N sum S longest MS ms" on success,
// "chaos-error rank R: ERR" (exit 6) on a failed call.
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

// runRank is a chaos rank: it sets up the fault its row asks for before
// the world forms (beforeInit), joins the world, runs the collectives of
// every iteration (iterate) until the ranks agree to stop, and prints its
// result. Any error ends it with exit 6, after printing it.
func runRank() int {
	world := os.Getenv("GORUN_RESTART_COUNT")
	k := &chaosRank{me: envInt("RANK", -1), victim: envInt(chaosVictim, -1), phase: os.Getenv(chaosPhase), firstWorld: world == "" || world == "0"}
	k.armed = k.me == k.victim && k.firstWorld
	ctx := context.Background()
	opts := grank.DefaultOptions()
	attached := k.beforeInit()
	start := time.Now() // chaosRun counts from here, formation included
	opts.Rendezvous = func(c *rendezvous.Config) { c.Attached = attached }
	// Warnings (the stall diagnosis, the flight recorder) go to stderr,
	// where a row looks for them.
	opts.Logger = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, NoColor: true, TimeFormat: "15:04:05.000"}).
		Level(zerolog.WarnLevel).With().Timestamp().Logger()
	r, err := grank.Init(ctx, opts)
	if err != nil {
		fmt.Printf("chaos-error rank %d: init: %v\n", k.me, err)
		return 6
	}
	iters, sum, longest, err := k.iterate(ctx, r, start)
	if err != nil {
		fmt.Printf("chaos-error rank %d: %v\n", k.me, err)
		r.Abort(err)
		_ = r.Close()
		return 6
	}
	if k.at("shutdown") {
		k.fault()
	}
	if err := r.Close(); err != nil {
		fmt.Printf("chaos-error rank %d: close: %v\n", k.me, err)
		return 6
	}
	fmt.Printf("chaos-result rank %d iters %d sum %v longest %d ms\n", k.me, iters, sum, longest.Milliseconds())
	return 0
}

// chaosRank is one chaos rank's part in its row: who it is, the victim,
// and the phase the victim's fault is for.
type chaosRank struct {
	me, victim int
	phase      string
	firstWorld bool // the job's first world: faults fire only there
	armed      bool // this rank is the victim, in the first world
}

// at reports whether this rank is the victim and its fault is due at p.
func (k *chaosRank) at(p string) bool { return k.armed && k.phase == p }

// fault is the victim's own fault (selfFault).
func (k *chaosRank) fault() { selfFault(k.me) }

// beforeInit fires or arms the faults of the phases before the world
// forms (launch, formation, attached) and returns the rendezvous's
// Attached hook (nil when none).
func (k *chaosRank) beforeInit() func() {
	me, victim, phase, firstWorld := k.me, k.victim, k.phase, k.firstWorld
	if k.at("launch") {
		k.fault()
	}
	if k.at("formation") {
		go func() { // ends with the process
			time.Sleep(20 * time.Millisecond)
			k.fault()
		}()
	}
	if phase == "formation" && me != victim && firstWorld {
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
	if phase == "attached" && firstWorld && me == 1 {
		select {} // ended by the job's teardown
	}
	switch {
	case k.at("attached") && me != 0:
		return k.fault
	case phase == "attached" && firstWorld && me == 2 && victim == 0:
		return func() { _ = os.WriteFile(marker, nil, 0o600) }
	case k.at("attached"):
		go func() { // ends with the process
			for {
				if os.Remove(marker) == nil {
					k.fault()
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	return nil
}

// chaosBufs are an iteration's buffers: one element, a vote on going on,
// a large vector and a flush of eight buckets.
type chaosBufs struct {
	small, vote, large []float64
	buckets            [][]float64
}

// fill sets b to this rank's contribution for base.
func (k *chaosRank) fill(b []float64, base float64) {
	for i := range b {
		b[i] = float64(k.me) + base + float64(i%7)
	}
}

// check compares an all-reduced sum over n ranks of fill's values.
func check(what string, got []float64, base float64, n int) error {
	tri := float64(n * (n - 1) / 2) // sum of the ranks
	for i, v := range got {
		if want := tri + float64(n)*(base+float64(i%7)); v != want {
			return fmt.Errorf("WRONG RESULT in %s: element %d = %v, want %v", what, i, v, want)
		}
	}
	return nil
}

// iterate runs iterations of collectives until every rank voted to stop
// (after chaosIters iterations and chaosRun since start at least), firing the
// victim's fault in its phase at iteration faultIter, and returns how many
// ran, a checksum, and the longest iteration (how long a slowed peer held
// this rank).
func (k *chaosRank) iterate(ctx context.Context, r *grank.Rank, start time.Time) (iters int, sum float64, longest time.Duration, err error) {
	run, _ := time.ParseDuration(os.Getenv(chaosRun))
	c := r.Comm()
	b := chaosBufs{small: make([]float64, 1), vote: make([]float64, 1), large: make([]float64, 1<<17), buckets: make([][]float64, 8)}
	for i := range b.buckets {
		b.buckets[i] = make([]float64, 4096)
	}
	for it := 0; ; it++ {
		t0 := time.Now()
		if err := k.collectives(ctx, c, it, b); err != nil {
			return 0, 0, 0, err
		}
		sum += b.large[len(b.large)-1]
		// Go on while any rank wants to: the ranks agree through the sum.
		b.vote[0] = 0
		if it+1 < chaosIters || time.Since(start) < run {
			b.vote[0] = 1
		}
		if err := c.AllReduce(ctx, comm.Float64s(b.vote), comm.Float64s(b.vote), comm.Sum).Wait(ctx); err != nil {
			return 0, 0, 0, err
		}
		longest = max(longest, time.Since(t0))
		// One step per iteration: after-steps= faults (signals and the
		// data plane's) key to it.
		r.ReportStep(it + 1)
		if it == 0 {
			// The harness keys faults made from outside (iptables) to
			// this line from every rank: the world is formed and running.
			fmt.Printf("chaos-progress rank %d iter 1\n", k.me)
		}
		if b.vote[0] == 0 {
			return it + 1, sum, longest, nil
		}
	}
}

// collectives is iteration it's calls, each result checked: a small
// all-reduce, a large one, a barrier and a flush of buckets, with the
// victim's fault at iteration faultIter in the phase of its row.
func (k *chaosRank) collectives(ctx context.Context, c comm.Communicator, it int, b chaosBufs) error {
	n := c.Size()
	base := float64(it)
	if it == faultIter && k.at("small") {
		if os.Getenv(chaosFault) == "desync" {
			// A different call where the others all-reduce.
			if err := c.Barrier(ctx).Wait(ctx); err != nil {
				return err
			}
			return errors.New("the desynced barrier succeeded")
		}
		k.fault()
	}
	k.fill(b.small, base)
	if err := c.AllReduce(ctx, comm.Float64s(b.small), comm.Float64s(b.small), comm.Sum).Wait(ctx); err != nil {
		return err
	}
	if err := check("small", b.small, base, n); err != nil {
		return err
	}
	k.fill(b.large, base)
	h := c.AllReduce(ctx, comm.Float64s(b.large), comm.Float64s(b.large), comm.Sum)
	if it == faultIter && k.at("large") {
		time.Sleep(time.Millisecond)
		k.fault()
	}
	if err := h.Wait(ctx); err != nil {
		return err
	}
	if err := check("large", b.large, base, n); err != nil {
		return err
	}
	if it == faultIter && k.at("barrier") {
		k.fault()
	}
	if err := c.Barrier(ctx).Wait(ctx); err != nil {
		return err
	}
	hs := make([]comm.Handle, len(b.buckets))
	for i, bk := range b.buckets {
		k.fill(bk, base+float64(i))
		hs[i] = c.AllReduce(ctx, comm.Float64s(bk), comm.Float64s(bk), comm.Sum)
	}
	if it == faultIter && k.at("bucket") {
		time.Sleep(time.Millisecond)
		k.fault()
	}
	for i, h := range hs {
		if err := h.Wait(ctx); err != nil {
			return err
		}
		if err := check("bucket", b.buckets[i], base+float64(i), n); err != nil {
			return err
		}
	}
	return nil
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
