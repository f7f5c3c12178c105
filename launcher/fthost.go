package launcher

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/launcher/wire"
)

// A lost host in a fault-tolerant job (its agent gone, or its link
// silent past the lease) takes only its replica groups out: the job
// loop's hostLost hands it here first. Its running ranks are lost (the
// quorum service is told at once, so a quorum they were in fails and the
// next goes on without them), the other ranks of their replica groups
// are killed on their own hosts, and all of them are retired: no
// replacement is started for them (no spare host takes over). The other
// replicas keep stepping with fewer participants and the job ends when
// they have finished. The host's own agent kills its ranks when its
// lease runs out (a cut link) or died with them (a killed host), as in
// any job.
//
// The loss still ends the job, as it ends a job that is not
// fault-tolerant, when it spends the failure budget (a host counts as one
// failure, whatever its ranks) or leaves no live rank holding the job's
// last committed step: there is then nothing to train on from.

// hostLost handles the loss of ev.Node's host; it returns false when the
// job loop's usual rule applies (the job is not fault-tolerant, is being
// stopped already, or this loss ends it: then exhausted says why).
func (f *ftRun) hostLost(j *liveJob, ev wire.Event) bool {
	if f == nil || j.reason != notStopping {
		return false
	}
	n := j.plan.Nodes[ev.Node]
	now := time.Now()
	loss := FTHostLoss{Host: n.Name, At: f.since(now), Why: ev.Err, Step: f.srv.Record().MaxStep, Ranks: []int{}, Retired: []int{}}
	if f.lostNodes == nil {
		f.lostNodes = map[int]bool{}
	}
	f.lostNodes[ev.Node] = true
	why := fmt.Sprintf("its host %s was lost: %s", n.Name, ev.Err)
	used := f.used()
	for rk := n.FirstRank; rk < n.FirstRank+n.Ranks; rk++ {
		st := &j.ranks[rk]
		dying := f.dying[rk]
		delete(f.dying, rk)
		if st.exited && !dying {
			continue // finished (exit 0) before its host went
		}
		st.exited, st.stopped = true, false
		f.srv.Lost(rk, f.inc[rk], why)
		loss.Ranks = append(loss.Ranks, rk)
		f.failures = append(f.failures, FTFailure{Rank: rk, Incarnation: f.inc[rk], PID: st.pid, At: loss.At, Host: n.Name})
	}
	end := ""
	switch {
	case len(loss.Ranks) > 0 && !f.srv.StateLive():
		end = fmt.Sprintf("host %s was lost with %s and no live rank holds the job's state: the survivors would have nothing to train on from",
			n.Name, rankList(loss.Ranks))
	case len(loss.Ranks) > 0 && used >= f.maxFailures:
		end = fmt.Sprintf("host %s was lost with %s, failure %d of a budget of %d (--max-failures; a host counts as one)",
			n.Name, rankList(loss.Ranks), used+1, f.maxFailures)
	}
	f.hosts = append(f.hosts, loss)
	h := &f.hosts[len(f.hosts)-1]
	if end != "" {
		h.Action = "job ended"
		f.markLost(n.Name, "job ended")
		f.exhausted = end
		j.log.Warn().Str("host", n.Name).Str("why", end).Msg("fault-tolerant: ending the job")
		return false
	}
	if f.replaceOnSpare(j, ev.Node, h) {
		return true
	}
	h.Action = "survivors continue"
	action := "retired: not replaced (no spare host takes over)"
	switch {
	case f.takeSpare != nil && len(loss.Ranks) < n.Ranks:
		action = fmt.Sprintf("retired: not replaced (%d of its host's %d ranks had finished; a host moves to a spare host only whole)",
			n.Ranks-len(loss.Ranks), n.Ranks)
	case len(f.spares) > 0:
		action = fmt.Sprintf("retired: not replaced (no spare host is left: %s lost while idle)", f.spareNames())
	}
	f.markLost(n.Name, action)
	// Their replica groups go with them: the others are killed where they
	// run and retired too.
	var groups []int
	for _, rk := range loss.Ranks {
		if lo := rk / f.group * f.group; !slices.Contains(groups, lo) {
			groups = append(groups, lo)
		}
	}
	for _, lo := range groups {
		for q := lo; q < lo+f.group; q++ {
			f.retired[q] = true
			h.Retired = append(h.Retired, q)
			if f.lostHere(j, q) || j.ranks[q].exited || f.dying[q] {
				continue
			}
			f.dying[q] = true
			j.home.commandNode(j.plan.Ranks[q].NodeRank, wire.Cmd{Op: "signal", Signal: int(syscall.SIGKILL), Ranks: []int{q}})
		}
		f.respawnGroupIfGone(j, lo) // releases the group's exited ranks once none is dying
	}
	j.log.Warn().Str("host", n.Name).Ints("retired", h.Retired).Int64("step", h.Step).
		Msg("fault-tolerant: host lost; its replica groups are out and the others keep stepping")
	return true
}

// replaceOnSpare starts the lost ranks of h on a spare host, when one is
// left and the host lost every rank it ran (a host some of whose ranks
// had finished is not moved: the spare would start them again). Each
// lost rank's next incarnation is its replica group's next; the others of
// its group are killed where they run and started again in place once
// gone (respawnGroupIfGone), as for any failure in a group. The
// replacements then join and heal like any.
func (f *ftRun) replaceOnSpare(j *liveJob, node int, h *FTHostLoss) bool {
	n := j.plan.Nodes[node]
	if f.takeSpare == nil || len(h.Ranks) == 0 || len(h.Ranks) != n.Ranks {
		return false
	}
	old := maps.Clone(f.inc)
	for _, rk := range h.Ranks {
		lo := rk / f.group * f.group
		for q := lo; q < lo+f.group; q++ {
			f.inc[rk] = max(f.inc[rk], old[q]+1)
		}
	}
	spare, ok := f.takeSpare(node)
	if !ok {
		f.inc = old
		return false
	}
	j.left++ // the spare's supervisor reports "done" as the lost one would have
	for _, rk := range h.Ranks {
		j.ranks[rk].exited, j.ranks[rk].pid = false, 0
	}
	h.Spare, h.Action = spare, "replaced on spare host "+spare
	f.markLost(h.Host, h.Action)
	for _, rk := range h.Ranks {
		lo := rk / f.group * f.group
		for q := lo; q < lo+f.group; q++ {
			if slices.Contains(h.Ranks, q) || j.ranks[q].exited || f.dying[q] {
				continue
			}
			f.dying[q] = true
			j.home.commandNode(j.plan.Ranks[q].NodeRank, wire.Cmd{Op: "signal", Signal: int(syscall.SIGKILL), Ranks: []int{q}})
		}
	}
	j.log.Warn().Str("host", h.Host).Str("spare", spare).Ints("ranks", h.Ranks).Msg("fault-tolerant: host lost; its ranks start on a spare host")
	return true
}

// spareEvent handles a "spare-lost" event: an idle spare host's agent is
// gone or its link silent past the lease (ftspare.go).
func (f *ftRun) spareEvent(ev wire.Event) {
	if f != nil && f.dropSpare != nil {
		f.dropSpare(ev.Node)
	}
}

// spareLost records spare host host lost while idle (why), with the spare
// hosts left after it.
func (f *ftRun) spareLost(host, why string, left []string) {
	if f == nil {
		return
	}
	f.spares = append(f.spares, FTSpareLoss{Host: host, At: f.since(time.Now()), Why: why, SparesLeft: left})
}

// markLost sets the action of the failures recorded for host's ranks.
func (f *ftRun) markLost(host, action string) {
	for i := range f.failures {
		if x := &f.failures[i]; x.Host == host && x.Action == "" {
			x.Action = action
		}
	}
}

// spareNames lists the spare hosts lost while idle.
func (f *ftRun) spareNames() string {
	var out []string
	for _, s := range f.spares {
		out = append(out, s.Host)
	}
	return strings.Join(out, ", ")
}

// used is how much of the failure budget is spent: one per rank failure,
// one per lost host.
func (f *ftRun) used() int {
	n := len(f.hosts)
	for _, x := range f.failures {
		if x.Host == "" {
			n++
		}
	}
	return n
}

// lostHere reports whether rank r ran on a host that was lost.
func (f *ftRun) lostHere(j *liveJob, r int) bool {
	return f.lostNodes[j.plan.Ranks[r].NodeRank]
}

// rankList names ranks for a message: "rank 3", "ranks 2, 3".
func rankList(rs []int) string {
	if len(rs) == 1 {
		return fmt.Sprintf("rank %d", rs[0])
	}
	s := "ranks "
	for i, r := range rs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprint(r)
	}
	return s
}
