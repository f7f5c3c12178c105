package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/sim"
)

// The CPU gorun's own processes spend on a rank's death
// (Costs.DeathLauncher, DeathAgent, DeathHost): in a namespace job, the
// processes that are not ranks (gorun and its ssh clients on the launch
// side; on each host its sshd sessions and its agent) are read from
// /proc (each thread's schedstat run time, in nanoseconds) 1 s before the
// SIGKILL, at it, and 1 s after every rank has seen it; what they spent
// after the kill less what they spent in the same time before it (the
// idle rate) is the death's. The ranks themselves are left out: their
// reaction is the rendezvous's, which the model charges already.

// deathCPU is one job's figures: the launch side's, the dead rank's
// host's, and the mean of the other hosts'.
type deathCPU struct {
	launcher, victimHost, otherHost time.Duration
}

// jobProcs are the pids of a job's processes that are not ranks.
type jobProcs struct {
	launcher []int   // gorun and its descendants (ssh clients)
	hosts    [][]int // per host: its sshd sessions and agent
}

// procs lists jr's processes that are not ranks.
func (jr *jobRun) procs() (jobProcs, error) {
	var p jobProcs
	p.launcher = append([]int{jr.cmd.Process.Pid}, descendants(jr.cmd.Process.Pid)...)
	ranks := map[int]bool{}
	for _, l := range jr.formed {
		ranks[l.pid] = true
	}
	for _, host := range jr.j.h.Hosts[:jr.j.hosts] {
		pids, err := jr.j.h.Pids(host)
		if err != nil {
			return p, err
		}
		daemon := -1
		if b, err := os.ReadFile(filepath.Join(jr.j.h.StateDir, host, "sshd.pid")); err == nil {
			daemon, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		var mine []int
		for _, pid := range pids {
			if pid != daemon && !ranks[pid] {
				mine = append(mine, pid)
			}
		}
		p.hosts = append(p.hosts, mine)
	}
	return p, nil
}

// cpuSample is the CPU each part of a job has run so far, and when it
// was read.
type cpuSample struct {
	at       time.Time
	launcher time.Duration
	hosts    []time.Duration
}

// sample reads the CPU each part has run so far.
func (p jobProcs) sample() cpuSample {
	s := cpuSample{at: time.Now()}
	for _, pid := range p.launcher {
		s.launcher += procRun(pid)
	}
	for _, pids := range p.hosts {
		var t time.Duration
		for _, pid := range pids {
			t += procRun(pid)
		}
		s.hosts = append(s.hosts, t)
	}
	return s
}

// deathExcess is what each part spent between s1 and s2 beyond its rate
// between s0 and s1.
func deathExcess(victimHost int, s0, s1, s2 cpuSample) deathCPU {
	f := float64(s2.at.Sub(s1.at)) / float64(s1.at.Sub(s0.at))
	ex := func(a, b, c time.Duration) time.Duration { return (c - b) - time.Duration(f*float64(b-a)) }
	d := deathCPU{launcher: ex(s0.launcher, s1.launcher, s2.launcher)}
	var others time.Duration
	for k := range s0.hosts {
		e := ex(s0.hosts[k], s1.hosts[k], s2.hosts[k])
		if k == victimHost {
			d.victimHost = e
		} else {
			others += e
		}
	}
	if len(s0.hosts) > 1 {
		d.otherHost = others / time.Duration(len(s0.hosts)-1)
	}
	return d
}

// procRun is the CPU time pid's threads have run (the first field of
// each /proc/PID/task/TID/schedstat), 0 for a process that is gone.
func procRun(pid int) time.Duration {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tids, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var t time.Duration
	for _, tid := range tids {
		b, err := os.ReadFile(filepath.Join(dir, tid.Name(), "schedstat"))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			t += time.Duration(ns)
		}
	}
	return t
}

// descendants lists pid's descendants (by each process's parent in
// /proc/PID/stat).
func descendants(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	parent := map[int][]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		// The command sits in parentheses and may hold spaces: the
		// parent is the second field after the last ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		parent[pp] = append(parent[pp], p)
	}
	var out []int
	next := []int{pid}
	for len(next) > 0 {
		p := next[0]
		next = next[1:]
		out = append(out, parent[p]...)
		next = append(next, parent[p]...)
	}
	return out
}

// measureDeath runs jobs namespace jobs of hosts×per and sets c's death
// costs from the medians of their death figures (the launch side's per
// host of the job).
func measureDeath(c *sim.Costs, o options, hosts, per, jobs int, logf func(string, ...any)) error {
	h, exe, dir, err := netnsWorkspace(o, "simscale-death-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var l, v, oh []time.Duration
	for k := range jobs {
		r, err := oneNetnsJob(o, h, hosts, per, exe, dir)
		if err != nil {
			return fmt.Errorf("death job %d: %w", k+1, err)
		}
		d := r.death
		logf("  %d×%d job %d: after the SIGKILL, beyond the idle rate: launch side (gorun, ssh clients) %v, the dead rank's host (agent, sshd) %v, each other host %v",
			hosts, per, k+1, d.launcher, d.victimHost, d.otherHost)
		l, v, oh = append(l, d.launcher/time.Duration(hosts)), append(v, d.victimHost), append(oh, d.otherHost)
	}
	med := func(x []time.Duration) time.Duration {
		slices.Sort(x)
		return positive(float64(x[(len(x)-1)/2]))
	}
	c.DeathLauncher, c.DeathAgent, c.DeathHost = med(l), med(v), med(oh)
	c.Source["death_launcher_ns,death_agent_ns,death_host_ns"] = fmt.Sprintf("%d real %d×%d namespace jobs (gorun over ssh, the rank program): the CPU (each thread's schedstat) of gorun "+
		"and its ssh clients (÷ hosts), of the dead rank's host's agent and sshd sessions, and of each other host's, from the SIGKILL until 1 s after every rank "+
		"had seen it, less their rate over the 1 s before the kill; median of the jobs", jobs, hosts, per)
	logf("  death: launch side %v per host, the dead rank's host %v, each other host %v (medians)", c.DeathLauncher, c.DeathAgent, c.DeathHost)
	return nil
}
