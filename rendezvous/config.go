package rendezvous

import (
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/liveness"
)

// Config says who this rank is and how the world is formed. Build it with
// ConfigFromEnv (the usual way), or start from DefaultConfig or LocalConfig
// and fill in the identity fields. A Config is read by Join and not retained.
type Config struct {
	// JobID names the job. It labels every gossip packet (members of other
	// jobs are refused before decryption) and is part of every node name.
	// It must not contain '/' (memberlist's "name/addr" join syntax).
	JobID string
	// Generation is the world's number within its job — the epoch of the
	// job's rendezvous, not to be confused with World.Epoch, which counts
	// membership changes inside one world: the restart count under
	// gorun --max-restarts or torchrun (GORUN_RESTART_COUNT,
	// TORCHELASTIC_RESTART_COUNT), 0 in the first world. A member of an
	// older generation — a rank of a world that was torn down but lives on, say
	// behind a partition — is refused and the new world forms without it;
	// a member that meets a newer generation learns it is stale and fails
	// with ErrStale. Under gorun every world also has its own JobID and
	// secret; launchers that keep one job id across restarts (torchrun,
	// srun) rely on the generation alone.
	Generation uint64
	// Rank is this process's world rank, 0 ≤ Rank < WorldSize. Rank 0 binds
	// the seed address.
	Rank int
	// WorldSize is the number of ranks the world waits for.
	WorldSize int
	// LocalRank is the rank's index on its host; carried for the collective
	// layer (same-host ranks use shared memory) and for messages. With
	// host leaders (see LocalWorldSize), local rank 0 is the host's leader.
	LocalRank int
	// LocalWorldSize is the number of ranks on this rank's host (0 or 1:
	// alone). Above 1, and unless Flat is set, the host's ranks form the
	// world through one gossip member per host: local rank 0 (the leader)
	// joins the gossip and the host's other ranks attach to it over a local
	// socket (AttachNet), so gossip traffic and CPU grow with the host
	// count, not the rank count. Every rank of the job must agree on the
	// mode; rank 0 must be local rank 0 of its host.
	LocalWorldSize int
	// Flat forces one gossip member per rank even when ranks share a host
	// (the mode of LocalWorldSize ≤ 1). Measured here: flat gossip falsely
	// declares starved members dead from about 64 rank processes on two
	// cores; host leaders keep one member per host.
	Flat bool
	// AttachNet is how a host's ranks reach their leader; nil means
	// Unix-domain sockets in Linux's abstract namespace (no file to clean
	// up, reachable by name from every process of the host's network
	// namespace), named by an HMAC of Host under a key derived from
	// Secret (attach.go: another user cannot take the name first), peers
	// of another user refused (SO_PEERCRED). Tests use
	// rendezvoustest.AttachNet. Connections are authenticated with a key
	// derived from Secret in both directions. A connection that names its
	// peer's process (PeerCredConn) is judged as a Unix socket's is.
	AttachNet AttachNet
	// Host names this rank's host in every message ("rank 5 (host h2) lost").
	// It is a label, not an address.
	Host string
	// Seed is host:port of rank 0's gossip listener. Every rank but 0 joins
	// through it; rank 0 binds it. May be empty only when WorldSize is 1.
	Seed string
	// BindAddr is the IP the gossip listener binds; empty chooses: rank 0
	// binds the seed's IP when it is local (else all interfaces), the others
	// bind the address that routes to the seed, on a free port.
	BindAddr string
	// AdvertiseAddr is the IP other members reach this rank at; empty means
	// the local address the kernel would use to reach the seed (found with
	// a UDP "connect", which sends nothing), so a loopback seed gives a
	// loopback address and a remote seed the interface that routes to it,
	// never a docker bridge by accident.
	AdvertiseAddr string
	// DataAddr is the data-plane address (host:port) this rank advertises
	// for the collective layer; opaque here. Empty is allowed.
	DataAddr string
	// Secret is the job secret (≥ 16 bytes). The gossip key is derived from
	// it with HKDF-SHA-256, so gossip is encrypted and authenticated: a
	// process without it cannot join or read member data.
	Secret []byte
	// SecretDerived records that Secret was derived from public values
	// (torch-style or srun launch without GORUN_SECRET); Join then warns
	// that the job is not protected.
	SecretDerived bool
	// RankHosts optionally gives the host each rank is expected on (index =
	// rank), used only to name hosts of missing ranks in a formation
	// timeout. Nil is fine.
	RankHosts []string

	// FormationTimeout bounds Join: after it, Join fails listing the ranks
	// still missing. Large because a big launch can take a while to start
	// every process; progress is logged meanwhile.
	FormationTimeout time.Duration
	// ProgressInterval is the period of the "12/16 ranks joined" log line
	// while the world forms (rank 0 at info level, others at debug).
	ProgressInterval time.Duration
	// RejoinInterval is how long a rank that has joined but not yet seen the
	// whole world waits before it pulls the member table again (then every
	// 0.5-1.5 of it, in turn from a random member, from the seed, and from
	// a member gossip declared dead meanwhile, which the pull lets refute).
	// A backstop: the seed, or in a large world a relay, normally pushes
	// the table to everyone as soon as it has all members, and a lost push
	// costs a rank at most 3 RejoinInterval after the seed formed.
	RejoinInterval time.Duration
	// PushConcurrency bounds a member's concurrent table pushes (the
	// seed's, and a relay's: pushPlan). memberlist serves at most 128
	// concurrent push-pulls per node; the pushes also compete with the
	// members' own work for CPU. It also sets the size from which the
	// push is relayed: above 2·PushConcurrency gossip members.
	PushConcurrency int
	// LeaveLinger is how long Close keeps gossiping its leave message
	// before shutting down, so that it reaches members beyond the first few
	// (a member that misses it would later see a dead node and report a
	// failure that was a normal exit). Close stops early once no other
	// member is alive in its view: at the end of a job everyone leaves at
	// once, and memberlist's own wait (Leave's timeout) would then block
	// the last ones for its whole length, with nobody left to gossip to.
	LeaveLinger time.Duration
	// LeaveGrace is how long a barrier waits for a message from a member
	// that has just left gracefully: the message travels over TCP, the leave
	// over UDP, so the leave can overtake it.
	LeaveGrace time.Duration

	// Failure detection. Two kinds of evidence, judged differently:
	//   - A refused connection to a member's gossip port (its host is up
	//     and says nobody listens there: the process exited or was
	//     killed) is proof. The member is lost a RefusedGrace later,
	//     unless its goodbye arrives meanwhile, and the others are told at
	//     once: about 0.5 s after a crash (doubt.go).
	//   - Silence (no probe answered over UDP, and no TCP connection
	//     either) is not: a frozen process, a host that is down and a
	//     network cut look alike, and a cut may heal. memberlist's SWIM
	//     suspects the member after a failed probe round and declares it
	//     dead SuspicionTimeout later; the World then keeps trying to
	//     reach it over TCP (push-pulls, which let it refute a suspicion
	//     it could not hear over UDP) until GossipLease has passed since
	//     the suspicion began, and only then counts it lost. So a
	//     partition or a gossip-only (UDP) cut shorter than the lease
	//     heals, and silence is named after about GossipLease.

	// ProbeInterval is how often each member probes another one.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe waits for an ack before asking other
	// members to probe indirectly. Lifeguard stretches it on a member that
	// itself falls behind, which protects loaded hosts from false reports.
	ProbeTimeout time.Duration
	// GossipInterval is how often each member gossips queued messages (joins,
	// suspicions, deaths) to GossipNodes others; it bounds how fast a death
	// spreads.
	GossipInterval time.Duration
	// GossipNodes is the gossip fan-out per interval.
	GossipNodes int
	// SuspicionTimeout bounds the time a suspected member has to refute
	// the suspicion before memberlist declares it dead (the World then
	// doubts that verdict until GossipLease, above). memberlist
	// multiplies its own suspicion timeout by log10(size); Join converts
	// this target into memberlist's SuspicionMult for the world size, so
	// detection stays flat from 16 to 1024 members.
	SuspicionTimeout time.Duration
	// GossipLease is how long a gossip member that answers nothing is
	// trusted, counted from memberlist's suspicion: a member memberlist
	// declared dead is lost only if it has not answered again, over UDP
	// or TCP, GossipLease − SuspicionTimeout later. It must exceed
	// SuspicionTimeout. GORUN_RDZV_LEASE sets it with AttachLease: one
	// lease for every silence the runtime judges (gossip, attach streams,
	// comm's links).
	GossipLease time.Duration
	// RefusedGrace is how long a member whose gossip port refused a
	// connection may still say goodbye before it is lost: a member that
	// leaves sends its goodbye before it closes its listener (LeaveLinger
	// earlier), so a refusal that follows a goodbye is a leave.
	RefusedGrace time.Duration
	// RetransmitMult sets how many times a gossip message is retransmitted
	// (RetransmitMult · ceil(log10(size+1)), raised to at least 6 in small
	// worlds: see minRetransmits).
	RetransmitMult int
	// IndirectChecks is the number of members asked to probe a member that
	// missed a direct probe.
	IndirectChecks int
	// TCPTimeout bounds memberlist's TCP work (push-pull, reliable
	// messages, fallback probes).
	TCPTimeout time.Duration
	// PushPullInterval is the period of memberlist's anti-entropy full
	// state sync (scaled up by memberlist beyond 32 members).
	PushPullInterval time.Duration

	// AttachBeat is how often each end of an attach stream (a host's
	// rank and its leader, host leader mode) says it is alive when it has
	// nothing else to send. AttachLease is how long a silent stream is
	// trusted: past it the other end is declared lost as frozen or
	// unresponsive (ErrSilent). A stopped process keeps its socket open,
	// so without the lease a frozen rank or leader on a one-host job
	// would never be noticed (no gossip member watches it). The lease is
	// the freeze detection time; GORUN_RDZV_LEASE overrides it.
	AttachBeat  time.Duration
	AttachLease time.Duration
	// StarvedLimit is how long a peer on this host may stay silent on its
	// attach stream while the kernel shows its process alive (running,
	// waiting for the CPU or the disk, or having run since the last
	// look): past AttachLease such a peer is starved, not frozen, and is
	// judged again every AttachLease/4 (internal/liveness,
	// notes/verdicts.md). Past StarvedLimit it is lost as unresponsive
	// whatever the kernel says. A stopped peer is named at AttachLease,
	// a dead one at its stream's end. 0: no limit.
	StarvedLimit time.Duration

	// procSample, when set, replaces the kernel as the attach streams'
	// judge's evidence (internal/liveness): tests fake a peer's process.
	procSample liveness.Sampler
	// pushHook, when set, is called before each push of the member table
	// (pushTable) with the pushing and the receiving rank; false skips the
	// push, as if it failed. Tests count pushes and lose them with it.
	pushHook func(from, to int) bool

	// Transport replaces memberlist's UDP/TCP transport; tests use the
	// in-memory network of package rendezvoustest. When set, the transport
	// decides the bind and advertise addresses and Seed must be an address
	// on it.
	Transport memberlist.NodeAwareTransport
	// Logger receives this package's log lines and memberlist's (debug
	// and above mapped onto zerolog levels). The zero value discards.
	Logger zerolog.Logger
	// Attached, when set, is called once by Join in a rank that attaches
	// to its host leader (host leader mode), right after its hello went
	// out: from then on the leader counts it, and watches it under the
	// lease, though the world may not have formed. For progress
	// reporting, and for fault tests that must act at exactly that point.
	Attached func()
}

// DefaultConfig returns the settings for real jobs on a LAN or one host:
// a crashed member lost in about half a second, a silent one after the
// 4 s lease, generous formation timeout for large launches. Identity fields (JobID, Rank, WorldSize, Seed, Secret, ...) are
// left empty.
func DefaultConfig() Config {
	return Config{
		// A launch of thousands of processes over ssh or srun takes tens of
		// seconds; a silent wait is avoided by the progress log, not by a
		// short timeout.
		FormationTimeout: 120 * time.Second,
		// "At most every few seconds": readable, not a flood.
		ProgressInterval: 3 * time.Second,
		// Long enough that the seed's push normally arrives first.
		RejoinInterval: 2 * time.Second,
		// Well under memberlist's 128 concurrent push-pulls; more does not
		// help on a host with few cores.
		PushConcurrency: 16,
		// Five gossip rounds: memberlist transmits a message
		// RetransmitMult·⌈log10(n+1)⌉ times (8 at 16 members, 3 targets a
		// round), and every receiver passes it on as well.
		LeaveLinger: 100 * time.Millisecond,
		LeaveGrace:  2 * time.Second,
		// Measured here (notes/dependencies.md): 200/100/20 ms probing
		// finds a silent member within a probe round or two at 16 and 64
		// members; 150 ms of probe timeout spares members of an
		// overloaded host (64 rank processes starting at once on two busy
		// cores formed in 2-3 of 5 runs, against 0 of 5 with 100 ms).
		ProbeInterval:  200 * time.Millisecond,
		ProbeTimeout:   150 * time.Millisecond,
		GossipInterval: 20 * time.Millisecond,
		GossipNodes:    3,
		// Half the lease: long enough that a partition of a second or
		// two heals inside memberlist (the suspect hears the suspicion
		// with the next probe after the heal and refutes it), leaving the
		// World's TCP attempts for longer or UDP-only cuts. 800 ms (the
		// old value) declared a host cut off for 1 s dead at 1.2 s
		// (notes/faults.md, hosts/iptables/heal-1s).
		SuspicionTimeout: 2 * time.Second,
		// The lease every silence is judged by (attach streams below,
		// comm's links): a crash is found sooner by a refused
		// connection or a closed socket, so the lease only bounds
		// freezes, cuts and dead hosts, where gorun promises a named
		// verdict within 10 s and that cuts shorter than the lease heal.
		GossipLease: 4 * time.Second,
		// Two probe intervals after a refusal: a leaving member's
		// goodbye went out LeaveLinger before its listener closed.
		RefusedGrace: 400 * time.Millisecond,
		// Every receiver relays a message too; 4 (memberlist's LAN
		// default) made the join gossip at formation cost twice the CPU
		// at 256 members in one process. Below 100 members 2 is too few
		// for a death to reach everyone: memberlistConfig raises it
		// there (minRetransmits).
		RetransmitMult: 2,
		IndirectChecks: 3,
		TCPTimeout:     2 * time.Second,
		// Anti-entropy is a backstop here (the seed pushes the full table
		// at formation); every push-pull costs O(size) on both sides.
		PushPullInterval: 30 * time.Second,
		// 16 beats per lease: a rank starved of CPU for a few seconds
		// (32 ranks and a CPU hog on two cores, notes/faults.md) is
		// not taken for a frozen one, and a frozen one is named in
		// about 4 s, well within the promised 10 s.
		AttachBeat:  250 * time.Millisecond,
		AttachLease: 4 * time.Second,
		// A minute: starvation on a machine loaded 20-50 times over its
		// cores silences a healthy rank for seconds, not a minute; a
		// process that runs but says nothing for a minute is broken.
		StarvedLimit: time.Minute,
	}
}

// LocalConfig returns DefaultConfig with short waits for tests and laptops:
// formation fails after 20 s instead of 2 minutes, progress every second.
// Failure detection is the same as DefaultConfig's (already loopback-fast).
func LocalConfig() Config {
	c := DefaultConfig()
	c.FormationTimeout = 20 * time.Second
	c.ProgressInterval = time.Second
	c.RejoinInterval = time.Second
	c.LeaveGrace = time.Second
	return c
}

// maxMeta is memberlist's node metadata limit; more panics inside memberlist.
const maxMeta = memberlist.MetaMaxSize

// Validate reports the first problem with c, as a *ConfigError.
func (c *Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.JobID == "":
		return bad("JobID", "empty")
	case strings.ContainsAny(c.JobID, "/\x00"):
		return bad("JobID", "%q contains '/' or NUL", c.JobID)
	case c.WorldSize < 1:
		return bad("WorldSize", "%d < 1", c.WorldSize)
	case c.Rank < 0 || c.Rank >= c.WorldSize:
		return bad("Rank", "%d not in [0, %d)", c.Rank, c.WorldSize)
	case c.LocalRank < 0:
		return bad("LocalRank", "%d < 0", c.LocalRank)
	case c.LocalWorldSize < 0 || (c.LocalWorldSize > 0 && c.LocalRank >= c.LocalWorldSize):
		return bad("LocalWorldSize", "%d with local rank %d", c.LocalWorldSize, c.LocalRank)
	case c.LocalWorldSize > c.WorldSize:
		return bad("LocalWorldSize", "%d above world size %d", c.LocalWorldSize, c.WorldSize)
	case c.hierarchical() && c.Rank == 0 && c.LocalRank != 0:
		return bad("LocalRank", "rank 0 has local rank %d; host leaders need rank 0 to be local rank 0 (or set Flat)", c.LocalRank)
	case len(c.Secret) < 16:
		return bad("Secret", "%d bytes, need at least 16", len(c.Secret))
	case c.Seed == "" && c.WorldSize > 1:
		return bad("Seed", "empty with %d ranks", c.WorldSize)
	case c.RankHosts != nil && len(c.RankHosts) != c.WorldSize:
		return bad("RankHosts", "%d entries for %d ranks", len(c.RankHosts), c.WorldSize)
	}
	if c.Seed != "" {
		if _, _, err := net.SplitHostPort(c.Seed); err != nil {
			return bad("Seed", "%q is not host:port: %v", c.Seed, err)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"FormationTimeout", c.FormationTimeout}, {"ProgressInterval", c.ProgressInterval},
		{"RejoinInterval", c.RejoinInterval},
		{"ProbeInterval", c.ProbeInterval}, {"ProbeTimeout", c.ProbeTimeout},
		{"GossipInterval", c.GossipInterval}, {"SuspicionTimeout", c.SuspicionTimeout},
		{"TCPTimeout", c.TCPTimeout}, {"PushPullInterval", c.PushPullInterval},
		{"AttachBeat", c.AttachBeat}, {"AttachLease", c.AttachLease},
		{"GossipLease", c.GossipLease}, {"RefusedGrace", c.RefusedGrace},
	} {
		if d.v <= 0 {
			return bad(d.name, "%v, must be positive", d.v)
		}
	}
	if c.LeaveLinger < 0 || c.LeaveGrace < 0 {
		return bad("LeaveLinger/LeaveGrace", "negative")
	}
	if c.ProbeTimeout >= c.ProbeInterval {
		// memberlist's probe round must fit the direct and the indirect
		// probe in one interval.
		return bad("ProbeTimeout", "%v not below ProbeInterval %v", c.ProbeTimeout, c.ProbeInterval)
	}
	if c.GossipLease <= c.SuspicionTimeout {
		// The World's own attempts to reach a member declared dead need
		// some of the lease (doubt.go).
		return bad("GossipLease", "%v not above SuspicionTimeout %v", c.GossipLease, c.SuspicionTimeout)
	}
	if c.StarvedLimit != 0 && c.StarvedLimit < c.AttachLease {
		return bad("StarvedLimit", "%v is below AttachLease %v (0 for no limit)", c.StarvedLimit, c.AttachLease)
	}
	if c.AttachLease < 2*c.AttachBeat {
		// One late beat must not end a healthy rank.
		return bad("AttachLease", "%v is less than two beats (AttachBeat %v)", c.AttachLease, c.AttachBeat)
	}
	if c.PushConcurrency < 1 || c.GossipNodes < 1 || c.RetransmitMult < 1 || c.IndirectChecks < 0 {
		return bad("PushConcurrency/GossipNodes/RetransmitMult/IndirectChecks", "out of range")
	}
	if n := len(encodeMeta(c.meta())); n > maxMeta {
		return bad("JobID/Host/DataAddr", "node metadata is %d bytes, memberlist allows %d", n, maxMeta)
	}
	return nil
}

// hierarchical reports whether this rank's host joins the gossip through one
// leader (see Config.LocalWorldSize).
func (c *Config) hierarchical() bool { return !c.Flat && c.LocalWorldSize > 1 }

// leader reports whether this rank is a gossip member: every rank in flat
// mode, local rank 0 with host leaders.
func (c *Config) leader() bool { return !c.hierarchical() || c.LocalRank == 0 }

// gossipSize estimates the number of gossip members: the host count with
// host leaders.
func (c *Config) gossipSize() int {
	if c.hierarchical() {
		return max(1, (c.WorldSize+c.LocalWorldSize-1)/c.LocalWorldSize)
	}
	return c.WorldSize
}

// suspicionMult converts SuspicionTimeout into memberlist's multiplier for a
// world of n members: memberlist's timeout is mult · max(1, log10 n) ·
// ProbeInterval, rounded down here (to at least 1) so that the suspicion
// never exceeds the target: at 256 and 1024 members discovering the dead
// member and spreading the news already take up to a second. memberlist would
// start a suspicion at SuspicionMaxTimeoutMult times that and shrink it as
// other members confirm; memberlistConfig sets that factor to 1, so the
// timeout is the same whether or not confirmations arrive, and detection
// time does not depend on how busy the other members are.
func (c *Config) suspicionMult(n int) int {
	scale := math.Max(1, math.Log10(float64(n)))
	m := int(math.Floor(float64(c.SuspicionTimeout) / (scale * float64(c.ProbeInterval))))
	return max(m, 1)
}

// minRetransmits is the fewest times every member passes on a gossip
// message (a suspicion, a death). memberlist's limit is RetransmitMult ·
// ceil(log10(n+1)), so RetransmitMult 2 gives 6 at 256 members but only 4 at
// 10 to 99. Measured at 64 members (fake clock, TestScaleTable, one member
// cut off): with 4, 7 of 160 runs had a member that heard none of the
// death's gossip and found the dead member by its own probe round, 3.8 to
// 24 s after the cut instead of about 1 s; with 6 (RetransmitMult 3), the
// slowest of 210 runs saw it in 1.9 s. Small worlds gossip little, so the
// extra sends cost little; from 100 members on RetransmitMult 2 already
// gives 6, and 4 there doubled the real time of a 256-member test world.
const minRetransmits = 6

// retransmitMult is memberlist's RetransmitMult for a gossip of n members:
// c.RetransmitMult, raised where memberlist's limit would stay below
// minRetransmits.
func (c *Config) retransmitMult(n int) int {
	logN := int(math.Ceil(math.Log10(float64(n + 1))))
	return max(c.RetransmitMult, (minRetransmits+logN-1)/logN)
}

// nodeName is the memberlist name of a rank: unique per (job, rank), so two
// processes claiming one rank collide by name and memberlist reports the
// conflict (see world.NotifyConflict).
func nodeName(job string, gen uint64, rank int) string {
	if gen == 0 {
		return fmt.Sprintf("%d@%s", rank, job)
	}
	// The generation in the name: a stale rank r and the new world's rank r are
	// two nodes to memberlist, not one name claimed twice (which it would
	// settle for whichever came first).
	return fmt.Sprintf("%d@%s#%d", rank, job, gen)
}

// memberlistConfig maps c onto memberlist's configuration.
func (c *Config) memberlistConfig() *memberlist.Config {
	mc := memberlist.DefaultLANConfig()
	mc.Name = nodeName(c.JobID, c.Generation, c.Rank)
	mc.Label = c.JobID
	mc.ProbeInterval = c.ProbeInterval
	mc.ProbeTimeout = c.ProbeTimeout
	mc.GossipInterval = c.GossipInterval
	mc.GossipNodes = c.GossipNodes
	mc.SuspicionMult = c.suspicionMult(c.gossipSize())
	mc.SuspicionMaxTimeoutMult = 1
	mc.RetransmitMult = c.retransmitMult(c.gossipSize())
	if c.hierarchical() {
		// One member per host: the gossip is small, so afford
		// memberlist's LAN default. With 2 a leader's death missed one
		// of 64 leaders in about 1 run of 20 (it then found out by its
		// own probe round, 11 s later); with 4, in none of 60.
		mc.RetransmitMult = max(mc.RetransmitMult, 4)
	}
	mc.IndirectChecks = c.IndirectChecks
	mc.TCPTimeout = c.TCPTimeout
	mc.PushPullInterval = c.PushPullInterval
	// Measured here: LZW on every packet pins two cores at 256 members and
	// the group never forms; without it, 2.2 s.
	mc.EnableCompression = false
	// A dead member's name is never reused within a job: a restarted rank
	// would be a different incarnation of the world, which this package
	// does not support.
	mc.DeadNodeReclaimTime = 0
	// Queue bound for incoming gossip messages. While the world forms every
	// member relays every other member's alive message several times; with
	// memberlist's 1024 a 256-member world dropped thousands of them
	// (measured), each a member that then had to wait for a push-pull.
	mc.HandoffQueueDepth = max(4096, 32*c.WorldSize)
	mc.GossipToTheDeadTime = 10 * c.ProbeInterval
	return mc
}
