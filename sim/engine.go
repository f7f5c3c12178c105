package sim

import (
	"container/heap"
	"math/rand/v2"
	"time"
)

// Sim is a virtual clock and its event queue. Events at the same instant
// run in the order they were scheduled, so a run is a deterministic
// function of its seed. Not safe for concurrent use.
type Sim struct {
	now    time.Duration
	q      eventHeap
	seq    uint64
	rng    *rand.Rand
	events int // events run so far
	// lastAt is the time of the last event run: Run checks that time never
	// goes backwards (causality).
	lastAt time.Duration
}

// NewSim returns an empty simulation whose random choices follow seed.
func NewSim(seed uint64) *Sim {
	return &Sim{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Now is the virtual time.
func (s *Sim) Now() time.Duration { return s.now }

// Events is the number of events run so far.
func (s *Sim) Events() int { return s.events }

// At schedules fn at virtual time t (now if t is in the past).
func (s *Sim) At(t time.Duration, fn func()) {
	if t < s.now {
		t = s.now
	}
	s.seq++
	heap.Push(&s.q, event{at: t, seq: s.seq, fn: fn})
}

// After schedules fn d from now.
func (s *Sim) After(d time.Duration, fn func()) { s.At(s.now+d, fn) }

// Jitter returns a duration uniform in [d/2, 3d/2), the jitter the real
// code puts on its retries and rejoins.
func (s *Sim) Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + time.Duration(s.rng.Int64N(int64(d)))
}

// Run runs events until the queue is empty, until is passed, or stop
// returns true (checked after every event). It returns the virtual time
// reached.
func (s *Sim) Run(until time.Duration, stop func() bool) time.Duration {
	for s.q.Len() > 0 {
		if s.q[0].at > until {
			s.now = until
			return s.now
		}
		e := heap.Pop(&s.q).(event)
		if e.at < s.lastAt {
			panic("sim: event queue ran backwards") // a bug in the heap, not input
		}
		s.now, s.lastAt = e.at, e.at
		s.events++
		e.fn()
		if stop != nil && stop() {
			break
		}
	}
	return s.now
}

type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// CPU is a host's processor: cores that each run one handler at a time, in
// the order handlers were submitted. A handler's cost delays every handler
// queued behind it; this queue is what keeps thousands of simulated members
// from getting free CPU. Several hosts may share one CPU (a calibration run
// of the in-process benchmark: every member in one process on two cores).
type CPU struct {
	s    *Sim
	free []time.Duration // per core: when it is next idle
	// Busy is the CPU time charged so far.
	Busy time.Duration
	// Free makes every handler cost nothing (Costs unchanged): only for
	// the test that shows the queue matters.
	Free bool
}

// NewCPU returns a CPU with cores cores (at least one).
func NewCPU(s *Sim, cores int) *CPU {
	return &CPU{s: s, free: make([]time.Duration, max(1, cores))}
}

// Exec runs fn once cost of CPU time has been spent on the earliest free
// core, starting no earlier than now.
func (c *CPU) Exec(cost time.Duration, fn func()) {
	if c.Free {
		cost = 0
	}
	k := 0
	for i, f := range c.free {
		if f < c.free[k] {
			k = i
		}
	}
	start := max(c.s.now, c.free[k])
	c.free[k] = start + cost
	c.Busy += cost
	if fn != nil {
		c.s.At(start+cost, fn)
	}
}

// Net is the network between hosts: a one-way latency and, per host, a
// link of Bandwidth bytes per second that serialises what the host sends.
type Net struct {
	s         *Sim
	Latency   time.Duration
	Bandwidth float64 // bytes per second per host link; 0 is unlimited
	nicFree   map[int]time.Duration
	// Sent counts the bytes each host has sent, by kind of traffic.
	Sent  map[string][]int64
	hosts int
	// Extra, when set, is added to the latency of a message to host to
	// (the receiver's wake-up, WorldConfig's wake excess).
	Extra func(to int) time.Duration
}

// NewNet returns a network of hosts hosts.
func NewNet(s *Sim, hosts int, latency time.Duration, bandwidth float64) *Net {
	return &Net{s: s, Latency: latency, Bandwidth: bandwidth, nicFree: map[int]time.Duration{},
		Sent: map[string][]int64{}, hosts: hosts}
}

// Send delivers bytes from host from to host to and runs fn on arrival
// (the receiver's handler is fn's to charge). kind labels the traffic.
func (n *Net) Send(from, to int, bytes int, kind string, fn func()) {
	t := n.s.now
	if n.Bandwidth > 0 {
		start := max(t, n.nicFree[from])
		t = start + time.Duration(float64(bytes)/n.Bandwidth*float64(time.Second))
		n.nicFree[from] = t
	}
	if n.Sent[kind] == nil {
		n.Sent[kind] = make([]int64, n.hosts)
	}
	n.Sent[kind][from] += int64(bytes)
	if n.Extra != nil {
		t += n.Extra(to)
	}
	n.s.At(t+n.Latency, fn)
}
