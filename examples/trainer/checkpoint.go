package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/model"
	"github.com/gorun-hpc/gorun/rankenv"
	"golang.org/x/sys/unix"
)

// Checkpoints (--checkpoint DIR, --checkpoint-every N, the checkpoint
// signal).
//
// One file, DIR/checkpoint.gorun, written by rank 0 and holding the whole
// training state: the number of steps done and, per region, the full
// (unsharded, unpadded) parameters and optimizer moments. Whole rather than
// one file per rank's shard so that a job restarted on fewer ranks (gorun
// --min-np) resumes from it: with --deterministic the losses do not depend
// on the rank count, so such a job still ends bit for bit where an
// uninterrupted one would. Sharded ranks gather their shards to build it
// (three all-gathers per region: parameters and both moments).
//
// Atomic: rank 0 writes a temporary file in DIR, syncs it, renames it over
// checkpoint.gorun and syncs DIR. A rank killed mid-write leaves the last
// complete checkpoint in place (and a temporary file, removed by the next
// write that succeeds... or by hand: its name starts with ".checkpoint-").
// A CRC-32 over everything catches a file damaged otherwise.
//
// Every rank decides the same way whether a step ends with a checkpoint:
// every N steps, or when any rank has received the checkpoint signal —
// gorun's GORUN_CHECKPOINT_SIGNAL (SIGUSR1 unless it says otherwise) —
// which they agree on with a one-element all-reduce (max) after each step.
// That all-reduce is the price of the signal: one tiny collective per step,
// paid only with --checkpoint.
//
// Resume: at start, rank 0 reads the file if DIR holds one and broadcasts
// it; every rank takes its part (all of it in dp, its shard when sharded)
// and training goes on from the next step. Only rank 0's host needs DIR.

// checkpointFile is the checkpoint's name inside DIR.
const checkpointFile = "checkpoint.gorun"

// checkpointMagic opens the file; the version is in it.
const checkpointMagic = "gorun-trainer-checkpoint v1\n"

// checkpointKey is what a checkpoint must agree with to be resumed: the
// model's shape, the global batch and the optimizer. It is hashed into the
// header, so a checkpoint of another model is refused instead of misread.
func (t *trainer) checkpointKey() uint64 {
	c, oc := t.m.Config(), model.DefaultOptimizerConfig()
	s := fmt.Sprintf("%+v|%+v|batch=%d", c, oc, t.o.batch)
	h := crc32.ChecksumIEEE([]byte(s))
	return uint64(h)<<32 | uint64(len(s))
}

// checkpointState is the whole training state, unsharded: per region the
// parameters and the optimizer's M and V (V empty for SGD), each of the
// region's Size.
type checkpointState struct {
	step          int64 // steps done
	params, m, vs [][]float32
}

// gatherState builds the whole state on every rank (sharded: from every
// rank's shards).
func (t *trainer) gatherState(ctx context.Context, steps int) (*checkpointState, error) {
	st := &checkpointState{step: int64(steps)}
	for r, reg := range t.lay.Regions {
		parts := [][]float32{t.own[r], t.state[r].M, t.state[r].V}
		var out [3][]float32
		for i, p := range parts {
			if len(p) == 0 {
				continue // SGD has no V
			}
			full := p
			if t.sharded {
				// Over the shard group: in hsdp every replica holds the
				// whole state in its group's shards.
				full = make([]float32, reg.PaddedSize(t.S))
				if err := t.comms[t.shardGroup].AllGather(ctx, f32(p), f32(full)).Wait(ctx); err != nil {
					return nil, err
				}
			}
			out[i] = full[:reg.Size]
		}
		st.params, st.m, st.vs = append(st.params, out[0]), append(st.m, out[1]), append(st.vs, out[2])
	}
	return st, nil
}

// saveCheckpoint writes the state (rank 0) after steps steps. Every rank
// calls it: sharded ranks take part in the gathers.
func (t *trainer) saveCheckpoint(ctx context.Context, steps int) error {
	st, err := t.gatherState(ctx, steps)
	if err != nil {
		return err
	}
	if t.k != 0 {
		return nil
	}
	return writeCheckpoint(t.o.checkpoint, t.checkpointKey(), st)
}

// writeCheckpoint writes st to dir/checkpoint.gorun atomically.
func writeCheckpoint(dir string, key uint64, st *checkpointState) (err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("trainer: --checkpoint: %w", err)
	}
	f, err := os.CreateTemp(dir, ".checkpoint-*.tmp")
	if err != nil {
		return fmt.Errorf("trainer: --checkpoint: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	crc := crc32.NewIEEE()
	w := bufio.NewWriterSize(io.MultiWriter(f, crc), 1<<16)
	put := func(v uint64) { _ = binary.Write(w, binary.LittleEndian, v) }
	_, _ = w.WriteString(checkpointMagic)
	put(key)
	put(uint64(st.step))
	put(uint64(len(st.params)))
	for r := range st.params {
		put(uint64(len(st.params[r])))
		put(uint64(len(st.vs[r])))
		for _, buf := range [][]float32{st.params[r], st.m[r], st.vs[r]} {
			for _, x := range buf {
				_ = binary.Write(w, binary.LittleEndian, math.Float32bits(x))
			}
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("trainer: --checkpoint: %w", err)
	}
	if err := binary.Write(f, binary.LittleEndian, crc.Sum32()); err != nil {
		return fmt.Errorf("trainer: --checkpoint: %w", err)
	}
	// The data must be on disk before the name points at it, or a crash
	// could leave a complete-looking name over missing blocks.
	if err := f.Sync(); err != nil {
		return fmt.Errorf("trainer: --checkpoint: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("trainer: --checkpoint: %w", err)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, checkpointFile)); err != nil {
		return fmt.Errorf("trainer: --checkpoint: %w", err)
	}
	// And the rename itself must survive a crash.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// errCheckpoint marks a checkpoint file that cannot be resumed from.
var errCheckpoint = errors.New("trainer: checkpoint")

// readCheckpoint reads dir/checkpoint.gorun; (nil, nil) when there is none.
func readCheckpoint(dir string, key uint64, lay *model.Layout) (*checkpointState, error) {
	name := filepath.Join(dir, checkpointFile)
	b, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", errCheckpoint, name, err)
	}
	bad := func(why string, a ...any) (*checkpointState, error) {
		return nil, fmt.Errorf("%w %s: %s", errCheckpoint, name, fmt.Sprintf(why, a...))
	}
	if len(b) < len(checkpointMagic)+4 || string(b[:len(checkpointMagic)]) != checkpointMagic {
		return bad("not a trainer checkpoint (or of another version)")
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.ChecksumIEEE(body) != sum {
		return bad("damaged (checksum mismatch)")
	}
	p := body[len(checkpointMagic):]
	get := func() (uint64, bool) {
		if len(p) < 8 {
			return 0, false
		}
		v := binary.LittleEndian.Uint64(p)
		p = p[8:]
		return v, true
	}
	floats := func(n uint64) ([]float32, bool) {
		if uint64(len(p)) < 4*n {
			return nil, false
		}
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
		}
		p = p[4*n:]
		return out, true
	}
	k, ok1 := get()
	step, ok2 := get()
	nreg, ok3 := get()
	if !ok1 || !ok2 || !ok3 {
		return bad("truncated header")
	}
	if k != key {
		return bad("written for another model, batch or optimizer (key %016x, this run's %016x)", k, key)
	}
	if nreg != uint64(len(lay.Regions)) {
		return bad("%d regions, the model has %d", nreg, len(lay.Regions))
	}
	st := &checkpointState{step: int64(step)}
	for _, reg := range lay.Regions {
		n, ok1 := get()
		nv, ok2 := get()
		if !ok1 || !ok2 || n != uint64(reg.Size) || (nv != 0 && nv != n) {
			return bad("region %s: sizes %d/%d, the model's is %d", reg.Name, n, nv, reg.Size)
		}
		ps, ok1 := floats(n)
		ms, ok2 := floats(n)
		vs, ok3 := floats(nv)
		if !ok1 || !ok2 || !ok3 {
			return bad("truncated in region %s", reg.Name)
		}
		st.params, st.m, st.vs = append(st.params, ps), append(st.m, ms), append(st.vs, vs)
	}
	if len(p) != 0 {
		return bad("%d bytes after the last region", len(p))
	}
	return st, nil
}

// resume loads the checkpoint in --checkpoint DIR, if any, into every
// rank: rank 0 reads it and broadcasts it. It returns the number of steps
// the checkpoint had done (0: none, start from scratch).
func (t *trainer) resume(ctx context.Context) (int, error) {
	// Header: found, steps, and rank 0's error as a flag, so that every
	// rank fails together rather than waiting for broadcasts that never
	// come.
	hdr := make([]int64, 3)
	var st *checkpointState
	if t.k == 0 {
		var err error
		st, err = readCheckpoint(t.o.checkpoint, t.checkpointKey(), t.lay)
		switch {
		case err != nil:
			hdr[2] = 1
			if berr := t.cm.Broadcast(ctx, comm.Int64s(hdr), comm.Int64s(hdr), 0).Wait(ctx); berr != nil {
				return 0, errors.Join(err, berr)
			}
			return 0, err
		case st != nil:
			hdr[0], hdr[1] = 1, st.step
		}
	}
	if err := t.cm.Broadcast(ctx, comm.Int64s(hdr), comm.Int64s(hdr), 0).Wait(ctx); err != nil {
		return 0, err
	}
	if hdr[2] != 0 {
		return 0, fmt.Errorf("%w: rank 0 could not read %s", errCheckpoint, filepath.Join(t.o.checkpoint, checkpointFile))
	}
	if hdr[0] == 0 {
		return 0, nil
	}
	for r, reg := range t.lay.Regions {
		dst := [][]float32{t.own[r], t.state[r].M, t.state[r].V}
		for i, d := range dst {
			if len(d) == 0 {
				continue
			}
			// The whole region, padded to split into S shards (zeros:
			// padding holds zero parameters and moments).
			full := make([]float32, reg.PaddedSize(t.S))
			if t.k == 0 {
				copy(full, [][]float32{st.params[r], st.m[r], st.vs[r]}[i])
			}
			if err := t.cm.Broadcast(ctx, f32(full), f32(full), 0).Wait(ctx); err != nil {
				return 0, err
			}
			src := full
			if t.sharded {
				var err error
				if src, err = reg.Shard(full, t.S, t.sk); err != nil {
					return 0, err
				}
			}
			if len(src) < len(d) {
				return 0, fmt.Errorf("%w: region %s: %d elements for a buffer of %d", errCheckpoint, reg.Name, len(src), len(d))
			}
			copy(d, src[:len(d)])
		}
	}
	return int(hdr[1]), nil
}

// checkpointSignal is the signal gorun sends to ask for a checkpoint: the
// one GORUN_CHECKPOINT_SIGNAL names (SIGUSR1, SLURM's --signal habit, when
// it is unset).
func checkpointSignal() (syscall.Signal, error) {
	v, ok := os.LookupEnv(rankenv.CheckpointSignal)
	if !ok || v == "" {
		return syscall.SIGUSR1, nil
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 && n < 65 {
		return syscall.Signal(n), nil
	}
	s := unix.SignalNum(v)
	if s == 0 {
		s = unix.SignalNum("SIG" + v)
	}
	if s == 0 || s == syscall.SIGKILL || s == syscall.SIGSTOP {
		return 0, fmt.Errorf("trainer: %s=%q is not a signal a program can catch", rankenv.CheckpointSignal, v)
	}
	return s, nil
}
