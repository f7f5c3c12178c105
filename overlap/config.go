package overlap

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// Mode selects how buckets are handed to the communicator.
type Mode int

const (
	// Native issues each bucket's collective as soon as it may start.
	Native Mode = iota
	// Grouped collects the buckets that became startable between two compute
	// calls and issues them as one GroupBackend call (NCCL group semantics).
	Grouped
	// Serial issues like Native and waits for each collective at once: no
	// overlap, the baseline the other modes are measured against.
	Serial
)

func (m Mode) String() string {
	switch m {
	case Native:
		return "native"
	case Grouped:
		return "grouped"
	case Serial:
		return "serial"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Clock tells the time; tests inject a fake one so timelines are exact.
// Now must be safe for concurrent use.
type Clock interface{ Now() time.Time }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// WallClock is the real clock.
var WallClock Clock = wallClock{}

// Config tunes an Executor. Every rank of a group must use the same Mode and
// the same CheckPlan: they decide which collectives are issued.
type Config struct {
	// Mode: Native (default) issues every bucket as early as allowed.
	Mode Mode
	// Backend runs Grouped bucket sets; nil means SequentialGroups, which
	// issues the set's calls back to back on the communicator.
	Backend GroupBackend
	// CheckPlan exchanges a hash of plan and step at the first collective of
	// every step on every group. On by default: 8 bytes per rank per step is
	// nothing next to a silent desync.
	CheckPlan bool
	// FlushPartial starts a bucket that is still missing members when the
	// program ends the bucket's region (EndRegion) or the step (Finish), with
	// the missing members' slots zeroed and their results dropped, as DDP
	// does for unused parameters. Off by default: a tensor that was not
	// produced is usually a bug, and the error names it.
	FlushPartial bool
	// Trace records a timeline (compute, collectives, waits) every step.
	// Off by default: it costs an allocation per event.
	Trace bool
	// TraceLimit bounds the recorded events, so a long run cannot exhaust
	// memory; later events are counted and dropped. 1<<20 events ≈ 100 MB.
	TraceLimit int
	// PrefetchStarts bounds how far ahead of its plan position GraphRunner
	// issues a start whose inputs exist: at most this many starts ahead of
	// the next start the plan reaches. 0 issues every start exactly at its
	// plan position (the plan's own prefetch: the author's, or Reshard's
	// one block); negative (the default, -1) as early as data allows. The
	// Executor's eager API is not affected: there the program decides.
	PrefetchStarts int
	// MaxInFlightBytes bounds the fused bytes of the collectives GraphRunner
	// has issued early and not yet waited for: a start that would go past
	// it waits until earlier ones are waited for, or until the plan reaches
	// it (a start at its plan position always goes out). 0: no bound.
	MaxInFlightBytes int64
	// MinProcs is the least GOMAXPROCS the process runs with while the
	// executor is open (default 2): one P for the program's compute and one
	// for the communicator's worker, without which a collective issued
	// before a compute waits for that compute to block or be preempted
	// (procs.go has the measurements). Within the CPUs the process may run
	// on while its compute runs on the CPU: a rank bound to one core keeps
	// its one P, since there the worker's polling would take the core from
	// the compute. Past them once a step's compute spent a quarter of its
	// time blocked off the CPU (an accelerator's synchronising calls, cgo
	// calls that wait), and back within them after a step where that
	// share fell under 1/16: Executor.Compute measures it on Linux. The
	// setting before is put back when the last executor closes, and one
	// the program makes meanwhile stands. 0 leaves GOMAXPROCS alone, for a
	// program that sets it itself.
	MinProcs int
	// Clock times spans and metrics; default WallClock.
	Clock Clock
	// Logger gets one debug line per collective; fields rank, step, bucket.
	Logger zerolog.Logger
}

// DefaultConfig: native mode, plan checked, no trace, starts issued as
// early as data allows, at least two Ps.
func DefaultConfig() Config {
	return Config{Mode: Native, CheckPlan: true, TraceLimit: 1 << 20, Clock: WallClock, Logger: zerolog.Nop(), PrefetchStarts: -1, MinProcs: 2}
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	switch {
	case c.Mode < Native || c.Mode > Serial:
		return fmt.Errorf("%w: unknown mode %d", ErrConfig, int(c.Mode))
	case c.TraceLimit < 0:
		return fmt.Errorf("%w: negative TraceLimit %d", ErrConfig, c.TraceLimit)
	case c.MinProcs < 0:
		return fmt.Errorf("%w: negative MinProcs %d", ErrConfig, c.MinProcs)
	case c.MaxInFlightBytes < 0:
		return fmt.Errorf("%w: negative MaxInFlightBytes %d", ErrConfig, c.MaxInFlightBytes)
	case c.Clock == nil:
		return fmt.Errorf("%w: nil Clock", ErrConfig)
	}
	return nil
}
