package plan

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gorun-hpc/gorun/launcher/hostfile"
)

// Config is everything planning needs. It holds values, not resources:
// the caller picks ports, the job id and the secret (launcher/ports'
// Reserve and the launcher's NewJobIdentity) so that New stays a pure,
// deterministic function.
type Config struct {
	// NP is the number of ranks; 0 means one rank per slot.
	NP int
	// Hosts lists the hosts in rank order. Empty means the local host with
	// NP slots (or one slot when NP is 0): a one-host job needs no host list,
	// as with torchrun --nproc-per-node.
	Hosts []hostfile.Host
	// Oversubscribe allows more ranks than slots, up to each host's MaxSlots.
	Oversubscribe bool
	// GPUsPerHost is the number of GPUs on every host; 0 assigns none. Local
	// rank l gets GPU l mod GPUsPerHost.
	GPUsPerHost int
	// Export lists NAME=VALUE pairs (already resolved, see ResolveExports)
	// that every rank receives in addition to the plan's own variables. They
	// are applied last, so a user can deliberately override, say, MASTER_ADDR.
	Export []string
	// JobID identifies the job (GORUN_JOB_ID); required.
	JobID string
	// Secret is the job secret (GORUN_SECRET); required.
	Secret string
	// MasterAddr is the address ranks use to reach rank 0's host; "" means
	// the name of the host that runs rank 0.
	MasterAddr string
	// MasterPort is a port free on MasterAddr (MASTER_PORT), left to the
	// program; required.
	MasterPort int
	// RdzvPort is a second free port on MasterAddr for gorun's own gossip
	// seed (GORUN_RDZV_ENDPOINT); required and different from MasterPort.
	RdzvPort int
	// NoPMI plans a job whose ranks are not served MPI's PMI (--pmi none):
	// they then get no PMI_* variable, since nothing would answer them.
	NoPMI bool
	// Interfaces maps a host name to the interface its ranks should use
	// for sockets (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME); hosts without
	// an entry get neither variable.
	Interfaces map[string]string
}

// Plan is the outcome of planning: which rank runs where and with which
// environment. It is a value: executing it is the launcher's business.
type Plan struct {
	// JobID is the job's identifier.
	JobID string
	// WorldSize is the number of ranks.
	WorldSize int
	// Nodes lists the hosts that received at least one rank, in node-rank
	// order, with the number of ranks placed on each.
	Nodes []Node
	// Ranks holds one RankSpec per rank, indexed by rank.
	Ranks []RankSpec
	// MasterAddr and MasterPort are what ranks see as MASTER_ADDR/PORT.
	MasterAddr string
	MasterPort int
	// RdzvEndpoint is host:port of the gossip seed.
	RdzvEndpoint string
	// PMI says the ranks are served MPI's PMI (the launcher's pmi.go): they get
	// PMI_RANK and PMI_SIZE here and PMI_FD or PMI_PORT from their
	// supervisor.
	PMI bool
}

// Node is one host of a plan.
type Node struct {
	// Name is the host name as the user wrote it.
	Name string
	// Ranks is the number of ranks placed on the host.
	Ranks int
	// FirstRank is the global rank of the host's local rank 0; a host's
	// ranks are contiguous.
	FirstRank int
}

// RankSpec describes one rank of a plan.
type RankSpec struct {
	// Rank is the global rank.
	Rank int
	// LocalRank is the rank's index on its host; LocalSize the number of
	// ranks on that host.
	LocalRank, LocalSize int
	// NodeRank is the index of the rank's host in Plan.Nodes.
	NodeRank int
	// Host is the host name.
	Host string
	// GPU is the GPU index assigned to the rank, or -1 for none.
	GPU int
	// Env holds the variables gorun sets for this rank, NAME=VALUE, in a
	// fixed order; the runner appends them to the base environment so they
	// win over inherited values.
	Env []string
}

// localHostName is the host name used when no host list is given.
const localHostName = "localhost"

// New places ranks on hosts and computes every rank's environment.
//
// Mapping is by slot, as mpirun's default: host 0 takes ranks until its
// slots are full, then host 1, and so on; hosts that receive no rank are left
// out of the plan. With Oversubscribe, ranks beyond the slot total are spread
// one at a time round robin over the hosts that are below their MaxSlots, and
// each host's ranks stay contiguous (rank = FirstRank + LocalRank), which
// torch-style programs assume.
//
// New is pure: the same config gives the same plan.
func New(c Config) (*Plan, error) {
	if c.NP < 0 {
		return nil, fmt.Errorf("launcher: -np must be positive, got %d", c.NP)
	}
	if c.NP > MaxRanks {
		return nil, &CapacityError{Ranks: c.NP, Resource: "ranks", Need: c.NP, Limit: MaxRanks}
	}
	if c.GPUsPerHost < 0 {
		return nil, fmt.Errorf("launcher: GPUs per host must not be negative, got %d", c.GPUsPerHost)
	}
	if c.JobID == "" || c.Secret == "" {
		return nil, errors.New("launcher: plan needs a job id and a secret")
	}
	if c.MasterPort <= 0 || c.RdzvPort <= 0 || c.MasterPort == c.RdzvPort {
		return nil, fmt.Errorf("launcher: plan needs two distinct ports, got MASTER_PORT %d and rendezvous port %d", c.MasterPort, c.RdzvPort)
	}
	for _, kv := range c.Export {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("launcher: exported variable %q is not NAME=VALUE", kv)
		}
		if err := checkExportName(k, c.GPUsPerHost > 0); err != nil {
			return nil, err
		}
	}
	hosts, err := normalizeHosts(c)
	if err != nil {
		return nil, err
	}
	counts, err := placeCounts(hosts, c.NP, c.Oversubscribe)
	if err != nil {
		return nil, err
	}
	// Without -np the slots decide; a hostfile's slots=2000000000 must be
	// refused before one environment per rank is built.
	if total := sumCapped(counts); total > MaxRanks {
		return nil, &CapacityError{Ranks: total, Resource: "ranks", Need: total, Limit: MaxRanks, FromSlots: c.NP == 0}
	}

	p := &Plan{JobID: c.JobID, MasterPort: c.MasterPort, PMI: !c.NoPMI}
	for i, h := range hosts {
		if counts[i] == 0 {
			continue
		}
		p.Nodes = append(p.Nodes, Node{Name: h.Name, Ranks: counts[i], FirstRank: p.WorldSize})
		p.WorldSize += counts[i]
	}
	if p.WorldSize == 0 {
		return nil, ErrNoRanks
	}
	p.MasterAddr = c.MasterAddr
	if p.MasterAddr == "" {
		p.MasterAddr = p.Nodes[0].Name
	}
	p.RdzvEndpoint = joinHostPort(p.MasterAddr, c.RdzvPort)

	for nodeRank, n := range p.Nodes {
		for l := 0; l < n.Ranks; l++ {
			r := RankSpec{
				Rank: n.FirstRank + l, LocalRank: l, LocalSize: n.Ranks,
				NodeRank: nodeRank, Host: n.Name, GPU: -1,
			}
			if c.GPUsPerHost > 0 {
				r.GPU = l % c.GPUsPerHost
			}
			r.Env = p.RankEnv(r, c)
			p.Ranks = append(p.Ranks, r)
		}
	}
	return p, nil
}

// sumCapped adds counts, stopping once the sum passes MaxRanks (so that
// absurd slot counts cannot overflow it).
func sumCapped(counts []int) int {
	n := 0
	for _, c := range counts {
		n += c
		if n > MaxRanks {
			return n
		}
	}
	return n
}

// normalizeHosts applies the default host list and merges duplicate names:
// the first occurrence keeps its position and the slots add up, as in an
// Open MPI hostfile.
func normalizeHosts(c Config) ([]hostfile.Host, error) {
	if len(c.Hosts) == 0 {
		slots := c.NP
		if slots == 0 {
			slots = 1
		}
		return []hostfile.Host{{Name: localHostName, Slots: slots}}, nil
	}
	var out []hostfile.Host
	index := map[string]int{}
	for _, h := range c.Hosts {
		if h.Name == "" {
			return nil, errors.New("launcher: host with an empty name")
		}
		if h.Slots < 1 {
			return nil, fmt.Errorf("launcher: host %q has %d slots; need at least 1", h.Name, h.Slots)
		}
		if h.MaxSlots != 0 && h.MaxSlots < h.Slots {
			return nil, fmt.Errorf("launcher: host %q has max_slots %d below its %d slots", h.Name, h.MaxSlots, h.Slots)
		}
		if i, ok := index[h.Name]; ok {
			out[i].Slots += h.Slots
			if out[i].MaxSlots == 0 || h.MaxSlots == 0 {
				out[i].MaxSlots = 0
			} else {
				out[i].MaxSlots += h.MaxSlots
			}
			continue
		}
		index[h.Name] = len(out)
		out = append(out, h)
	}
	return out, nil
}

// placeCounts decides how many ranks each host takes.
func placeCounts(hosts []hostfile.Host, np int, oversubscribe bool) ([]int, error) {
	slots := 0
	for _, h := range hosts {
		slots += h.Slots
	}
	if np == 0 {
		np = slots
	}
	counts := make([]int, len(hosts))
	left := np
	for i, h := range hosts {
		n := min(left, h.Slots)
		counts[i] = n
		left -= n
	}
	if left == 0 {
		return counts, nil
	}
	if !oversubscribe {
		return nil, &SlotsError{Requested: np, Slots: slots, Hosts: len(hosts)}
	}
	capTotal := 0
	for _, h := range hosts {
		if h.MaxSlots == 0 {
			capTotal = -1
			break
		}
		capTotal += h.MaxSlots
	}
	if capTotal >= 0 && np > capTotal {
		return nil, &SlotsError{Requested: np, Slots: slots, Hosts: len(hosts), MaxSlots: capTotal}
	}
	// Round robin one rank at a time over hosts with room; the cap check
	// above guarantees this terminates.
	for left > 0 {
		for i, h := range hosts {
			if left == 0 {
				break
			}
			if h.MaxSlots != 0 && counts[i] >= h.MaxSlots {
				continue
			}
			counts[i]++
			left--
		}
	}
	return counts, nil
}

// joinHostPort is net.JoinHostPort without importing net into the pure
// planner: IPv6 literals get brackets.
func joinHostPort(host string, port int) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}

// MasterEndpoint is host:port of MASTER_ADDR and MASTER_PORT, as ranks see
// them.
func (p *Plan) MasterEndpoint() string { return joinHostPort(p.MasterAddr, p.MasterPort) }
