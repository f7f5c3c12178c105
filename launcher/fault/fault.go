package fault

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/internal/netfault"
)

// The spellings of gorun --inject SPEC. The launcher schedules a parsed
// Fault against a job's plan (inject.go); the job loop, which owns the
// clock, sends an "inject" command when one is due, and the supervisor that
// owns the target rank sends the signal to the rank's process group and,
// for a stop with a duration, the SIGCONT after it. Everything that
// happened is kept in the launcher's Report.
//
// A spec is a kind and key=value fields separated by colons:
//
//	kill:rank=2:at=2s[:sig=TERM]     signal one rank (SIGKILL by default)
//	stop:rank=1:at=1s[:for=5s]       SIGSTOP one rank; SIGCONT after for=
//	cont:rank=1:at=6s                SIGCONT one rank
//	kill-host:host=h2:at=3s[:sig=]   signal every rank of one host; in a
//	                                 multi-host job its host agent then
//	                                 kills itself (the host is lost)
//	random:mtbf=10s:seed=7[:sig=]    kill a random rank at exponentially
//	                                 distributed times, mean mtbf; the same
//	                                 seed gives the same times and ranks
//
// Times are measured from the start of the job's first world; a fault fires
// once per job, so a job that restarts does not meet the same fault again.
//
// kill, stop, cont and kill-host take after-steps=N instead of at=: the
// fault fires when the target rank (kill-host: any rank of the host) has
// reported finishing training step N (rank.ReportStep, one line on the pipe
// each rank inherits; internal/collateral). The supervisor that runs the
// target keeps the fault and fires it itself on the report, without a round
// trip to gorun, so it lands within one supervisor tick (20 ms) of the step
// whatever the machine's speed. The job loop hands such faults to the
// supervisors as soon as the world starts; one whose step the world never
// reaches is reported missed.

// Kind names what a fault does.
type Kind string

// The kinds of fault gorun injects.
const (
	Kill     Kind = "kill"
	Stop     Kind = "stop"
	Cont     Kind = "cont"
	KillHost Kind = "kill-host"
	Random   Kind = "random"
	// Slow slows a rank by periodic SIGSTOP/SIGCONT (chaos.go).
	Slow Kind = "slow"
)

// Fault is one parsed --inject spec.
type Fault struct {
	// Spec is the text as the user wrote it, for messages and the report.
	Spec string
	Kind Kind
	// Rank is the target of kill, stop and cont.
	Rank int
	// Host is the target of kill-host: a host name as written in -H or the
	// hostfile.
	Host string
	// At is when the fault fires, from the start of the job.
	At time.Duration
	// AfterSteps, when positive, replaces At: the fault fires once the
	// target has reported finishing this training step.
	AfterSteps int64
	// For is how long a stop lasts before SIGCONT; 0 means it never ends.
	For time.Duration
	// Signal is what kill, kill-host and random send.
	Signal syscall.Signal
	// MTBF and Seed drive random: the mean time between failures and the
	// seed of the generator that picks times and ranks.
	MTBF time.Duration
	Seed uint64
	// Duty and Period drive slow (chaos.go): the fraction of each
	// period the rank is stopped; 0 means the default.
	Duty   float64
	Period time.Duration
	// Net is the data-plane fault (drop, delay, corrupt, partition) that
	// the ranks' transport acts out (chaos.go); nil for the others.
	Net *netfault.Spec
}

// SpecError is a spec that cannot be injected; Why names the part that
// is wrong.
type SpecError struct {
	Spec string
	// Where is "file:line" for a spec read from --inject-file, else "".
	Where string
	Why   string
}

func (e *SpecError) Error() string {
	if e.Where != "" {
		return fmt.Sprintf("launcher: --inject %q (%s): %s", e.Spec, e.Where, e.Why)
	}
	return fmt.Sprintf("launcher: --inject %q: %s", e.Spec, e.Why)
}

// kindKeys lists, per kind, the keys it requires and the ones it accepts.
// "when" stands for at= or after-steps=: exactly one of them.
var kindKeys = map[Kind]struct{ required, optional []string }{
	Kill:     {[]string{"rank", "when"}, []string{"sig"}},
	Stop:     {[]string{"rank", "when"}, []string{"for"}},
	Cont:     {[]string{"rank", "when"}, nil},
	KillHost: {[]string{"host", "when"}, []string{"sig"}},
	Random:   {[]string{"mtbf", "seed"}, []string{"sig"}},
	Slow:     {[]string{"rank", "when"}, []string{"for", "duty", "period"}},
}

// keysText lists the keys a kind takes, for messages.
func keysText(required, optional []string) string {
	var out []string
	for _, k := range append(slices.Clone(required), optional...) {
		if k == "when" {
			k = "at or after-steps"
		}
		out = append(out, k)
	}
	return strings.Join(out, ", ")
}

// Parse parses one --inject spec. It refuses, naming the part at
// fault, an unknown kind or key, a key given twice, a missing required key,
// a value that does not parse, and both or neither of at= and after-steps=.
func Parse(spec string) (Fault, error) {
	bad := func(format string, a ...any) (Fault, error) {
		return Fault{}, &SpecError{Spec: spec, Why: fmt.Sprintf(format, a...)}
	}
	if isNetKind(spec) {
		return parseNetFault(spec)
	}
	parts := strings.Split(spec, ":")
	kind := Kind(strings.TrimSpace(parts[0]))
	keys, ok := kindKeys[kind]
	if !ok {
		return bad("unknown kind %q: expected kill, stop, cont, kill-host, random, slow, drop, delay, corrupt or partition", kind)
	}
	f := Fault{Spec: spec, Kind: kind, Signal: syscall.SIGKILL}
	seen := map[string]bool{}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return bad("field %q: expected key=value", p)
		}
		key := k
		if k == "at" || k == "after-steps" {
			key = "when"
		}
		if !slices.Contains(keys.required, key) && !slices.Contains(keys.optional, key) {
			return bad("key %q does not apply to %s (it takes %s)", k, kind, keysText(keys.required, keys.optional))
		}
		if seen[k] {
			return bad("key %q given twice", k)
		}
		if key == "when" && seen[key] {
			return bad("at= and after-steps= both given: a fault fires at a time or after a step, not both")
		}
		seen[k], seen[key] = true, true
		if v == "" {
			return bad("%s= has no value", k)
		}
		var err error
		switch k {
		case "rank":
			f.Rank, err = strconv.Atoi(v)
			if err == nil && f.Rank < 0 {
				err = errors.New("must not be negative")
			}
		case "host":
			f.Host = v
		case "at":
			f.At, err = parseDuration(v)
		case "after-steps":
			f.AfterSteps, err = strconv.ParseInt(v, 10, 64)
			if err == nil && f.AfterSteps < 1 {
				err = errors.New("must be at least 1 (steps are counted from 1)")
			}
		case "for":
			f.For, err = parseDuration(v)
			if err == nil && f.For == 0 {
				err = errors.New("must be positive (leave for= out to stop the rank for good)")
			}
		case "mtbf":
			f.MTBF, err = parseDuration(v)
			if err == nil && f.MTBF < time.Millisecond {
				err = errors.New("must be at least 1ms")
			}
		case "seed":
			f.Seed, err = strconv.ParseUint(v, 10, 64)
		case "sig":
			f.Signal, err = ParseSignal(v)
		default:
			err = parseChaosKey(&f, k, v)
		}
		if err != nil {
			return bad("%s=%s: %v", k, v, unwrapNum(err))
		}
	}
	for _, k := range keys.required {
		if !seen[k] {
			if k == "when" {
				return bad("%s needs at= or after-steps=", kind)
			}
			return bad("%s needs %s=", kind, k)
		}
	}
	return f, nil
}

// unwrapNum shortens strconv's errors ("strconv.Atoi: parsing "x": invalid
// syntax") to their reason.
func unwrapNum(err error) error {
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		return ne.Err
	}
	return err
}

// parseDuration is time.ParseDuration that refuses negative values.
func parseDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, errors.New("not a duration (write e.g. 500ms, 2s, 1m)")
	}
	if d < 0 {
		return 0, errors.New("must not be negative")
	}
	return d, nil
}

// ParseSignal reads a signal as users write it in sig=: KILL, SIGKILL,
// kill or a number from 1 to 64.
func ParseSignal(v string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(v); err == nil {
		if n <= 0 || n > 64 {
			return 0, errors.New("no such signal number")
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(v)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	s := unix.SignalNum(name)
	if s == 0 {
		return 0, errors.New("no such signal")
	}
	return s, nil
}

// ParseFile reads one spec per line; blank lines and lines starting
// with # are skipped. name is used in errors ("name:line").
func ParseFile(r io.Reader, name string) ([]Fault, error) {
	var out []Fault
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f, err := Parse(line)
		if err != nil {
			var se *SpecError
			if errors.As(err, &se) {
				se.Where = fmt.Sprintf("%s:%d", name, n)
			}
			return nil, err
		}
		out = append(out, f)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("launcher: --inject-file %s: %w", name, err)
	}
	return out, nil
}
