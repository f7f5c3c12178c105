package sim

import (
	"fmt"
	"time"
)

// LaunchConfig is one launch of Hosts remote hosts × PerHost ranks from a
// launch node, as launcher/starter.go's startStarters plans it.
type LaunchConfig struct {
	Hosts, PerHost int
	// FanoutThreshold is Config.FanoutThreshold's meaning: above it the
	// agents start as a tree (√N parents); negative never.
	FanoutThreshold int
	// LauncherCores and HostCores are the launch node's and each host's
	// cores; Latency the one-way network latency.
	LauncherCores, HostCores int
	Latency                  time.Duration
	Costs                    Costs
	Seed                     uint64
}

// LaunchResult is when the hosts said hello and the last rank started.
type LaunchResult struct {
	Direct, ViaParents int
	LastHello          time.Duration
	LastRank           time.Duration
	LauncherBusy       time.Duration // CPU time on the launch node
}

// Launch simulates the start of every host agent and rank:
//
//   - gorun starts one ssh per direct host at once (startStarter): the
//     client half of the key exchange on the launch node's cores, the
//     server half on the host's, then the agent starts (AgentStart) and
//     says hello to gorun (AgentHello on the launch node);
//   - above the threshold, √N direct hosts each start their contiguous
//     share of the rest the same way, once their own agent runs
//     (childLaunch); the children say hello to gorun directly;
//   - a host's ranks start once its hello and host 0's hello are in
//     (earlyStart), a tree parent's once every host is up; each rank
//     is one fork/exec (RankSpawn) on its host.
func Launch(cfg LaunchConfig) (LaunchResult, error) {
	var res LaunchResult
	if cfg.Hosts < 1 || cfg.PerHost < 1 || cfg.LauncherCores < 1 || cfg.HostCores < 1 {
		return res, fmt.Errorf("sim: launch of %d hosts × %d with %d/%d cores", cfg.Hosts, cfg.PerHost, cfg.LauncherCores, cfg.HostCores)
	}
	if err := cfg.Costs.Validate(); err != nil {
		return res, err
	}
	s := NewSim(cfg.Seed)
	c := &cfg.Costs
	gorun := NewCPU(s, cfg.LauncherCores)
	hosts := make([]*CPU, cfg.Hosts)
	for i := range hosts {
		hosts[i] = NewCPU(s, cfg.HostCores)
	}
	direct := cfg.Hosts
	children := map[int][]int{}
	if cfg.FanoutThreshold >= 0 && cfg.Hosts > cfg.FanoutThreshold {
		width := 1
		for width*width < cfg.Hosts {
			width++
		}
		direct = width
		rest := cfg.Hosts - width
		per := (rest + width - 1) / width
		for k := range rest {
			children[k/per] = append(children[k/per], width+k)
		}
	}
	res.Direct, res.ViaParents = direct, cfg.Hosts-direct
	helloAt := make([]time.Duration, cfg.Hosts)
	up := 0
	// The ssh's wall time beyond its CPU (round trips, waits).
	sshIdle := max(0, c.SSHWall-c.SSH) + 4*cfg.Latency
	spawnRanks := func(h int) {
		for range cfg.PerHost {
			hosts[h].Exec(c.RankSpawn, func() { res.LastRank = max(res.LastRank, s.Now()) })
		}
	}
	var hostUp func(h int)
	hostUp = func(h int) {
		helloAt[h] = s.Now()
		res.LastHello = max(res.LastHello, s.Now())
		up++
		if up == cfg.Hosts {
			for p := range children {
				spawnRanks(p)
			}
		}
		if h == 0 {
			for k := 1; k < cfg.Hosts; k++ {
				if helloAt[k] > 0 && len(children[k]) == 0 {
					spawnRanks(k)
				}
			}
		}
		if len(children[h]) == 0 && (h == 0 || helloAt[0] > 0) {
			spawnRanks(h)
		}
	}
	var ssh func(from *CPU, h int)
	ssh = func(from *CPU, h int) {
		from.Exec(c.SSH/2, func() {
			s.After(sshIdle, func() {
				hosts[h].Exec(c.SSH/2+c.AgentStart, func() {
					for _, k := range children[h] {
						ssh(hosts[h], k)
					}
					s.After(cfg.Latency, func() { gorun.Exec(c.AgentHello, func() { hostUp(h) }) })
				})
			})
		})
	}
	for h := range direct {
		ssh(gorun, h)
	}
	s.Run(time.Hour, nil)
	if up != cfg.Hosts {
		return res, fmt.Errorf("sim: launch: %d of %d hosts came up", up, cfg.Hosts)
	}
	res.LauncherBusy = gorun.Busy
	return res, nil
}
