package launcher

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/internal/netfault"
)

// Fault injection (gorun --inject SPEC). This file is pure: it parses the
// spellings into Faults and turns them, with a plan, into a schedule of
// concrete injections (schedule). Executing them is split between the job
// loop, which owns the clock and sends an "inject" command when one is due
// (jobloop.go), and the supervisor that owns the target rank, which sends
// the signal to the rank's process group and, for a stop with a duration,
// the SIGCONT after it (supervisor.go). Everything that happened is kept in
// a Report (elastic.go).
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

// FaultKind names what a fault does.
type FaultKind string

// The kinds of fault gorun injects.
const (
	FaultKill     FaultKind = "kill"
	FaultStop     FaultKind = "stop"
	FaultCont     FaultKind = "cont"
	FaultKillHost FaultKind = "kill-host"
	FaultRandom   FaultKind = "random"
)

// Fault is one parsed --inject spec.
type Fault struct {
	// Spec is the text as the user wrote it, for messages and the report.
	Spec string
	Kind FaultKind
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
	// Duty and Period drive slow (inject_chaos.go): the fraction of each
	// period the rank is stopped; 0 means the default.
	Duty   float64
	Period time.Duration
	// Net is the data-plane fault (drop, delay, corrupt, partition) that
	// the ranks' transport acts out (inject_chaos.go); nil for the others.
	Net *netfault.Spec
}

// FaultSpecError is a spec that cannot be injected; Why names the part that
// is wrong.
type FaultSpecError struct {
	Spec string
	// Where is "file:line" for a spec read from --inject-file, else "".
	Where string
	Why   string
}

func (e *FaultSpecError) Error() string {
	if e.Where != "" {
		return fmt.Sprintf("launcher: --inject %q (%s): %s", e.Spec, e.Where, e.Why)
	}
	return fmt.Sprintf("launcher: --inject %q: %s", e.Spec, e.Why)
}

// faultKeys lists, per kind, the keys it requires and the ones it accepts.
// "when" stands for at= or after-steps=: exactly one of them.
var faultKeys = map[FaultKind]struct{ required, optional []string }{
	FaultKill:     {[]string{"rank", "when"}, []string{"sig"}},
	FaultStop:     {[]string{"rank", "when"}, []string{"for"}},
	FaultCont:     {[]string{"rank", "when"}, nil},
	FaultKillHost: {[]string{"host", "when"}, []string{"sig"}},
	FaultRandom:   {[]string{"mtbf", "seed"}, []string{"sig"}},
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

// ParseFault parses one --inject spec. It refuses, naming the part at
// fault, an unknown kind or key, a key given twice, a missing required key,
// a value that does not parse, and both or neither of at= and after-steps=.
func ParseFault(spec string) (Fault, error) {
	bad := func(format string, a ...any) (Fault, error) {
		return Fault{}, &FaultSpecError{Spec: spec, Why: fmt.Sprintf(format, a...)}
	}
	if isNetKind(spec) {
		return parseNetFault(spec)
	}
	parts := strings.Split(spec, ":")
	kind := FaultKind(strings.TrimSpace(parts[0]))
	keys, ok := faultKeys[kind]
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
			f.At, err = parseFaultDuration(v)
		case "after-steps":
			f.AfterSteps, err = strconv.ParseInt(v, 10, 64)
			if err == nil && f.AfterSteps < 1 {
				err = errors.New("must be at least 1 (steps are counted from 1)")
			}
		case "for":
			f.For, err = parseFaultDuration(v)
			if err == nil && f.For == 0 {
				err = errors.New("must be positive (leave for= out to stop the rank for good)")
			}
		case "mtbf":
			f.MTBF, err = parseFaultDuration(v)
			if err == nil && f.MTBF < time.Millisecond {
				err = errors.New("must be at least 1ms")
			}
		case "seed":
			f.Seed, err = strconv.ParseUint(v, 10, 64)
		case "sig":
			f.Signal, err = parseSignal(v)
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

// parseFaultDuration is time.ParseDuration that refuses negative values.
func parseFaultDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, errors.New("not a duration (write e.g. 500ms, 2s, 1m)")
	}
	if d < 0 {
		return 0, errors.New("must not be negative")
	}
	return d, nil
}

// parseSignal accepts KILL, SIGKILL, kill or a number.
func parseSignal(v string) (syscall.Signal, error) {
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

// ParseFaultFile reads one spec per line; blank lines and lines starting
// with # are skipped. name is used in errors ("name:line").
func ParseFaultFile(r io.Reader, name string) ([]Fault, error) {
	var out []Fault
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f, err := ParseFault(line)
		if err != nil {
			var se *FaultSpecError
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

// injection is one scheduled fault against a set of ranks.
type injection struct {
	// id is the injection's index in the job's schedule (and report).
	id int
	// fault is the index of the Fault it comes from.
	fault int
	kind  FaultKind
	at    time.Duration
	ranks []int
	host  string
	sig   syscall.Signal
	// cont is how long after the stop the supervisor sends SIGCONT; 0 never.
	// For slow, how long the slowing lasts.
	cont time.Duration
	// duty and period drive slow (inject_chaos.go).
	duty   float64
	period time.Duration
	// afterSteps, when positive, makes the injection wait in the
	// supervisor until a target rank reports this step (at is then 0: the
	// job loop hands it over as soon as the world runs).
	afterSteps int64
}

// maxRandomInjections bounds how many kills a random spec expands to.
const maxRandomInjections = 10000

// schedule checks faults against the plan (a rank must exist, a host must
// run ranks) and returns the injections in time order (ties keep the order
// the faults were given in). A random fault expands into kills up to
// horizon (at most maxRandomInjections): inter-arrival times are
// exponential with mean MTBF and ranks uniform, both drawn from a PCG
// seeded with Seed, so the same seed and world size give the same
// schedule.
func schedule(faults []Fault, plan *Plan, horizon time.Duration) ([]injection, error) {
	var out []injection
	for i, f := range faults {
		bad := func(format string, a ...any) ([]injection, error) {
			return nil, &FaultSpecError{Spec: f.Spec, Why: fmt.Sprintf(format, a...)}
		}
		switch f.Kind {
		case FaultKill, FaultStop, FaultCont:
			if f.Rank >= plan.WorldSize {
				return bad("rank %d does not exist (the job has ranks 0-%d)", f.Rank, plan.WorldSize-1)
			}
			inj := injection{fault: i, kind: f.Kind, at: f.At, ranks: []int{f.Rank}, host: plan.Ranks[f.Rank].Host, afterSteps: f.AfterSteps}
			switch f.Kind {
			case FaultKill:
				inj.sig = f.Signal
			case FaultStop:
				inj.sig, inj.cont = syscall.SIGSTOP, f.For
			case FaultCont:
				inj.sig = syscall.SIGCONT
			}
			out = append(out, inj)
		case FaultKillHost:
			var names []string
			found := false
			for _, n := range plan.Nodes {
				names = append(names, n.Name)
				if n.Name == f.Host && n.Ranks > 0 {
					found = true
					inj := injection{fault: i, kind: f.Kind, at: f.At, host: n.Name, sig: f.Signal, afterSteps: f.AfterSteps}
					for r := n.FirstRank; r < n.FirstRank+n.Ranks; r++ {
						inj.ranks = append(inj.ranks, r)
					}
					out = append(out, inj)
					break
				}
			}
			if !found {
				return bad("host %q runs no rank of this job (its hosts: %s)", f.Host, strings.Join(names, ", "))
			}
		case FaultSlow, FaultKind(netfault.Drop), FaultKind(netfault.Delay), FaultKind(netfault.Corrupt), FaultKind(netfault.Partition):
			inj, err := scheduleChaos(i, f, plan)
			if err != nil {
				return nil, err
			}
			out = append(out, inj)
		case FaultRandom:
			rng := rand.New(rand.NewPCG(f.Seed, 0x9e3779b97f4a7c15))
			at := time.Duration(0)
			for range maxRandomInjections {
				// Exponential inter-arrival: a memoryless failure process
				// with the given mean, as a constant failure rate implies.
				gap := time.Duration(rng.ExpFloat64() * float64(f.MTBF))
				if gap > horizon || at > horizon-gap || at+gap > math.MaxInt64/2 {
					break
				}
				at += gap
				r := rng.IntN(plan.WorldSize)
				out = append(out, injection{fault: i, kind: FaultKill, at: at, ranks: []int{r}, host: plan.Ranks[r].Host, sig: f.Signal})
			}
		default:
			return bad("unknown kind %q", f.Kind)
		}
	}
	slices.SortStableFunc(out, func(a, b injection) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	for i := range out {
		out[i].id = i
	}
	return out, nil
}

// randomHorizon is how far a random fault's kills are planned when the job
// has no --timeout: longer than any job a fault test runs.
const randomHorizon = 7 * 24 * time.Hour
