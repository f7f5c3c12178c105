package netfault

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Kind names what a data-plane fault does to a link.
type Kind string

// The data-plane fault kinds.
const (
	// Drop closes the links of Rank (to Peer, or to every peer) at At: both
	// ends see their connection break.
	Drop Kind = "drop"
	// Delay holds every frame Rank sends (to Peer, or to every peer) for
	// Delay before it leaves, from At for For (for ever when For is 0).
	Delay Kind = "delay"
	// Corrupt flips one bit of the first frame Rank sends (to Peer, or to
	// any peer) at or after At, after its checksum was computed: the
	// receiver must refuse it.
	Corrupt Kind = "corrupt"
	// Partition cuts every link between a rank of Ranks (or a rank on a
	// host of Hosts) and a rank not in it from At for For. Frames are held while it lasts (as TCP keeps
	// retransmitting), so a partition shorter than Lease heals with nothing
	// lost; at Lease into it (For 0 or For >= Lease) both ends of every cut
	// link close it and report the peer across the cut.
	Partition Kind = "partition"
)

// Kinds lists the data-plane kinds, for messages.
var Kinds = []Kind{Drop, Delay, Corrupt, Partition}

// IsKind reports whether k is a data-plane fault kind.
func IsKind(k string) bool { return slices.Contains(Kinds, Kind(k)) }

// DefaultLease is how long a partition may last before the cut links are
// declared lost: the rendezvous's gossip lease, so that a cut inside the
// transport is named as soon as a real cut between hosts would be.
const DefaultLease = 4 * time.Second

// Env carries the job's data-plane faults to every rank: specs separated by
// ";". EpochEnv is the time their at= counts from, in Unix nanoseconds (the
// job's start, set by gorun); without it a rank counts from the first time
// it reads Env (a direct launch should set it: every rank then agrees).
const (
	Env      = "GORUN_NETFAULT"
	EpochEnv = "GORUN_NETFAULT_EPOCH"
)

// Spec is one parsed data-plane fault.
type Spec struct {
	// Text is the spec as written, for messages.
	Text string
	Kind Kind
	// Rank is the world rank whose links drop, delay and corrupt act on;
	// -1 for partition.
	Rank int
	// Peer restricts drop, delay and corrupt to the link to this world
	// rank; -1 means every link of Rank.
	Peer int
	// Ranks is one side of a partition (sorted, distinct); Hosts, when
	// set instead, is that side as the hosts its ranks run on (names as
	// the job's hostfile and the ranks' Group.Host give them).
	Ranks []int
	Hosts []string
	// At is when the fault starts, from the epoch; For how long it lasts
	// (0: for ever) for delay and partition.
	At, For time.Duration
	// AfterSteps, when positive, replaces At: the fault starts on each
	// rank it acts in once that rank has reported this many steps
	// (ReportStep; rank.ReportStep, gorun_report_step). Ranks running one
	// collective loop reach step N within a step of each other, so both
	// ends of a partitioned link start holding within that step.
	AfterSteps int64
	// Delay is how long delay holds each frame.
	Delay time.Duration
	// Lease is how long a partition lasts before its links are lost.
	Lease time.Duration
}

// SpecError is a spec that cannot be used; Why names the part at fault.
type SpecError struct {
	Spec string
	Why  string
}

func (e *SpecError) Error() string { return fmt.Sprintf("netfault: %q: %s", e.Spec, e.Why) }

// keys lists, per kind, the keys it requires and those it accepts.
// "when" stands for at= or after-steps= (exactly one); "side" for ranks=
// or hosts= (exactly one).
var keys = map[Kind]struct{ required, optional []string }{
	Drop:      {[]string{"rank", "when"}, []string{"peer"}},
	Delay:     {[]string{"rank", "ms", "when"}, []string{"peer", "for"}},
	Corrupt:   {[]string{"rank", "when"}, []string{"peer"}},
	Partition: {[]string{"side", "when"}, []string{"for", "lease"}},
}

// pseudo maps a key to the pseudo-key it stands for in keys.
func pseudo(k string) string {
	switch k {
	case "at", "after-steps":
		return "when"
	case "ranks", "hosts":
		return "side"
	}
	return k
}

// spelled says a pseudo-key as the user writes it.
func spelled(k string) string {
	switch k {
	case "when":
		return "at= or after-steps="
	case "side":
		return "ranks= or hosts="
	}
	return k + "="
}

// Parse parses one spec, e.g. "drop:rank=1:peer=2:at=1s",
// "delay:rank=1:ms=50:after-steps=5:for=2s", "corrupt:rank=1:at=1s",
// "partition:ranks=0-1:at=1s:for=3s" or "partition:hosts=h2,h3:after-steps=10".
// It refuses an unknown kind or key, a key given twice, a missing key, both
// at= and after-steps= (or ranks= and hosts=), and a value that does not
// parse, naming the part; world-size and host checks are Check's and
// CheckHosts'.
func Parse(text string) (Spec, error) {
	bad := func(format string, a ...any) (Spec, error) {
		return Spec{}, &SpecError{Spec: text, Why: fmt.Sprintf(format, a...)}
	}
	parts := strings.Split(text, ":")
	kind := Kind(strings.TrimSpace(parts[0]))
	ks, ok := keys[kind]
	if !ok {
		return bad("unknown kind %q: expected drop, delay, corrupt or partition", kind)
	}
	s := Spec{Text: text, Kind: kind, Rank: -1, Peer: -1}
	if kind == Partition {
		s.Lease = DefaultLease
	}
	seen := map[string]string{} // pseudo-key -> the key given
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return bad("field %q: expected key=value", p)
		}
		pk := pseudo(k)
		if !slices.Contains(ks.required, pk) && !slices.Contains(ks.optional, pk) {
			var takes []string
			for _, t := range append(slices.Clone(ks.required), ks.optional...) {
				takes = append(takes, strings.TrimSuffix(spelled(t), "="))
			}
			return bad("key %q does not apply to %s (it takes %s)", k, kind, strings.Join(takes, ", "))
		}
		if prev, dup := seen[pk]; dup {
			if prev == k {
				return bad("key %q given twice", k)
			}
			if pk == "when" {
				return bad("at= and after-steps= both given: a fault starts at a time or after a step, not both")
			}
			return bad("ranks= and hosts= both given: a partition's side is a set of ranks or of hosts, not both")
		}
		seen[pk] = k
		if v == "" {
			return bad("%s= has no value", k)
		}
		var err error
		switch k {
		case "rank":
			s.Rank, err = nonNegative(v)
		case "peer":
			s.Peer, err = nonNegative(v)
		case "ranks":
			s.Ranks, err = parseRanks(v)
		case "hosts":
			s.Hosts, err = parseHosts(v)
		case "at":
			s.At, err = duration(v)
		case "after-steps":
			var n int
			n, err = nonNegative(v)
			if err == nil && n == 0 {
				err = errors.New("must be at least 1 (use at=0s for a fault from the start)")
			}
			s.AfterSteps = int64(n)
		case "for":
			s.For, err = duration(v)
			if err == nil && s.For == 0 {
				err = errors.New("must be positive (leave for= out for a fault that does not end)")
			}
		case "lease":
			s.Lease, err = duration(v)
			if err == nil && s.Lease < time.Millisecond {
				err = errors.New("must be at least 1ms")
			}
		case "ms":
			var n int
			n, err = nonNegative(v)
			s.Delay = time.Duration(n) * time.Millisecond
			if err == nil && n == 0 {
				err = errors.New("must be positive")
			}
		}
		if err != nil {
			return bad("%s=%s: %v", k, v, err)
		}
	}
	for _, k := range ks.required {
		if _, ok := seen[k]; !ok {
			return bad("%s needs %s", kind, spelled(k))
		}
	}
	if s.Peer >= 0 && s.Peer == s.Rank {
		return bad("peer=%d is rank= itself: a rank has no link to itself", s.Peer)
	}
	return s, nil
}

// parseHosts reads "h2" or "h2,h3": a set of host names.
func parseHosts(v string) ([]string, error) {
	var out []string
	for _, h := range strings.Split(v, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return nil, errors.New("an empty host name (write hosts=h2,h3)")
		}
		if strings.ContainsAny(h, ";= ") {
			return nil, fmt.Errorf("%q is not a host name", h)
		}
		out = append(out, h)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func nonNegative(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errors.New("not a whole number")
	}
	if n < 0 {
		return 0, errors.New("must not be negative")
	}
	return n, nil
}

func duration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, errors.New("not a duration (write e.g. 500ms, 2s)")
	}
	if d < 0 {
		return 0, errors.New("must not be negative")
	}
	return d, nil
}

// parseRanks reads "0-1", "0,2,5" or "0-1,4": a set of world ranks.
func parseRanks(v string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(v, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := nonNegative(lo)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", part, err)
		}
		b := a
		if isRange {
			if b, err = nonNegative(hi); err != nil {
				return nil, fmt.Errorf("%q: %v", part, err)
			}
			if b < a {
				return nil, fmt.Errorf("%q: range runs backwards", part)
			}
			if b-a > 1<<16 {
				return nil, fmt.Errorf("%q: range too large", part)
			}
		}
		for r := a; r <= b; r++ {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Check refuses a spec that names a rank the job does not have, or a
// partition that leaves one side empty.
func (s Spec) Check(worldSize int) error {
	bad := func(format string, a ...any) error {
		return &SpecError{Spec: s.Text, Why: fmt.Sprintf(format, a...)}
	}
	for _, r := range append([]int{s.Rank, s.Peer}, s.Ranks...) {
		if r >= worldSize {
			return bad("rank %d does not exist (the job has ranks 0-%d)", r, worldSize-1)
		}
	}
	if s.Kind == Partition && len(s.Hosts) == 0 && len(s.Ranks) >= worldSize {
		return bad("ranks=%s leaves no rank on the other side", strings.Split(strings.SplitN(s.Text, "ranks=", 2)[1], ":")[0])
	}
	return nil
}

// CheckHosts refuses a partition by hosts that names a host the job does
// not run on, or that puts every host of the job on one side. hosts are
// the job's hosts (a rank's host each, repeats allowed).
func (s Spec) CheckHosts(hosts []string) error {
	if len(s.Hosts) == 0 {
		return nil
	}
	have := slices.Compact(slices.Sorted(slices.Values(hosts)))
	for _, h := range s.Hosts {
		if !slices.Contains(have, h) {
			return &SpecError{Spec: s.Text, Why: fmt.Sprintf("host %q runs no rank of the job (its hosts: %s)", h, strings.Join(have, ", "))}
		}
	}
	if len(s.Hosts) >= len(have) {
		return &SpecError{Spec: s.Text, Why: "hosts= names every host of the job: no rank is left on the other side"}
	}
	return nil
}

// Touches reports whether the spec acts on the link between world ranks
// me and peer, as seen from me; meHost and peerHost are where they run
// (only a partition by hosts looks at them).
func (s Spec) Touches(me, peer int, meHost, peerHost string) bool {
	switch {
	case s.Kind == Partition && len(s.Hosts) > 0:
		return slices.Contains(s.Hosts, meHost) != slices.Contains(s.Hosts, peerHost)
	case s.Kind == Partition:
		return slices.Contains(s.Ranks, me) != slices.Contains(s.Ranks, peer)
	default:
		return s.Rank == me && (s.Peer < 0 || s.Peer == peer)
	}
}

// Encode joins specs for Env.
func Encode(specs []Spec) string {
	texts := make([]string, len(specs))
	for i, s := range specs {
		texts[i] = s.Text
	}
	return strings.Join(texts, ";")
}

// Decode parses Env's value.
func Decode(v string) ([]Spec, error) {
	var out []Spec
	for _, t := range strings.Split(v, ";") {
		if t = strings.TrimSpace(t); t == "" {
			continue
		}
		s, err := Parse(t)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Plan is what a rank's environment arms: the specs and the epoch their
// times count from.
type Plan struct {
	Specs []Spec
	Epoch time.Time
}

// FromEnv reads Env and EpochEnv. ok is false when Env is unset or empty:
// nothing is armed and the transport runs as if this package did not exist.
func FromEnv() (p Plan, ok bool, err error) {
	v := os.Getenv(Env)
	if strings.TrimSpace(v) == "" {
		return Plan{}, false, nil
	}
	p.Specs, err = Decode(v)
	if err != nil {
		return Plan{}, false, fmt.Errorf("%s: %w", Env, err)
	}
	p.Epoch = time.Now()
	if e := os.Getenv(EpochEnv); e != "" {
		ns, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return Plan{}, false, fmt.Errorf("%s=%q: not Unix nanoseconds", EpochEnv, e)
		}
		p.Epoch = time.Unix(0, ns)
	}
	return p, len(p.Specs) > 0, nil
}

// Steps: after-steps=N faults start when this process has reported N
// steps. The rank runtime calls ReportStep with each step it reports to
// its supervisor; the transport waits on a StepGate per N.

// StepGate opens once this process has reported step N.
type StepGate struct {
	n    int64
	done chan struct{}
	at   time.Time // when it opened; written before done is closed
}

// Done is closed once the step was reported.
func (g *StepGate) Done() <-chan struct{} { return g.done }

// At is when the step was reported (valid once Done is closed).
func (g *StepGate) At() time.Time { return g.at }

var steps struct {
	mu    sync.Mutex
	last  int64 // the highest step reported
	gates map[int64]*StepGate
}

// Gate returns the process's gate for step n (one per n). A gate asked
// for after the step was reported opens at once, dated now: the faults
// that use it are made with the communicators, before their steps.
func Gate(n int64) *StepGate {
	steps.mu.Lock()
	defer steps.mu.Unlock()
	if g, ok := steps.gates[n]; ok {
		return g
	}
	if steps.gates == nil {
		steps.gates = map[int64]*StepGate{}
	}
	g := &StepGate{n: n, done: make(chan struct{})}
	steps.gates[n] = g
	if steps.last >= n {
		g.at = time.Now()
		close(g.done)
	}
	return g
}

// ReportStep records that this process finished step n and opens the
// gates it reaches. Cheap when no gate exists: once per training step,
// never per frame.
func ReportStep(n int64) {
	steps.mu.Lock()
	defer steps.mu.Unlock()
	if n <= steps.last {
		return
	}
	steps.last = n
	now := time.Now()
	for k, g := range steps.gates {
		if k <= n {
			select {
			case <-g.done:
			default:
				g.at = now
				close(g.done)
			}
		}
	}
}
