package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/sim"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// netnsWorkspace is what a run of real jobs over -netns needs: the hosts,
// this executable (the ranks' stand-in) and a scratch directory named
// prefix*, which the caller removes.
func netnsWorkspace(o options, prefix string) (h *testhosts.Netns, exe, dir string, err error) {
	if h, err = readNetns(o.netns); err != nil {
		return nil, "", "", err
	}
	if exe, err = os.Executable(); err != nil {
		return nil, "", "", err
	}
	if dir, err = os.MkdirTemp("", prefix); err != nil {
		return nil, "", "", err
	}
	return h, exe, dir, nil
}

// netnsCalibrate runs each shape as real gorun jobs over the namespace
// hosts (o.netnsRounds each) and the model on the same shapes with the
// same start times, and prints medians side by side with the margin,
// which it states before running anything.
func netnsCalibrate(o options, costs sim.Costs) error {
	h, exe, dir, err := netnsWorkspace(o, "simscale-netns-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lat, err := vethLatency(h.Addrs[0])
	if err != nil {
		return err
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("\nnamespace calibration: real gorun jobs over namespace hosts of set %s (own veth and sshd each; gorun, one agent per host over ssh,\n", h.Set)
	fmt.Printf("real rank processes and sockets, all on this machine's %d cores, shared with other work: load %s)\n", o.sharedCores, strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Printf("vs the model with every host on one CPU of %d cores, the real job's rank start times, and as the delay of every message between ranks\n", o.sharedCores)
	fmt.Printf("(between hosts and over attach streams) the one-way delay from one idle process to another measured before each job (UDP echo to a host, half the median\n")
	fmt.Printf("round trip: waking each end on the shared cores included; the kernel's path alone, half a TCP connect to a host's sshd, is %v)\n", lat.Round(time.Microsecond))
	fmt.Printf("each job: formation; 2 s later rank PER+1 SIGKILLed; 1 s after every rank saw it, host HOSTS/2 cut off (eth0 down); median of %d jobs\n", o.netnsRounds)
	fmt.Printf("accepted margin, stated before the runs: model/real within [%.2f, %.2f] for each of formation, its CPU time, and both detections, or both below %v\n", 1/o.margin, o.margin, floor)
	fmt.Printf("\"model\" gives the job both cores whole; \"loaded\" runs every CPU cost ÷ the share of a core a newcomer got just before the job (cpuShare),\n")
	fmt.Printf("the machine's other work taking the rest (added after the first runs: the times, not the CPU, are judged on this row)\n")
	fmt.Printf("a killed rank's stream closes in the model after the exit delay measured before each job (a process of a rank's size SIGKILLed, until its\n")
	fmt.Printf("peer reads the stream's end; added after the first runs)\n")
	fmt.Printf("%-7s %-7s %10s %10s %10s %10s %10s %10s %6s %10s\n", "shape", "", "formation", "cpu", "rank lost", "host lost", "launch", "msg delay", "share", "exit")
	var bad []string
	for _, s := range strings.Split(o.netnsShapes, ",") {
		hosts, per, err := parseShape(s)
		if err != nil {
			return err
		}
		if hosts > len(h.Hosts) {
			return fmt.Errorf("shape %s: the set has %d hosts", s, len(h.Hosts))
		}
		res, err := netnsShape(o, costs, h, hosts, per, exe, dir)
		if err != nil {
			return err
		}
		bad = append(bad, printNetnsShape(o, s, res)...)
	}
	if len(bad) > 0 {
		fmt.Printf("namespace calibration: outside the margin: %s\n", strings.Join(bad, "; "))
	} else {
		fmt.Println("namespace calibration: every row within the margin")
	}
	return nil
}

// netnsShape runs one shape's real jobs and, for each, the model from the
// same start times; it returns the medians of each column, real and
// model. After each job nothing may be left running on the hosts.
func netnsShape(o options, costs sim.Costs, h *testhosts.Netns, hosts, per int, exe, dir string) ([3]netnsRun, error) {
	var reals, models, loaded []netnsRun
	var missed []string
	var deaths []deathCPU
	defer func() {
		if len(missed) > 0 {
			fmt.Printf("        never learned of the SIGKILLed rank (their rank-lost figure is over the others): %s\n", strings.Join(missed, "; "))
		}
		if len(deaths) > 0 {
			fmt.Printf("        gorun's own CPU on the death, per job (launch side / dead rank's host / each other host): %v\n", deaths)
		}
	}()
	for round := range o.netnsRounds {
		r, err := oneNetnsJob(o, h, hosts, per, exe, dir)
		if err != nil {
			return [3]netnsRun{}, fmt.Errorf("job %d: %w", round+1, err)
		}
		deaths = append(deaths, r.death)
		cfg := sim.WorldConfig{Hosts: hosts, PerHost: per, SharedCores: o.sharedCores, Latency: r.delay, LocalLatency: r.delay, ExitDelay: r.exit, Starts: r.starts, ReportFormed: true,
			Rdzv: rendezvous.DefaultConfig(), Costs: costs, Seed: o.seed + uint64(round)}
		m, err := runModel(cfg, true)
		if err != nil {
			return [3]netnsRun{}, err
		}
		if m.rankMiss > 0 || m.hostMiss > 0 {
			return [3]netnsRun{}, fmt.Errorf("model %d×%d: %d ranks missed the lost rank, %d the lost host", hosts, per, m.rankMiss, m.hostMiss)
		}
		if o.verbose {
			fmt.Printf("  job %d: message delay %v; real formation %v cpu %v rank %v host %v launch %v; model %v %v %v %v\n", round+1,
				r.delay, r.formation, r.cpu, r.rank, r.host, r.launch, m.formation, m.cpu, m.rank, m.host)
		}
		cfg.Costs = scaleCosts(costs, 1/r.share)
		ml, err := runModel(cfg, true)
		if err != nil {
			// At a small share every cost ÷ it can ask more of the
			// two cores than they have: the loaded model's queue
			// never drains. A finding for this row (counted as not
			// formed: outside any margin), not the end of the run.
			fmt.Printf("  job %d: the loaded model (costs ÷ share %.2f) failed: %v\n", round+1, r.share, err)
			ml = modelRun{formation: notFormed, cpu: notFormed, rank: notFormed, host: notFormed}
		}
		if o.verbose {
			fmt.Printf("  job %d: exit delay %v, share %.2f; loaded model %v %v %v %v\n", round+1, r.exit, r.share, ml.formation, ml.cpu, ml.rank, ml.host)
		}
		if len(r.rankMissed) > 0 {
			missed = append(missed, fmt.Sprintf("%d×%d job %d: ranks %v", hosts, per, round+1, r.rankMissed))
		}
		reals = append(reals, r)
		models = append(models, netnsRun{formation: m.formation, cpu: m.cpu, rank: m.rank, host: m.host})
		loaded = append(loaded, netnsRun{formation: ml.formation, cpu: ml.cpu, rank: ml.rank, host: ml.host})
	}
	med := func(runs []netnsRun) netnsRun {
		return netnsRun{
			formation: medianOf(runs, func(r netnsRun) time.Duration { return r.formation }),
			cpu:       medianOf(runs, func(r netnsRun) time.Duration { return r.cpu }),
			rank:      medianOf(runs, func(r netnsRun) time.Duration { return r.rank }),
			host:      medianOf(runs, func(r netnsRun) time.Duration { return r.host }),
			launch:    medianOf(runs, func(r netnsRun) time.Duration { return r.launch }),
			delay:     medianOf(runs, func(r netnsRun) time.Duration { return r.delay }),
			share:     medianShare(runs),
			exit:      medianOf(runs, func(r netnsRun) time.Duration { return r.exit }),
		}
	}
	return [3]netnsRun{med(reals), med(models), med(loaded)}, nil
}

// notFormed stands for a model run that never formed: longer than any
// run the model is given.
const notFormed = 1000 * time.Second

// oneNetnsJob measures the message delay, exit delay and core share, then
// runs one real job of hosts×per, and checks nothing is left on the
// hosts after it.
func oneNetnsJob(o options, h *testhosts.Netns, hosts, per int, exe, dir string) (netnsRun, error) {
	j := &netnsJob{h: h, hosts: hosts, per: per, gorun: o.gorunBin, exe: exe, dir: dir, verbose: o.verbose}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	delay, err := messageDelay(ctx, h, h.Hosts[min(1, hosts-1)])
	if err != nil {
		return netnsRun{}, err
	}
	exit, err := exitDelay(ctx)
	if err != nil {
		return netnsRun{}, err
	}
	share := cpuShare()
	r, err := j.run(ctx)
	r.delay, r.share, r.exit = delay, share, exit
	if err != nil {
		return r, fmt.Errorf("real %d×%d: %w", hosts, per, err)
	}
	if left, err := strays(h, hosts); err != nil || len(left) > 0 {
		return r, fmt.Errorf("real %d×%d: left running after the job: %v %v", hosts, per, left, err)
	}
	return r, nil
}

// String prints a job's death figures.
func (d deathCPU) String() string {
	return fmt.Sprintf("%v/%v/%v", d.launcher.Round(10*time.Microsecond), d.victimHost.Round(10*time.Microsecond), d.otherHost.Round(10*time.Microsecond))
}

// printNetnsShape prints one shape's rows (real, model, loaded model, and
// the ratios) and returns what lies outside the margin: the CPU judged on
// the model (CPU time is what load does not stretch), the times on the
// loaded model.
func printNetnsShape(o options, shape string, res [3]netnsRun) (bad []string) {
	real := res[0]
	cols := func(r netnsRun) []time.Duration { return []time.Duration{r.formation, r.cpu, r.rank, r.host} }
	rl := cols(real)
	fmt.Printf("%-7s %-7s %9.3fs %9.3fs %9.3fs %9.3fs %9.3fs %8dµs %6.2f %9.3fs\n", shape, "real", rl[0].Seconds(), rl[1].Seconds(), rl[2].Seconds(), rl[3].Seconds(),
		real.launch.Seconds(), real.delay.Microseconds(), real.share, real.exit.Seconds())
	names := []string{"formation", "cpu", "rank lost", "host lost"}
	for k, name := range []string{"model", "loaded"} {
		ms := cols(res[k+1])
		fmt.Printf("%-7s %-7s %9.3fs %9.3fs %9.3fs %9.3fs\n", "", name, ms[0].Seconds(), ms[1].Seconds(), ms[2].Seconds(), ms[3].Seconds())
		var rs [4]string
		for i := range rs {
			r := ratio(ms[i], rl[i])
			rs[i] = fmt.Sprintf("%.2f", r)
			if ms[i] < floor && rl[i] < floor {
				rs[i] = "(<5ms)"
				continue
			}
			judged := (i == 1) == (k == 0)
			if r > o.margin || r < 1/o.margin {
				if judged {
					bad = append(bad, shape+" "+names[i])
				}
				rs[i] += "!"
			}
		}
		fmt.Printf("%-7s %-7s %10s %10s %10s %10s\n", "", "ratio", rs[0], rs[1], rs[2], rs[3])
	}
	return bad
}

// medianShare is the median of the runs' shares.
func medianShare(runs []netnsRun) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = r.share
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

// medianOf is the median of get over runs.
func medianOf(runs []netnsRun, get func(netnsRun) time.Duration) time.Duration {
	v := make([]time.Duration, len(runs))
	for i, r := range runs {
		v[i] = get(r)
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}
