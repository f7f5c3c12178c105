package bench

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
)

// Transport selects the data plane between ranks on one host.
type Transport string

// The values of --transport.
const (
	// TransportAuto lets comm choose: shared memory inside a host, TCP
	// between hosts.
	TransportAuto Transport = "auto"
	// TransportTCP forces TCP even inside a host (comm.EndpointConfig.ForceTCP),
	// to measure the network path on one machine.
	TransportTCP Transport = "tcp"
	// TransportShm is auto, plus a check that every pair of ranks really is
	// connected through shared memory; otherwise the run fails with ErrNoShm
	// rather than silently measuring TCP.
	TransportShm Transport = "shm"
)

// Device is where the benchmark's buffers live and which communicator
// moves them.
type Device string

// The values of --device.
const (
	// DeviceCPU: host memory through comm (shared memory, TCP).
	DeviceCPU Device = "cpu"
	// DeviceCUDA: GPU memory through NCCL (package nccl), one GPU per rank.
	// The check runs on the GPU (#wrong); times, wrong counts and the
	// header still travel through comm.
	DeviceCUDA Device = "cuda"
)

// Config is one benchmark run. Every rank must run with an equal Config
// (except the output fields), as every rank must issue the same collectives.
type Config struct {
	// Op is the collective measured.
	Op Collective
	// MinBytes and MaxBytes bound the sweep (nccl-tests -b, -e), inclusive.
	// 8 B to 128 MiB: the nccl-tests range from latency to bandwidth bound.
	MinBytes, MaxBytes int64
	// StepFactor multiplies the size between rows (-f); StepBytes, when
	// positive, adds instead (-i). Factor 2, as nccl-tests' -f default.
	StepFactor int64
	StepBytes  int64
	// DType is the element type (-d). float32, as nccl-tests.
	DType comm.DType
	// RedOp is the reduction of allreduce, reducescatter and reduce (-o).
	// Sum, as nccl-tests.
	RedOp comm.Op
	// Root is the root of broadcast and reduce (-r). 0.
	Root int
	// Iters is the number of timed calls per size and placement (-n); 20,
	// as nccl-tests. Warmup untimed calls precede them (-w); 5, as
	// nccl-tests.
	Iters, Warmup int
	// Check verifies every result element (-c 1). On by default: a
	// benchmark of wrong answers is worthless, and the check runs outside
	// the timed loop.
	Check bool
	// Blocking waits for each timed call before issuing the next (-z 1,
	// as nccl-tests' --blocking), issued with comm.IssuerWaits so the
	// caller runs it, as a blocking call from C or Python through
	// libgorun does. Off by default: calls are issued back to back and
	// waited for at the end, so the communicator's worker runs the next
	// as soon as one ends.
	Blocking bool
	// Seed varies the check values between runs; 1.
	Seed uint64
	// Transport is the data plane choice (--transport).
	Transport Transport
	// Device is where the buffers live (--device). cpu.
	Device Device

	// Out receives the table (rank 0 only). Nil discards.
	Out io.Writer
	// Progress, when not nil, receives a progress line that is rewritten in
	// place ("\r"): callers set it only when it is a terminal.
	Progress io.Writer
	// Version is the gorun version recorded in the output.
	Version string
	// Logger receives setup events; the zero value discards.
	Logger zerolog.Logger
}

// DefaultConfig returns nccl-tests' defaults, with the all-reduce operation.
func DefaultConfig() Config {
	return Config{
		Op:         AllReduce,
		MinBytes:   8,
		MaxBytes:   128 << 20,
		StepFactor: 2,
		DType:      comm.Float32,
		RedOp:      comm.Sum,
		Iters:      20,
		Warmup:     5,
		Check:      true,
		Seed:       1,
		Transport:  TransportAuto,
		Device:     DeviceCPU,
		Version:    "dev",
		Logger:     zerolog.Nop(),
	}
}

// maxRows bounds a sweep so that a tiny increment cannot queue millions of
// sizes by mistake.
const maxRows = 10000

// Validate reports the first invalid field as a *UsageError.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error { return &UsageError{Problem: fmt.Sprintf(format, args...)} }
	switch {
	case c.Op < AllReduce || c.Op > Barrier:
		return bad("no operation given")
	case c.MinBytes < 0 || c.MaxBytes < c.MinBytes:
		return bad("sizes: need 0 <= -b (%d) <= -e (%d)", c.MinBytes, c.MaxBytes)
	case c.MaxBytes > 1<<40:
		return bad("-e %d is beyond 1 TiB", c.MaxBytes)
	case c.StepBytes < 0:
		return bad("-i %d is negative", c.StepBytes)
	case c.StepBytes == 0 && c.StepFactor < 2 && c.MaxBytes > c.MinBytes:
		return bad("-f %d: the step factor must be at least 2 (or use -i)", c.StepFactor)
	case !c.DType.Valid():
		return bad("invalid data type %v", c.DType)
	case !c.RedOp.Valid():
		return bad("invalid reduction %v", c.RedOp)
	case c.Root < 0:
		return bad("-r %d is negative", c.Root)
	case c.Iters < 1:
		return bad("-n %d: at least one iteration", c.Iters)
	case c.Warmup < 0:
		return bad("-w %d is negative", c.Warmup)
	}
	switch c.Transport {
	case TransportAuto, TransportTCP, TransportShm:
	default:
		return bad("--transport %q: expected auto, tcp or shm", c.Transport)
	}
	switch c.Device {
	case DeviceCPU:
	case DeviceCUDA:
		if c.Transport != TransportAuto {
			return bad("--transport %s: NCCL chooses its own transports with --device cuda", c.Transport)
		}
	default:
		return bad("--device %q: expected cpu or cuda", c.Device)
	}
	if n := len(c.Sizes()); n > maxRows {
		return bad("the sweep has %d sizes (more than %d); use a larger -f or -i", n, maxRows)
	}
	return nil
}

// Sizes is the list of requested sizes in bytes, nccl-tests style: from
// MinBytes, times StepFactor (or plus StepBytes), while at most MaxBytes.
// A barrier has one row.
func (c *Config) Sizes() []int64 {
	if c.Op == Barrier {
		return []int64{0}
	}
	var out []int64
	for s := c.MinBytes; s <= c.MaxBytes && len(out) <= maxRows; {
		out = append(out, s)
		next := s + c.StepBytes
		if c.StepBytes == 0 {
			next = s * c.StepFactor
		}
		if next <= s { // size 0 with a factor, or overflow
			if s == 0 && c.StepBytes == 0 {
				next = 1
			} else {
				break
			}
		}
		s = next
	}
	return out
}

// ParseSize reads a byte count: a plain number or one with a binary suffix
// K, M, G or T (powers of 1024, as nccl-tests reads -b and -e), optionally
// followed by B or iB: "8", "64K", "128M", "1G", "2MiB".
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	u := strings.ToUpper(t)
	// "2MiB", "1GB", "64B": the unit letters after the number are optional.
	if v, ok := strings.CutSuffix(u, "IB"); ok {
		u = v
	} else if v, ok := strings.CutSuffix(u, "B"); ok {
		u = v
	}
	shift := 0
	if u != "" {
		switch u[len(u)-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift > 0 {
			u = u[:len(u)-1]
		}
	}
	v, err := strconv.ParseInt(u, 10, 64)
	if err != nil || v < 0 || (shift > 0 && v > (1<<62)>>shift) {
		return 0, &UsageError{Problem: fmt.Sprintf("size %q: expected a byte count such as 8, 64K, 128M or 1G", s)}
	}
	return v << shift, nil
}

// FormatSize prints n bytes with the largest binary suffix that divides it
// (64K, 128M), or in bytes.
func FormatSize(n int64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
