package launcher

import (
	"slices"
	"strconv"
	"strings"

	"github.com/gorun-hpc/gorun/ft"
	"github.com/gorun-hpc/gorun/launcher/plan"
)

// Spare hosts of a fault-tolerant job. The user names them as
// --min-np's spares are named: hosts in the host list beyond what the
// job needs (gorun -np 3 -H a,b,c,d: d is a spare). gorun starts their
// agents with the job's, rankless: each says hello (its program present,
// its interface) and waits for a spec. When a host is lost, the first
// spare left takes the lost host's place in the plan (same node, same
// ranks, its own name and interface) and gets the lost ranks' specs,
// rewritten for it, each with its next incarnation; they start there,
// join the quorum at a step boundary and heal from the live replicas like
// any replacement. A spare lost in turn is a lost host like any other.
//
// Why at launch and not when a host is lost: a spare found unreachable,
// or without the program, is named before the job runs rather than when
// it is needed; and the replacement's start then costs a message, not an
// ssh handshake and an agent's start-up (0.3-3 s each here), on the path
// the survivors' heal waits for. The price is one idle agent per spare.

// spareNodes lists the hosts of hosts that the plan pre left without
// ranks, as rankless nodes after the plan's.
func spareNodes(hosts []Host, pre *plan.Plan) []plan.Node {
	var out []plan.Node
	for _, h := range hosts {
		used := slices.ContainsFunc(pre.Nodes, func(n plan.Node) bool { return n.Name == h.Name })
		dup := slices.ContainsFunc(out, func(n plan.Node) bool { return n.Name == h.Name })
		if !used && !dup {
			out = append(out, plan.Node{Name: h.Name, FirstRank: pre.WorldSize})
		}
	}
	return out
}

// takeSpare moves the ranks of lost node lost to the first spare host
// left and starts them there (their environment through ftRun.rankEnv,
// with the incarnations the caller set). It returns the spare's name, or
// false when no spare is left. The job loop's goroutine calls it.
func (r *hostsRun) takeSpare(lost int) (string, bool) {
	if len(r.spares) == 0 {
		return "", false
	}
	c := r.spares[0]
	r.spares = r.spares[1:]
	name := r.m.nodes[c.node].Name
	n := &r.plan.Nodes[lost]
	n.Name = name
	for rk := n.FirstRank; rk < n.FirstRank+n.Ranks; rk++ {
		r.plan.Ranks[rk].Host = name
	}
	// The spare is the lost node from now on: its events carry that
	// node, and commands for the node's ranks go to it.
	c.node = lost
	r.home.byNode = nil
	r.launch(c)
	return name, true
}

// rankEnv is a rank's environment as its host agent gets it: with its
// current incarnation when it is a replacement started on a spare host.
func (f *ftRun) rankEnv(rank int, env []string) []string {
	if f == nil || f.inc[rank] == 0 {
		return env
	}
	env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, ft.IncarnationEnv+"=") })
	return append(env, ft.IncarnationEnv+"="+strconv.Itoa(f.inc[rank]))
}
