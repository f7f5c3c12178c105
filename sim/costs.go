package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"time"
)

// Costs are the CPU times and sizes the model charges, each measured for
// the real code on this machine (bench/simscale -measure; notes/scale-sim.md
// says how each was obtained). Durations are CPU time per occurrence, in
// nanoseconds in JSON.
type Costs struct {
	// Packet is the CPU time of one memberlist UDP packet, both ends
	// (encrypt, send, receive, decrypt, decode, handle), charged half at
	// the sender and half at the receiver. Measured: a formed host-leader
	// world idle for a few seconds, process CPU ÷ packets.
	Packet time.Duration `json:"packet_ns"`
	// GossipMsg is the CPU time to apply one gossiped message at its
	// receiver (memberlist's aliveNode and the World's NotifyJoin for a
	// new member), beyond the packet's own cost.
	GossipMsg time.Duration `json:"gossip_msg_ns"`
	// PingBytes is the mean size of a probe packet (ping or ack) as it
	// crosses the wire, encryption and label included.
	PingBytes int `json:"ping_bytes"`
	// AliveBytes is the size of one gossiped alive/suspect/dead message
	// inside a gossip packet (memberlist packs several into one packet).
	AliveBytes int `json:"alive_bytes"`
	// GoneBytes is the size of the kindGone packet a leader sends every
	// other leader when one of its ranks is lost.
	GoneBytes int `json:"gone_bytes"`
	// StateNodeBytes and StateRankBytes size a push-pull state: per gossip
	// member (memberlist's node state with its metadata) and per attached
	// rank (rendezvous's table entry in localStateLocked).
	StateNodeBytes int `json:"state_node_bytes"`
	StateRankBytes int `json:"state_rank_bytes"`
	// StateByte is the CPU time per byte of push-pull state, charged at the
	// end that encodes it and again at the end that decodes and merges it.
	StateByte time.Duration `json:"state_byte_ns"`
	// PushPull is the fixed CPU cost of one push-pull exchange at each end
	// (a TCP stream, encryption set-up, headers).
	PushPull time.Duration `json:"push_pull_ns"`
	// Attach is the CPU time of one rank's start and attach to its leader
	// (newWorld, the HMAC handshake both ways, the hello, the stream's
	// goroutines), both ends together, charged half at the rank and half
	// at the leader.
	Attach time.Duration `json:"attach_ns"`
	// LeaderStart is the CPU time of a leader's own set-up (newWorld,
	// memberlist Create, the attach listener); an attached rank's set-up
	// is part of Attach.
	LeaderStart time.Duration `json:"leader_start_ns"`
	// TableEntry is the CPU time per world-table entry, paid by the leader
	// encoding the table once and by each attached rank decoding it
	// (sendTableLocked, applyTable).
	TableEntry time.Duration `json:"table_entry_ns"`
	// ProcessStart is the CPU time a rank process spends of its own from
	// main until it has formed, beyond what the other costs charge: the
	// first use of everything a process sets up once (the heap, the
	// runtime's threads, memberlist's and the attach listener's sockets
	// and keys, code paged in), which ranks in one process share and
	// ranks in their own processes each pay. Charged at each rank's start
	// on its host's CPU, unless WorldConfig.InProcess. Measured: the CPU
	// from main to formed of the ranks of real 1×2 jobs, less what the
	// model charges for that job.
	ProcessStart time.Duration `json:"process_start_ns"`
	// ProcessIdle is the CPU time per second a live rank process spends
	// with nothing to do: memberlist's gossip and probe timers, attach
	// beats, the Go runtime's own (sysmon, GC). Ranks that wait for a
	// slow launch pay it the whole time, on their host's cores. Charged
	// per host every IdleTick for the ranks started there, unless
	// WorldConfig.InProcess. Measured: formed 1×2 jobs left idle, the
	// ranks' CPU over the idle time.
	ProcessIdle time.Duration `json:"process_idle_ns"`
	// SockPacket, SockMsg, SockConnect and SockByte are what real sockets
	// between processes cost, which the in-process fit (an in-memory
	// network and attach streams) never paid; charged only when each rank
	// is its own process (not WorldConfig.InProcess), half at each end.
	// SockPacket: one UDP datagram (probe, gossip, kindGone), both ends,
	// the receiver woken from idle. SockMsg: one message on an open TCP
	// stream (an attach stream's frame, a push-pull's state), both ends,
	// woken. SockConnect: a TCP connection's connect, accept and close
	// (each push-pull, each attach), both ends. SockByte: per byte a TCP
	// stream carries beyond a small message (copies in and out of the
	// kernel), both ends.
	SockPacket  time.Duration `json:"sock_packet_ns"`
	SockMsg     time.Duration `json:"sock_msg_ns"`
	SockConnect time.Duration `json:"sock_connect_ns"`
	SockByte    time.Duration `json:"sock_byte_ns"`
	// UnixMsg and UnixConnect are SockMsg and SockConnect on the abstract
	// Unix stream an attached rank holds to its leader (the attach
	// handshake, its hello, the table, frameGone).
	UnixMsg     time.Duration `json:"unix_msg_ns"`
	UnixConnect time.Duration `json:"unix_connect_ns"`
	// WakeExcess is how much later a message reaches a process parked in
	// epoll when other rank processes share its cores, beyond the same
	// message with none: the scheduler's wake-up latency under their
	// timers, which the CPU queue does not model (it charges their CPU,
	// not the wake-ups and preemptions). Points by live processes per
	// core, increasing; Wake interpolates. Charged on every message
	// between rank processes (each hop between hosts and each hand-off on
	// an attach stream), unless WorldConfig.InProcess. Measured:
	// bench/simscale -measure-wake (stand-in processes with a rank's
	// timers and idle CPU, UDP pings to an echo process).
	WakeExcess []WakePoint `json:"wake_excess"`
	// DeathLauncher, DeathAgent and DeathHost are the CPU gorun's own
	// processes spend on a rank's death, which competes with the
	// rendezvous's reaction on the same cores: DeathLauncher per host of
	// the job at the launch node (gorun and its ssh clients: the exit
	// reported, the job stopped on every host, the ranks' reports
	// relayed), DeathAgent on the dead rank's host (its agent and sshd:
	// the reap, the report, the stop) and DeathHost on each other host
	// (its agent and sshd: the stop, its ranks signalled, their reports
	// relayed). Charged unless WorldConfig.InProcess. Measured: the
	// processes' CPU (schedstat) around one SIGKILL in real namespace
	// jobs, less the same time idle (bench/simscale -measure-death).
	DeathLauncher time.Duration `json:"death_launcher_ns"`
	DeathAgent    time.Duration `json:"death_agent_ns"`
	DeathHost     time.Duration `json:"death_host_ns"`
	// LineHost and LineLauncher are the CPU of relaying one line a rank
	// prints to gorun's output: its agent's read and forward (with the
	// host's sshd) on the rank's host, gorun's receive and write at the
	// launch node. Charged per rank at its formation when
	// WorldConfig.ReportFormed (the calibration's ranks print a line
	// then). Measured: a job of one rank on a namespace host printing
	// hundreds of lines, the processes' CPU (schedstat) over them beyond
	// their quiet rate (bench/simscale, with -measure-death).
	LineHost     time.Duration `json:"line_host_ns"`
	LineLauncher time.Duration `json:"line_launcher_ns"`
	// TableEntryBytes is the size of one world-table entry on an attach
	// stream.
	TableEntryBytes int `json:"table_entry_bytes"`

	// Launch. SSH is the CPU time of one ssh connection's key exchange and
	// session (curve25519, the kex gorun asks for), charged half at each
	// end; SSHWall its wall time with idle CPUs (round trips, process
	// starts), of which the CPU part is SSH/2 per end.
	SSH     time.Duration `json:"ssh_ns"`
	SSHWall time.Duration `json:"ssh_wall_ns"`
	// AgentStart is the CPU time for a host agent to start (exec of the
	// gorun binary up to its hello); RankSpawn that of one rank's
	// fork/exec by its agent.
	AgentStart time.Duration `json:"agent_start_ns"`
	RankSpawn  time.Duration `json:"rank_spawn_ns"`
	// AgentHello is gorun's CPU time to accept one agent (connection,
	// HMAC handshake, hello).
	AgentHello time.Duration `json:"agent_hello_ns"`

	// PMI: the bytes of a business card as MPICH puts it, of the release
	// of a barrier to one host, and of the envelope of a batched answer.
	PMICardBytes     int `json:"pmi_card_bytes"`
	PMIReleaseBytes  int `json:"pmi_release_bytes"`
	PMIEnvelopeBytes int `json:"pmi_envelope_bytes"`

	// LauncherBytesPerRank is the launcher's resident memory per rank (the
	// slope of gorun's RSS over -np), and LauncherBase its intercept.
	LauncherBytesPerRank int `json:"launcher_bytes_per_rank"`
	LauncherBase         int `json:"launcher_base_bytes"`

	// Source says, per field, where its figure came from (free text).
	Source map[string]string `json:"source,omitempty"`
}

// WakePoint is one measured point of Costs.WakeExcess: with PerCore live
// rank processes per core, a message arrives Excess later than with none.
type WakePoint struct {
	PerCore float64       `json:"procs_per_core"`
	Excess  time.Duration `json:"excess_ns"`
}

// Wake is the wake-up excess with perCore live processes per core:
// linear between the measured points, from no excess at none; held at
// the last point beyond it (not extrapolated).
func (c *Costs) Wake(perCore float64) time.Duration {
	x0, y0 := 0.0, 0.0
	for _, p := range c.WakeExcess {
		if perCore <= p.PerCore {
			f := (perCore - x0) / (p.PerCore - x0)
			return time.Duration(y0 + f*(float64(p.Excess)-y0))
		}
		x0, y0 = p.PerCore, float64(p.Excess)
	}
	return time.Duration(y0)
}

// LoadCosts reads Costs from a JSON file and validates them.
func LoadCosts(path string) (Costs, error) {
	var c Costs
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("sim: costs: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("sim: costs %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("sim: costs %s: %w", path, err)
	}
	return c, nil
}

// Validate reports the first field that is not positive: every cost the
// model charges must have been measured (a zero would be free CPU).
func (c *Costs) Validate() error {
	v := reflect.ValueOf(*c)
	t := v.Type()
	for i := range t.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			if f.Int() <= 0 {
				return fmt.Errorf("field %s (%s) is %d, must be positive (measured)", t.Field(i).Name, t.Field(i).Tag.Get("json"), f.Int())
			}
		}
	}
	if len(c.WakeExcess) == 0 {
		return fmt.Errorf("field WakeExcess (wake_excess) is empty, must hold measured points")
	}
	prev := 0.0
	for i, p := range c.WakeExcess {
		if p.PerCore <= prev || p.Excess < 0 {
			return fmt.Errorf("field WakeExcess (wake_excess) point %d: %v per core, %v: the points must have increasing, positive per-core counts and excesses ≥ 0", i, p.PerCore, p.Excess)
		}
		prev = p.PerCore
	}
	return nil
}
