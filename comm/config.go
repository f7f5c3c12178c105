package comm

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// Config tunes one Communicator. Every rank of a group must use the same
// Deterministic, Tag, FuseBytes and cost-model settings: they decide the
// algorithm, and ranks running different algorithms get a desync error, not
// wrong data.
type Config struct {
	// Deterministic makes every reduction follow the fixed pairwise tree over
	// ranks documented in the package comment, whatever the size or algorithm.
	// Off by default: the ring is faster for large messages on many ranks.
	Deterministic bool

	// Tag tells apart communicators over the same member list (e.g. two
	// streams of one data-parallel group); it is folded into the group id.
	Tag string

	// QueueDepth is how many calls may be issued and not yet complete before
	// issuing blocks. 1024: far more than a step's buckets.
	QueueDepth int

	// SegmentBytes is the pipeline unit: large messages travel as frames of
	// at most this size, so a receiver reduces one segment while the next is
	// in flight. 256 KiB: fits in L2 with room for the reduction's operands.
	SegmentBytes int

	// TCPSegmentBytes replaces SegmentBytes on TCP links (0: use
	// SegmentBytes). A TCP link folds what it receives into the destination
	// in cache-sized pieces as the bytes arrive, whatever the frame size, so
	// on TCP the segment only sets the per-frame cost (a header, a wake-up
	// between frames). 1 MiB: on loopback between two processes, all-reduce
	// busbw with 1 MiB frames beat 256 KiB ones at 1-4 MiB messages (median
	// of 4 interleaved rounds 1.9 vs 1.3 GB/s) and matched them at 16-64
	// MiB; 512 KiB to 4 MiB frames were within noise of each other.
	TCPSegmentBytes int

	// LatencyNs and BytesPerNs are the cost model's alpha (per message) and
	// beta (per byte) terms. For an all-reduce of S bytes on n ranks:
	//   recursive doubling: ceil(log2 n)·(alpha + S/beta) (+2 messages if n is not a power of two)
	//   ring:               2(n-1)·alpha + 2(n-1)/n·S/beta + (n-1)/n·S/gamma
	// where gamma is the local reduction rate (≈ beta here). The cheaper one
	// runs. Defaults 5000 ns and 2 bytes/ns were measured on loopback TCP on
	// this kind of machine; with 2 ranks both algorithms move the same bytes
	// and the choice only matters for n > 2.
	LatencyNs  float64
	BytesPerNs float64

	// FuseBytes is the most data (in the compute type: float32 for the
	// 16-bit floats) that small all-reduces queued behind one another are
	// fused into, travelling as one message (see "Fusion" in the package
	// comment); an all-reduce larger than this, or one the cost model
	// sends over the ring, is never fused. 64 KiB: 64 calls of 1 KiB in one
	// message, well below where recursive doubling, which a fused message
	// runs, loses to the ring on few ranks. 0 turns fusion off. Taken as
	// at most SegmentBytes (and TCPSegmentBytes) less 512, so that a fused
	// message is one frame.
	FuseBytes int

	// ConnectTimeout bounds New's wait for every peer to connect. 60 s: peers
	// of a large job start over seconds; a hang guard, not a tuning knob.
	ConnectTimeout time.Duration

	// AbortTimeout bounds how long a failing rank spends telling its peers
	// why before it closes its connections. 2 s.
	AbortTimeout time.Duration

	// DesyncCheckAfter is how long a call may wait before this rank asks
	// every other rank of the group, over the transport's side channel
	// (StatusTransport), which calls it has run: a call at the same position
	// that differs fails the communicator on every rank with a
	// *DesyncError; ranks that have not reached the call are logged as
	// stragglers (at once, then at doubling intervals). Nothing is sent
	// before a call has waited this long, so a job that never waits this
	// long pays nothing. 1 s: far above any collective's normal wait on a
	// healthy group, and short enough that a desync ends within seconds.
	// Zero or negative turns the check off.
	DesyncCheckAfter time.Duration

	// StallTimeout, when positive, fails a call that has waited this long
	// without a desync being found with a *StallError naming the ranks
	// that had not reached it. 0 (default): a slow rank is only logged,
	// since a long wait (a checkpoint on one rank) can be legitimate.
	StallTimeout time.Duration

	// FlightRecords is how many recent calls the flight recorder keeps
	// (kind, dtype, count, root, sequence number, issue/start/end times,
	// state). It is always on; it is written to FlightDir when the
	// communicator fails and on DumpFlightRecords (SIGUSR2 under gorun), and
	// its latest records to the log: as a warning when there is no FlightDir
	// (the log is then the only copy), at debug level when the file was
	// written (gorun merges the files into one table). 256: a few training
	// steps' worth of buckets.
	FlightRecords int

	// FlightDir is where flight records are written as JSON, one file per
	// rank and group. Empty: $GORUN_FLIGHT_DIR (set by gorun), else the
	// log only.
	FlightDir string

	// Logger receives connection and failure events; fields rank, world and
	// group are added. The zero value logs nothing.
	Logger zerolog.Logger
}

// DefaultConfig returns the settings for a production job.
func DefaultConfig() Config {
	return Config{
		QueueDepth:       1024,
		SegmentBytes:     256 << 10,
		TCPSegmentBytes:  1 << 20,
		LatencyNs:        5000,
		BytesPerNs:       2,
		FuseBytes:        64 << 10,
		ConnectTimeout:   60 * time.Second,
		AbortTimeout:     2 * time.Second,
		DesyncCheckAfter: time.Second,
		FlightRecords:    256,
		Logger:           zerolog.Nop(),
	}
}

// LocalConfig returns settings for tests and laptops: short timeouts.
func LocalConfig() Config {
	c := DefaultConfig()
	c.ConnectTimeout = 10 * time.Second
	c.AbortTimeout = 500 * time.Millisecond
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.QueueDepth < 1:
		return fmt.Errorf("%w: QueueDepth %d < 1", ErrInvalidArgument, c.QueueDepth)
	case c.SegmentBytes < 4096:
		return fmt.Errorf("%w: SegmentBytes %d < 4096", ErrInvalidArgument, c.SegmentBytes)
	case c.TCPSegmentBytes != 0 && c.TCPSegmentBytes < 4096:
		return fmt.Errorf("%w: TCPSegmentBytes %d < 4096", ErrInvalidArgument, c.TCPSegmentBytes)
	case c.LatencyNs <= 0 || c.BytesPerNs <= 0:
		return fmt.Errorf("%w: cost model needs LatencyNs > 0 and BytesPerNs > 0", ErrInvalidArgument)
	case c.FuseBytes < 0:
		return fmt.Errorf("%w: FuseBytes %d is negative", ErrInvalidArgument, c.FuseBytes)
	case c.ConnectTimeout <= 0 || c.AbortTimeout <= 0:
		return fmt.Errorf("%w: timeouts must be positive", ErrInvalidArgument)
	case c.StallTimeout < 0:
		return fmt.Errorf("%w: StallTimeout %v is negative", ErrInvalidArgument, c.StallTimeout)
	case c.FlightRecords < 1:
		return fmt.Errorf("%w: FlightRecords %d < 1", ErrInvalidArgument, c.FlightRecords)
	}
	return nil
}

// fuseLimit is FuseBytes as it applies: at most a segment less the count
// list, so that a fused message is one frame.
func (c Config) fuseLimit() int {
	l := min(c.FuseBytes, c.SegmentBytes-fuseListBytes)
	if c.TCPSegmentBytes != 0 {
		l = min(l, c.TCPSegmentBytes-fuseListBytes)
	}
	return l
}
