package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/sim"
)

// calibrate runs each shape for real (in this process, median of rounds)
// and in the model with every host on one CPU of o.sharedCores cores, and
// prints them side by side with the ratio model/real and whether it lies
// within the accepted margin.
func calibrate(o options, costs sim.Costs) error {
	fmt.Printf("\ncalibration: real code in one process (all ranks on this machine's %d cores, shared with other work) vs the model with every host on one CPU\n", o.sharedCores)
	fmt.Printf("of as many cores as the real process got (its cpu/wall, rounded up, at most %d)\n", o.sharedCores)
	fmt.Printf("accepted margin, stated before extrapolating: model/real within [%.2f, %.2f] for each of formation, its CPU time, and detection,\n", 1/o.margin, o.margin)
	fmt.Printf("or both below %v (a loaded 2-core machine does not resolve less)\n", floor)
	fmt.Printf("%-7s %-6s %10s %10s %10s %10s %10s  %s\n", "shape", "", "formation", "cpu", "rank lost", "host lost", "cpu/wall", "")
	var bad []string
	for _, s := range strings.Split(o.calibrate, ",") {
		h, p, err := parseShape(s)
		if err != nil {
			return err
		}
		real, err := medianReal(o.rounds, h, p)
		if err != nil {
			return err
		}
		cores := min(o.sharedCores, max(1, int(math.Ceil(float64(real.cpu)/float64(real.formation)-0.05))))
		cfg := sim.WorldConfig{Hosts: h, PerHost: p, SharedCores: cores, Latency: 20 * time.Microsecond, InProcess: true,
			Rdzv: rendezvous.DefaultConfig(), Costs: costs, Seed: o.seed}
		m, err := runModel(cfg, true)
		if err != nil {
			return err
		}
		if m.rankMiss > 0 || m.hostMiss > 0 {
			return fmt.Errorf("model %s: %d ranks missed the lost rank, %d the lost host", s, m.rankMiss, m.hostMiss)
		}
		fmt.Printf("%-7s %-6s %9.3fs %9.3fs %9.3fs %9.3fs %10.2f\n", s, "real", real.formation.Seconds(), real.cpu.Seconds(),
			real.detectRank.Seconds(), real.detectHost.Seconds(), float64(real.cpu)/float64(real.formation))
		fmt.Printf("%-7s %-6s %9.3fs %9.3fs %9.3fs %9.3fs %10.2f\n", "", "model", m.formation.Seconds(), m.cpu.Seconds(),
			m.rank.Seconds(), m.host.Seconds(), float64(m.cpu)/float64(max(m.formation, 1)))
		ms := []time.Duration{m.formation, m.cpu, m.rank, m.host}
		rl := []time.Duration{real.formation, real.cpu, real.detectRank, real.detectHost}
		rs := make([]float64, 4)
		verdict := fmt.Sprintf("within margin (model on %d core(s))", cores)
		for i := range rs {
			rs[i] = ratio(ms[i], rl[i])
			if ms[i] < floor && rl[i] < floor {
				continue
			}
			if r := rs[i]; r > o.margin || r < 1/o.margin {
				verdict = fmt.Sprintf("OUTSIDE margin (model on %d core(s))", cores)
				bad = append(bad, fmt.Sprintf("%s %s", s, []string{"formation", "cpu", "rank lost", "host lost"}[i]))
			}
		}
		fmt.Printf("%-7s %-6s %10.2f %10.2f %10.2f %10.2f %10s  %s\n", "", "ratio", rs[0], rs[1], rs[2], rs[3], "", verdict)
	}
	if len(bad) > 0 {
		fmt.Printf("calibration: outside the margin: %s (the scale table below says which figures rest on them)\n", strings.Join(bad, "; "))
	} else {
		fmt.Println("calibration: every row within the margin")
	}
	return nil
}

// floor is the smallest time the calibration compares by ratio.
const floor = 5 * time.Millisecond

func ratio(model, real time.Duration) float64 {
	if real <= 0 {
		return math.Inf(1)
	}
	return float64(model) / float64(real)
}

// medianReal runs the real code rounds times with detection and keeps
// the median of each column.
func medianReal(rounds, h, p int) (realRun, error) {
	var runs []realRun
	for range rounds {
		r, err := runReal(h, p, 0, true)
		if err != nil {
			return r, fmt.Errorf("real %d×%d: %w", h, p, err)
		}
		runs = append(runs, r)
	}
	med := func(get func(realRun) time.Duration) time.Duration {
		v := make([]time.Duration, len(runs))
		for i, r := range runs {
			v[i] = get(r)
		}
		sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
		return v[(len(v)-1)/2]
	}
	return realRun{hosts: h, per: p,
		formation:  med(func(r realRun) time.Duration { return r.formation }),
		cpu:        med(func(r realRun) time.Duration { return r.cpu }),
		detectRank: med(func(r realRun) time.Duration { return r.detectRank }),
		detectHost: med(func(r realRun) time.Duration { return r.detectHost }),
	}, nil
}

// scaleTable prints the model at o.hosts × o.per, each host with its own
// CPU, against gorun's targets.
func scaleTable(o options, costs sim.Costs) error {
	rc := rendezvous.DefaultConfig()
	cfg := sim.WorldConfig{Hosts: o.hosts, PerHost: o.per, Cores: o.cores, Latency: o.latency, Bandwidth: o.bandwidth,
		StartSpread: o.spread, Rdzv: rc, Costs: costs, Seed: o.seed}
	fmt.Printf("\nscale: %d hosts × %d ranks (%d ranks), %d cores per host, %v one-way latency, %.0f MB/s links, ranks starting over %v (model)\n",
		o.hosts, o.per, o.hosts*o.per, o.cores, o.latency, o.bandwidth/1e6, o.spread)
	m, err := runModel(cfg, true)
	if err != nil {
		return err
	}
	w := m.world
	fmt.Printf("%-44s %12s %14s  %s\n", "", "model", "target", "")
	row := func(what, got, target string, ok bool) {
		v := "met"
		if !ok {
			v = "MISSED"
		}
		fmt.Printf("%-44s %12s %14s  %s\n", what, got, target, v)
	}
	row("formation after the last rank starts", secs(m.formation), "≤ 2 s", m.formation <= 2*time.Second)
	if o.sensitivity > 1 {
		// The calibration's CPU ratios say how far the costs may be off:
		// formation again with every CPU cost multiplied.
		hc := cfg
		hc.Costs = scaleCosts(costs, o.sensitivity)
		if h, err := runModel(hc, false); err == nil {
			row(fmt.Sprintf("  the same, every CPU cost ×%g", o.sensitivity), secs(h.formation), "≤ 2 s", h.formation <= 2*time.Second)
		} else {
			fmt.Printf("  the same, every CPU cost ×%g: %v\n", o.sensitivity, err)
		}
	}
	pt := cfg
	pt.PushTree = true
	if t, err := runModel(pt, false); err == nil {
		row("  the same, the seed's push relayed by √H leaders", secs(t.formation), "≤ 2 s", t.formation <= 2*time.Second)
		var seedOut, treeOut int64
		seedOut = m.world.SentBytes(0, "pushpull")
		treeOut = t.world.SentBytes(0, "pushpull")
		fmt.Printf("  (seed's push-pull bytes sent: %d MB now, %d MB relayed; a design change, modelled only)\n", seedOut>>20, treeOut>>20)
		if o.sensitivity > 1 {
			pt.Costs = scaleCosts(costs, o.sensitivity)
			if t2, err := runModel(pt, false); err == nil {
				row(fmt.Sprintf("  relayed, every CPU cost ×%g", o.sensitivity), secs(t2.formation), "≤ 2 s", t2.formation <= 2*time.Second)
			}
		}
	}
	row("SIGKILLed rank surfaced at every rank", secs(m.rank), "≤ 2 s", m.rank <= 2*time.Second && m.rankMiss == 0)
	named := m.host - m.suspicion
	row("silent host named at every rank, after suspicion", secs(named), "≤ "+secs(rc.GossipLease), named <= rc.GossipLease && m.hostMiss == 0)
	fmt.Printf("  (%.3f s after the silence: first suspected %.3f s after it, when a probe round failed; lease %v; false suspicions %d)\n",
		m.host.Seconds(), m.suspicion.Seconds(), rc.GossipLease, m.falseSusp)
	gossipRows(o, cfg, w, costs)
	launchRows(o, costs, row)
	pmiRows(o, costs)
	perRank := costs.LauncherBytesPerRank
	row("launcher memory per rank (measured slope)", fmt.Sprintf("%.1f KB", float64(perRank)/1024), "≤ 10 KB", perRank <= 10*1024)
	fmt.Printf("  (%s)\n", costs.Source["launcher_bytes_per_rank"])
	return nil
}

func secs(d time.Duration) string { return fmt.Sprintf("%.3f s", d.Seconds()) }

// gossipRows prints the gossip traffic per host: during formation, and in
// steady state (probes and gossip simulated over a window; anti-entropy
// push-pulls computed from the state size and memberlist's scaled interval).
func gossipRows(o options, cfg sim.WorldConfig, formed *sim.World, c sim.Costs) {
	hosts := cfg.Hosts
	var formBytes, formMax int64
	for h := range hosts {
		b := formed.SentBytes(h, "")
		formBytes += b
		formMax = max(formMax, b)
	}
	span := formed.Now().Seconds()
	fmt.Printf("gossip during formation and the two failures (%.1f s): mean %.1f KB/s per host, busiest %.1f KB/s\n",
		span, float64(formBytes)/float64(hosts)/span/1024, float64(formMax)/span/1024)
	w, err := sim.NewWorld(cfg)
	if err != nil {
		return
	}
	w.StartAll()
	w.Run(120*time.Second, w.FormedAll)
	t0 := w.Now() + 20*time.Second // formation's gossip drained
	w.Run(t0, nil)
	before := make([]int64, hosts)
	for h := range hosts {
		before[h] = w.SentBytes(h, "")
	}
	const window = 10 * time.Second
	w.Run(t0+window, nil)
	var steady, steadyMax int64
	for h := range hosts {
		d := w.SentBytes(h, "") - before[h]
		steady += d
		steadyMax = max(steadyMax, d)
	}
	state := hosts*c.StateNodeBytes + hosts*(cfg.PerHost-1)*c.StateRankBytes
	iv := w.AntiEntropyInterval()
	pp := 2 * float64(state) / iv.Seconds() // one push-pull started and one answered per interval
	mean := float64(steady) / float64(hosts) / window.Seconds()
	fmt.Printf("steady gossip per host: probes+gossip %.2f KB/s (busiest %.2f), anti-entropy %.2f KB/s (state %d KB every %v, both ways), total %.2f KB/s\n",
		mean/1024, float64(steadyMax)/window.Seconds()/1024, pp/1024, state/1024, iv, (mean+pp)/1024)
}

func launchRows(o options, c sim.Costs, row func(string, string, string, bool)) {
	for _, th := range []int{-1, 32} {
		r, err := sim.Launch(sim.LaunchConfig{Hosts: o.hosts, PerHost: o.per, FanoutThreshold: th,
			LauncherCores: o.launcherCores, HostCores: o.cores, Latency: o.latency, Costs: c, Seed: o.seed})
		if err != nil {
			fmt.Println("launch:", err)
			continue
		}
		what := fmt.Sprintf("launch, tree (%d direct, %d via agents)", r.Direct, r.ViaParents)
		if th < 0 {
			what = fmt.Sprintf("launch, flat (%d ssh from gorun)", r.Direct)
		}
		row(what, secs(r.LastRank), "≤ 10 s", r.LastRank <= 10*time.Second)
		fmt.Printf("  (last hello %.3f s; launch node CPU %.1f s on %d cores)\n", r.LastHello.Seconds(), r.LauncherBusy.Seconds(), o.launcherCores)
	}
}

func pmiRows(o options, c sim.Costs) {
	fmt.Println("PMI bytes gorun sends one host (MPICH start-up):")
	fmt.Printf("  %-12s %14s %14s %16s %22s\n", "hosts×ranks", "union/barrier", "release", "2 hosts' cards", "every card (allgather)")
	for _, h := range []int{4, 32, o.hosts} {
		b := sim.PMIFence(c, h, o.per)
		fmt.Printf("  %-12s %14d %14d %16d %14d (%d trips)\n", fmt.Sprintf("%d×%d", h, o.per), b.Union, b.Release, b.Neighbours, b.AllGather, b.AllGatherTrips)
	}
	fmt.Println("  the fence (release) is O(1) and reading k hosts' cards O(k × ranks per host); MPICH's own allgather of addresses is O(ranks) by its design")
}

// scaleCosts multiplies every CPU cost of c by f (sizes unchanged).
func scaleCosts(c sim.Costs, f float64) sim.Costs {
	m := func(d time.Duration) time.Duration { return time.Duration(float64(d) * f) }
	c.Packet, c.StateByte, c.PushPull, c.Attach = m(c.Packet), m(c.StateByte), m(c.PushPull), m(c.Attach)
	c.LeaderStart, c.TableEntry, c.GossipMsg = m(c.LeaderStart), m(c.TableEntry), m(c.GossipMsg)
	c.ProcessStart, c.ProcessIdle = m(c.ProcessStart), m(c.ProcessIdle)
	c.SSH, c.AgentStart, c.RankSpawn, c.AgentHello = m(c.SSH), m(c.AgentStart), m(c.RankSpawn), m(c.AgentHello)
	c.SockPacket, c.SockMsg, c.SockConnect, c.SockByte = m(c.SockPacket), m(c.SockMsg), m(c.SockConnect), m(c.SockByte)
	c.UnixMsg, c.UnixConnect = m(c.UnixMsg), m(c.UnixConnect)
	c.DeathLauncher, c.DeathAgent, c.DeathHost = m(c.DeathLauncher), m(c.DeathAgent), m(c.DeathHost)
	c.LineHost, c.LineLauncher = m(c.LineHost), m(c.LineLauncher)
	return c
}
