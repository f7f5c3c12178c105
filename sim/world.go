package sim

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gorun-hpc/gorun/rendezvous"
)

// WorldConfig is one simulated job's rendezvous: hosts × ranks per host in
// host-leader mode, the machines they run on, and the real timings.
type WorldConfig struct {
	Hosts, PerHost int
	// Cores is each host's core count. SharedCores > 0 puts every host on
	// one CPU of that many cores instead (the in-process benchmark).
	Cores, SharedCores int
	// Latency is the one-way network latency between hosts; Bandwidth each
	// host link's bytes per second (0: unlimited).
	Latency   time.Duration
	Bandwidth float64
	// LocalLatency is the delay of one message between a leader and an
	// attached rank of its host (the attach stream: another process to
	// wake). 0 makes that hand-off immediate.
	LocalLatency time.Duration
	// ExitDelay is how long a SIGKILLed rank's process takes to die
	// before its attach stream closes (the kernel frees its memory before
	// it closes its files). 0 closes the stream at the signal.
	ExitDelay time.Duration
	// StartSpread spreads the ranks' start times uniformly over
	// [0, StartSpread); formation is counted from the last start.
	StartSpread time.Duration
	// Starts, when set, is each rank's start time instead (len Hosts ×
	// PerHost, rank order): a calibration replays the start times the
	// ranks of a real launch reported, so that the model forms from the
	// same arrivals as the real job did.
	Starts []time.Duration
	// InProcess puts every rank in one process (the in-process
	// benchmark): no rank pays Costs.ProcessStart. Otherwise each rank is
	// its own process, as in a real job.
	InProcess bool
	// Rdzv holds the timings gorun uses (rendezvous.DefaultConfig()).
	Rdzv  rendezvous.Config
	Costs Costs
	Seed  uint64
	// ReportFormed: each rank prints a line when it forms (the
	// calibration's rank program does), which its agent and gorun relay
	// on the cores of its host and of the launch node (Costs.LineHost,
	// LineLauncher). Not for ranks in one process.
	ReportFormed bool
	// PushTree models rendezvous's relayed push at formation (pushPlan):
	// the seed's push relayed through √H leaders. Off, the seed pushes to
	// every leader, as rendezvous did before.
	PushTree bool
}

// Validate reports the first problem with c.
func (c *WorldConfig) Validate() error {
	switch {
	case c.Hosts < 1:
		return fmt.Errorf("sim: Hosts %d < 1", c.Hosts)
	case c.PerHost < 2:
		return fmt.Errorf("sim: PerHost %d < 2 (host-leader mode needs at least one attached rank)", c.PerHost)
	case c.Cores < 1 && c.SharedCores < 1:
		return fmt.Errorf("sim: Cores %d and SharedCores %d: a host needs a CPU", c.Cores, c.SharedCores)
	case c.Rdzv.ProbeInterval <= 0 || c.Rdzv.GossipInterval <= 0:
		return fmt.Errorf("sim: Rdzv timings unset (start from rendezvous.DefaultConfig())")
	case c.Starts != nil && len(c.Starts) != c.Hosts*c.PerHost:
		return fmt.Errorf("sim: Starts holds %d start times for %d×%d ranks", len(c.Starts), c.Hosts, c.PerHost)
	case c.Starts != nil && c.StartSpread > 0:
		return fmt.Errorf("sim: Starts and StartSpread both set; give one")
	}
	for r, t := range c.Starts {
		if t < 0 {
			return fmt.Errorf("sim: Starts[%d] = %v is before the run's start", r, t)
		}
	}
	return c.Costs.Validate()
}

// Counts are the operations a run charged, for fitting costs and for
// reports.
type Counts struct {
	Packets, PacketBytes, GossipMsgs int64
	PushPulls, StateBytes            int64
	// PushPullStates counts states encoded (two per push-pull that was
	// answered); StateNodes and StateRanks the entries they held.
	PushPullStates, StateNodes, StateRanks int64
	Attaches, TableEntries, RankStarts     int64
	LeaderStarts, FalseSuspicions          int64
}

// gossip message kinds (memberlist's alive/suspect/dead, rendezvous's
// kindGone).
const (
	msgAlive = iota
	msgSuspect
	msgDead
	msgGone
)

type bcast struct {
	kind, id, inc int
	transmits     int
	dropped       bool // invalidated by a newer message about the same node
}

// leader is one host's gossip member (local rank 0) and the World it
// holds.
type leader struct {
	h                    int
	listening, joined    bool
	silent               bool // the host stopped answering (detection runs)
	attached             int
	knowsHost, knowsRank []bool // memberlist's alive view; attached entries known
	everKnown            []bool
	known                []int // hosts ever known, in the order learned
	nKnown               int   // hosts alive in the view, this one included
	inc                  []int // incarnation seen per host
	suspectAt            []time.Duration
	aliveN               int
	formed               bool
	buckets              [][]*bcast // the broadcast queue by send count (takeShare)
	queueN               int
	queued               map[[2]int]*bcast // (kind, id) → queued broadcast
	seenGone             map[int]bool
	perm                 []int
	probeIdx             int
	myInc                int
}

// World is a simulated job's rendezvous; see RunFormation and the
// detection runs.
type World struct {
	cfg      WorldConfig
	s        *Sim
	net      *Net
	cpu      []*CPU
	leaders  []*leader
	start    []time.Duration // per rank
	formedAt []time.Duration // per rank; -1 until formed
	// Count is what the run charged.
	Count Counts
	// lost[r] is when rank r learned of the current failure (-1: not yet).
	lost      []time.Duration
	lastStart time.Duration
	nFormed   int               // ranks formed
	nLost     int               // ranks with lost[r] ≥ 0
	pushShare map[int][]*leader // PushTree: who each first-level leader pushes to
	// firstSuspicion is when a member first suspected a silent host (-1:
	// not yet).
	firstSuspicion time.Duration
	udpBuf         int
	n              int
	// launcher is the CPU gorun runs on: the shared one in calibration,
	// a node of its own (Cores) otherwise.
	launcher *CPU
	// liveStarts holds, per host, the start times of the ranks on its
	// CPU (every rank when the CPU is shared), sorted: live processes
	// for the wake excess.
	liveStarts [][]time.Duration
}

// NewWorld builds the hosts, their CPUs and the network; nothing runs yet.
func NewWorld(cfg WorldConfig) (*World, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := NewSim(cfg.Seed)
	w := &World{cfg: cfg, s: s, net: NewNet(s, cfg.Hosts, cfg.Latency, cfg.Bandwidth),
		udpBuf: memberlist.DefaultLANConfig().UDPBufferSize, n: cfg.Hosts * cfg.PerHost, firstSuspicion: -1}
	var shared *CPU
	if cfg.SharedCores > 0 {
		shared = NewCPU(s, cfg.SharedCores)
		w.launcher = shared
	} else {
		w.launcher = NewCPU(s, cfg.Cores)
	}
	for h := range cfg.Hosts {
		c := shared
		if c == nil {
			c = NewCPU(s, cfg.Cores)
		}
		w.cpu = append(w.cpu, c)
		l := &leader{h: h, knowsHost: make([]bool, cfg.Hosts), knowsRank: make([]bool, cfg.Hosts), everKnown: make([]bool, cfg.Hosts),
			inc: make([]int, cfg.Hosts), suspectAt: make([]time.Duration, cfg.Hosts),
			queued: map[[2]int]*bcast{}, seenGone: map[int]bool{}}
		l.perm = s.rng.Perm(cfg.Hosts)
		w.leaders = append(w.leaders, l)
	}
	w.start = make([]time.Duration, w.n)
	w.formedAt = make([]time.Duration, w.n)
	w.lost = make([]time.Duration, w.n)
	for r := range w.n {
		w.formedAt[r], w.lost[r] = -1, -1
		switch {
		case cfg.Starts != nil:
			w.start[r] = cfg.Starts[r]
		case cfg.StartSpread > 0:
			w.start[r] = time.Duration(s.rng.Int64N(int64(cfg.StartSpread)))
		}
		w.lastStart = max(w.lastStart, w.start[r])
	}
	w.liveStarts = make([][]time.Duration, cfg.Hosts)
	for h := range cfg.Hosts {
		if shared != nil {
			if h == 0 {
				w.liveStarts[0] = slices.Sorted(slices.Values(w.start))
			}
			w.liveStarts[h] = w.liveStarts[0]
			continue
		}
		w.liveStarts[h] = slices.Sorted(slices.Values(w.start[h*cfg.PerHost : (h+1)*cfg.PerHost]))
	}
	if !cfg.InProcess {
		w.net.Extra = w.wake
	}
	return w, nil
}

// wake is the wake-up excess of a message to a rank process on host h:
// Costs.Wake at the rank processes started on h's CPU by now, per core.
// Ranks in one process (InProcess) wake no process: none.
func (w *World) wake(h int) time.Duration {
	if w.cfg.InProcess {
		return 0
	}
	starts := w.liveStarts[h]
	live, _ := slices.BinarySearchFunc(starts, w.s.now, func(a, t time.Duration) int {
		if a <= t {
			return -1
		}
		return 1
	})
	cores := w.cfg.Cores
	if w.cfg.SharedCores > 0 {
		cores = w.cfg.SharedCores
	}
	return w.cfg.Costs.Wake(float64(live) / float64(cores))
}

// localHop is the delay of one message between a leader and an attached
// rank of host h: LocalLatency and the receiver's wake excess.
func (w *World) localHop(h int) time.Duration { return w.cfg.LocalLatency + w.wake(h) }

// SetFreeCPU makes every handler free (for the test that shows the CPU
// queue matters).
func (w *World) SetFreeCPU() {
	for _, c := range w.cpu {
		c.Free = true
	}
}

// retransmitLimit is memberlist's retransmitLimit with the multiplier
// rendezvous's memberlistConfig sets in host-leader mode:
// max(Config.retransmitMult(hosts), 4).
func (w *World) retransmitLimit(known int) int {
	h := w.cfg.Hosts
	logH := int(math.Ceil(math.Log10(float64(h + 1))))
	const minRetransmits = 6 // rendezvous.minRetransmits
	mult := max(w.cfg.Rdzv.RetransmitMult, (minRetransmits+logH-1)/logH, 4)
	return mult * int(math.Ceil(math.Log10(float64(known+1))))
}

// suspicionTimeout is memberlist's suspicion timeout under the multiplier
// rendezvous's Config.suspicionMult chooses for the host count
// (SuspicionMaxTimeoutMult 1: confirmations do not shorten it).
func (w *World) suspicionTimeout() time.Duration {
	rc := &w.cfg.Rdzv
	scale := math.Max(1, math.Log10(float64(w.cfg.Hosts)))
	mult := max(1, int(math.Floor(float64(rc.SuspicionTimeout)/(scale*float64(rc.ProbeInterval)))))
	return time.Duration(mult) * time.Duration(scale*1000) * rc.ProbeInterval / 1000
}

func (w *World) rank(h, local int) int { return h*w.cfg.PerHost + local }

// Run runs the simulation until virtual time until or until stop.
func (w *World) Run(until time.Duration, stop func() bool) time.Duration { return w.s.Run(until, stop) }

// Now is the virtual time.
func (w *World) Now() time.Duration { return w.s.Now() }

// Events is the number of events run.
func (w *World) Events() int { return w.s.Events() }

// Busy is the CPU time charged on host h's CPU.
func (w *World) Busy(h int) time.Duration { return w.cpu[h].Busy }

// SentBytes is what host h sent of traffic kind ("gossip", "probe",
// "pushpull", "gone"), and the total over kinds when kind is "".
func (w *World) SentBytes(h int, kind string) int64 {
	var t int64
	for k, v := range w.net.Sent {
		if kind == "" || k == kind {
			t += v[h]
		}
	}
	return t
}

// FormedAll reports whether every rank has formed.
func (w *World) FormedAll() bool { return w.nFormed == w.n }

func (w *World) setFormed(r int) {
	if w.formedAt[r] < 0 {
		w.formedAt[r] = w.s.now
		w.nFormed++
		if w.cfg.ReportFormed && !w.cfg.InProcess {
			h, c := r/w.cfg.PerHost, &w.cfg.Costs
			w.cpu[h].Exec(c.LineHost, func() {
				w.s.After(w.cfg.Latency+w.wake(0), func() { w.launcher.Exec(c.LineLauncher, nil) })
			})
		}
	}
}

// Formation is the time from the last rank's start to the last rank's
// formation, and ok false when some rank never formed.
func (w *World) Formation() (time.Duration, bool) {
	var last time.Duration
	for _, t := range w.formedAt {
		if t < 0 {
			return 0, false
		}
		last = max(last, t)
	}
	return last - w.lastStart, true
}

// FormedAt is when rank r formed (-1: not yet).
func (w *World) FormedAt(r int) time.Duration { return w.formedAt[r] }

// StartedAt is when rank r started.
func (w *World) StartedAt(r int) time.Duration { return w.start[r] }

// ViewSize is how many ranks host h's leader counts alive.
func (w *World) ViewSize(h int) int { return w.leaders[h].aliveN }

// FirstSuspicion is when a member first suspected a silent host (-1: not
// yet).
func (w *World) FirstSuspicion() time.Duration { return w.firstSuspicion }
