package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/ft"
	"github.com/gorun-hpc/gorun/model"
)

// Fault-tolerant data parallelism (--mode dp --fault-tolerant, under gorun
// --fault-tolerant): every rank is a replica that holds the whole model.
// Each step starts with the quorum (package ft): the participants, and a
// heal for a replacement that starts behind. Each replica computes the
// gradient of its fixed slice of the global batch (replica k of R holds
// samples [k·n, (k+1)·n), n = batch/R, whoever participates), the
// gradients and the loss are summed over the participants in one
// all-reduce (a fixed pairwise tree: every participant gets the same
// bits), divided by the samples the participants hold (P·n: the step size
// follows the participant count), and applied only if the quorum commits
// the step. A step in which a participant died is thrown away by every
// survivor, which then goes on at the next quorum without restarting.
//
// The step runs without the step graph and its bucketing: the quorum's
// communicator changes as replicas come and go, and the graph runner is
// built over fixed communicators. In dp each region's gradient is
// all-reduced as soon as its backward wrote it (overlapping the backward
// of the regions before it, as DDP's buckets do); in hsdp the group's
// all-gathers and reduce-scatters and the one cross-group all-reduce run
// one after the other.
//
// Every replica prints "step N loss X participants P" for each committed
// step ("uncommitted" instead of the loss for one thrown away) and, at the
// end, "replica K incarnation I steps S state D" where D is a digest of
// the parameters and optimizer state: equal digests mean bitwise equal
// replicas.

// ftTrainer is one replica's training state: with replica groups
// (--mode hsdp, gorun --fault-tolerant-group S) this rank's shard of it.
type ftTrainer struct {
	m    *model.Model
	lay  *model.Layout
	ws   *model.Workspace
	opt  *model.Optimizer
	data model.Dataset
	// S is the replica group size and sk this rank's place in its group
	// (1 and 0 in plain dp). params are what this rank owns (the whole
	// model, or its shard of every region), full the gathered regions,
	// grads the local gradients (whole, padded to S shards) and gsh
	// their reduce-scattered shards (hsdp).
	S, sk  int
	params [][]float32
	full   [][]float32
	state  []*model.OptState
	grads  [][]float32
	gsh    [][]float32
	flat   []float32 // hsdp: every owned gradient, then the loss: one cross-group all-reduce
	loss   [1]float32
	in, tg []int32
	n, k   int // local samples, rank
	batch  int
}

func newFTTrainer(o options, ranks, rank, group int) (*ftTrainer, error) {
	if o.batch < ranks || o.batch%ranks != 0 {
		return nil, fmt.Errorf("trainer: --fault-tolerant: global batch %d must be a multiple of the %d ranks", o.batch, ranks)
	}
	if (o.mode == "hsdp") != (group > 1) {
		return nil, fmt.Errorf("trainer: --fault-tolerant --mode %s with replica groups of %d (gorun --fault-tolerant-group): hsdp needs groups, dp none", o.mode, group)
	}
	if o.mode == "hsdp" && o.shardSize != 0 && o.shardSize != group {
		return nil, fmt.Errorf("trainer: --shard-size %d, but gorun --fault-tolerant-group is %d: a replica group is a shard group", o.shardSize, group)
	}
	m, err := model.New(o.modelConfig())
	if err != nil {
		return nil, err
	}
	opt, err := model.NewOptimizer(model.DefaultOptimizerConfig())
	if err != nil {
		return nil, err
	}
	t := &ftTrainer{m: m, lay: m.Layout(), opt: opt, data: model.NewDataset(m.Config()), n: o.batch / ranks, k: rank, batch: o.batch,
		S: group, sk: rank % group}
	if t.ws, err = m.NewWorkspace(t.n); err != nil {
		return nil, err
	}
	t.ws.SetWorkers(o.workers)
	t.grads = t.lay.Alloc(t.S)
	if t.S > 1 {
		if t.params, err = m.InitShards(t.S, t.sk); err != nil {
			return nil, err
		}
		t.full = t.lay.Alloc(t.S)
		t.gsh = t.lay.AllocShards(t.S)
	} else {
		t.params = m.Init()
		t.full, t.gsh = t.params, t.grads
	}
	size := 1
	for r := range t.params {
		t.state = append(t.state, opt.NewState(len(t.params[r])))
		size += len(t.gsh[r])
	}
	t.flat = make([]float32, size)
	T := m.Config().SeqLen
	t.in, t.tg = make([]int32, t.n*T), make([]int32, t.n*T)
	return t, nil
}

// buffers are the state a heal copies, in a fixed order: what this rank
// owns.
func (t *ftTrainer) buffers() [][]float32 {
	var out [][]float32
	for r := range t.params {
		out = append(out, t.params[r], t.state[r].M, t.state[r].V)
	}
	return out
}

// Save and Load are the replica's ft.State: every parameter and moment as
// little-endian float32, in buffers' order.
func (t *ftTrainer) Save() ([]byte, error) {
	var b []byte
	for _, s := range t.buffers() {
		for _, x := range s {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	return b, nil
}

func (t *ftTrainer) Load(b []byte) error {
	want := 0
	for _, s := range t.buffers() {
		want += 4 * len(s)
	}
	if len(b) != want {
		return fmt.Errorf("trainer: a healed state of %d bytes, this model's is %d", len(b), want)
	}
	for _, s := range t.buffers() {
		for i := range s {
			s[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
			b = b[4:]
		}
	}
	return nil
}

func (t *ftTrainer) digest() uint64 { return model.Fingerprint(t.buffers()...) }

// batchFor loads this rank's slice of committed step s's (0-based) batch.
func (t *ftTrainer) batchFor(s int) error {
	lo := t.k * t.n
	if err := t.data.Batch(s, t.batch, lo, lo+t.n, t.in, t.tg); err != nil {
		return err
	}
	return t.ws.SetBatch(t.in, t.tg)
}

// stepDP runs committed step s of plain dp: forward, then backward with
// each region's gradient all-reduced over the quorum (c) as soon as its
// backward wrote it (overlapping the backward of the regions before it,
// as DDP's buckets do), then the loss. The sums land in grads and loss.
func (t *ftTrainer) stepDP(ctx context.Context, s int, c *comm.Comm) error {
	if err := t.batchFor(s); err != nil {
		return err
	}
	R := len(t.params)
	for r := range R {
		if err := t.ws.Forward(r, t.params[r], 0, t.n); err != nil {
			return err
		}
	}
	hs := make([]comm.Handle, 0, R+1)
	var err error
	for r := R - 1; r >= 0 && err == nil; r-- {
		if err = t.ws.Backward(r, t.params[r], t.grads[r], 0, t.n); err == nil {
			hs = append(hs, c.AllReduce(ctx, f32(t.grads[r]), f32(t.grads[r]), comm.Sum))
		}
	}
	if err == nil {
		if t.loss[0], err = t.ws.LossSum(0, t.n); err == nil {
			hs = append(hs, c.AllReduce(ctx, f32(t.loss[:]), f32(t.loss[:]), comm.Sum))
		}
	}
	for _, h := range hs {
		if werr := h.Wait(ctx); werr != nil && err == nil {
			err = fmt.Errorf("%w: %w", ft.ErrQuorumFailed, werr)
		}
	}
	return err
}

// compute runs committed step s (0-based) of hsdp up to the cross-group
// all-reduce, into flat: the reduce-scattered gradient shards of the
// group's samples, then the group's loss sum. gc is the replica group's
// communicator (the parameter all-gather and the gradient reduce-scatter).
func (t *ftTrainer) compute(ctx context.Context, s int, gc *comm.Comm) error {
	if err := t.batchFor(s); err != nil {
		return err
	}
	for r := range t.params {
		if err := gc.AllGather(ctx, f32(t.params[r]), f32(t.full[r])).Wait(ctx); err != nil {
			return err
		}
	}
	loss, err := t.ws.Step(t.full, t.grads)
	if err != nil {
		return err
	}
	for r := range t.grads {
		if err := gc.ReduceScatter(ctx, f32(t.grads[r]), f32(t.gsh[r]), comm.Sum).Wait(ctx); err != nil {
			return err
		}
	}
	l := []float32{loss}
	if err := gc.AllReduce(ctx, f32(l), f32(l), comm.Sum).Wait(ctx); err != nil {
		return err
	}
	off := 0
	for r := range t.gsh {
		off += copy(t.flat[off:], t.gsh[r])
	}
	t.flat[off] = l[0]
	return nil
}

// unpack takes the cross-group sums back out of flat (hsdp).
func (t *ftTrainer) unpack() {
	off := 0
	for r := range t.gsh {
		off += copy(t.gsh[r], t.flat[off:])
	}
	t.loss[0] = t.flat[off]
}

// apply divides the summed gradients by the participants' samples
// (groups × group size × local samples) and updates what this rank owns;
// it returns the mean loss.
func (t *ftTrainer) apply(s, groups int) (float32, error) {
	samples := groups * t.S * t.n
	for r := range t.params {
		g := t.gsh[r]
		if err := model.Mean(g, samples); err != nil {
			return 0, err
		}
		if err := t.opt.Update(s+1, t.params[r], g, t.state[r]); err != nil {
			return 0, err
		}
	}
	return t.loss[0] / float32(samples), nil
}

// runFT trains o.steps committed steps as one fault-tolerant replica.
func runFT(ctx context.Context, o options, log zerolog.Logger, out io.Writer) error {
	cfg := ft.DefaultConfig()
	cfg.Logger = log
	mgr, err := ft.Join(ctx, cfg)
	if err != nil {
		return err
	}
	defer mgr.Close()
	t, err := newFTTrainer(o, mgr.Replicas(), mgr.Replica(), mgr.GroupSize())
	if err != nil {
		return err
	}
	cr, err := parseCrashes(o.crash, mgr.Replica(), mgr.Incarnation())
	if err != nil {
		return err
	}
	mgr.SetState(crashingState{t, cr})
	if mgr.Replica() == 0 && mgr.Incarnation() == 0 {
		fmt.Fprintf(out, "trainer: %s; fault-tolerant %s, %d ranks in replica groups of %d, global batch %d\n", t.m, o.mode, mgr.Replicas(), mgr.GroupSize(), o.batch)
	}
	for mgr.Step() < int64(o.steps) {
		q, err := mgr.Quorum(ctx)
		if errors.Is(err, ft.ErrFinished) {
			fmt.Fprintf(out, "replica %d incarnation %d: %v\n", mgr.Replica(), mgr.Incarnation(), err)
			return nil
		}
		if err != nil {
			return err
		}
		if len(q.Healed) > 0 && q.Changed {
			log.Info().Ints("healed", q.Healed).Ints("sources", q.HealSources).Int64("step", q.Step).Msg("heal")
		}
		s := int(mgr.Step())
		start := time.Now()
		if t.S == 1 {
			if err := t.stepDP(ctx, s, mgr.Comm()); err != nil {
				log.Warn().Err(err).Int("step", s+1).Msg("the step's collectives failed; it will not commit")
				mgr.ReportError(err)
			}
		} else if err := t.compute(ctx, s, mgr.GroupComm()); err != nil {
			// A rank of this replica group died: gorun replaces the
			// group whole (this process included); vote no meanwhile.
			log.Warn().Err(err).Int("step", s+1).Msg("the replica group's collectives failed; the step will not commit")
			mgr.ReportError(err)
		} else if err := mgr.AllReduce(ctx, t.flat, comm.Sum); err != nil {
			log.Warn().Err(err).Int("step", s+1).Msg("all-reduce failed; the step will not commit")
		} else {
			t.unpack()
		}
		cr.at("reduce", int64(s+1))
		ok, err := mgr.ShouldCommit(ctx)
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintf(out, "step %d uncommitted participants %d\n", s+1, q.Size())
			continue
		}
		loss, err := t.apply(s, q.Size())
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "step %d loss %s participants %d time %.2fms\n", s+1, strconv.FormatFloat(float64(loss), 'g', -1, 32), q.Size(), float64(time.Since(start).Microseconds())/1e3)
		if o.stepSleep > 0 {
			time.Sleep(o.stepSleep)
		}
	}
	cr.at("done", 0)
	fmt.Fprintf(out, "replica %d incarnation %d steps %d state %016x\n", mgr.Replica(), mgr.Incarnation(), mgr.Step(), t.digest())
	return mgr.Close()
}

// crash is --crash: where this replica kills itself (SIGKILL), to test
// and measure what the fault-tolerant path does with a death at a point
// no outside fault can reach precisely. WHERE:rank=R[:incarnation=I][:step=N]
// with WHERE one of reduce (after step N's all-reduce, before the vote: a
// death inside a step), load (receiving a heal), save (serving a heal) or
// done (after the last step committed, before the final line).
// Incarnation defaults to 0, so the replacement does not crash again.
// exit=N makes the process exit with code N instead (its own error, as a
// deterministic failure would). Several, comma-separated, make a list
// (crashes).
type crash struct {
	where       string
	rank, inc   int
	step        int64
	exit        int
	replica, me int // this process's replica id and incarnation
}

// crashes are every --crash point of this process.
type crashes []*crash

func parseCrashes(list string, replica, inc int) (crashes, error) {
	var out crashes
	for _, spec := range strings.Split(list, ",") {
		if spec == "" {
			continue
		}
		c, err := parseCrash(spec)
		if err != nil {
			return nil, err
		}
		c.replica, c.me = replica, inc
		out = append(out, c)
	}
	return out, nil
}

func (cs crashes) at(where string, step int64) {
	for _, c := range cs {
		c.at(where, step)
	}
}

func parseCrash(spec string) (*crash, error) {
	parts := strings.Split(spec, ":")
	c := &crash{where: parts[0], rank: -1}
	if c.where != "reduce" && c.where != "load" && c.where != "save" && c.where != "done" {
		return nil, fmt.Errorf("trainer: --crash %q: want reduce, load, save or done first", spec)
	}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("trainer: --crash %q: %q is not KEY=N", spec, p)
		}
		switch k {
		case "rank":
			c.rank = n
		case "incarnation":
			c.inc = n
		case "step":
			c.step = int64(n)
		case "exit":
			c.exit = n
		default:
			return nil, fmt.Errorf("trainer: --crash %q: unknown key %q (rank, incarnation, step, exit)", spec, k)
		}
	}
	if c.rank < 0 || (c.where == "reduce" && c.step < 1) {
		return nil, fmt.Errorf("trainer: --crash %q: needs rank=R (and step=N ≥ 1 for reduce)", spec)
	}
	return c, nil
}

// at kills this process when the crash is due at where (step: the step
// being computed, 1-based).
func (c *crash) at(where string, step int64) {
	if c == nil || c.where != where || c.rank != c.replica || c.inc != c.me || (where == "reduce" && step != c.step) {
		return
	}
	if c.exit > 0 {
		fmt.Fprintf(os.Stderr, "trainer: --crash %s: exiting with code %d\n", c.where, c.exit)
		os.Exit(c.exit)
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// crashingState is t as an ft.State with the load and save crash points.
type crashingState struct {
	t *ftTrainer
	c crashes
}

func (s crashingState) Save() ([]byte, error) { s.c.at("save", 0); return s.t.Save() }
func (s crashingState) Load(b []byte) error   { s.c.at("load", 0); return s.t.Load(b) }
