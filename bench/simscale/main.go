// Command simscale runs the discrete-event model of package sim: gorun's
// formation, failure detection, launch and PMI fence at scale, with costs
// measured for the real code on this machine.
//
//	go run ./bench/simscale -measure -costs-out costs.json   # measure costs
//	go run ./bench/simscale -costs costs.json -calibrate 4x4,8x4,16x4,32x4 -hosts 1000 -per 8
//
// It prints the costs and where each came from, a calibration table (the
// real code in one process on this machine's cores beside the model with
// every host on one shared CPU of as many cores, and the margin), with
// -netns a second one against real gorun jobs over namespace hosts
// (netns.go, netnscal.go; root, hosts from tests/testhosts), and the
// table at -hosts × -per against gorun's targets. The model is a model:
// the protocols are restated event by event (package sim's doc), not run
// under a virtual clock.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/sim"
)

type options struct {
	measure, measureProc bool
	measureSock          bool
	measureWake          bool
	measureDeath         string
	costsIn, costsOut    string
	gorunBin, rss        string
	rounds               int
	calibrate            string
	sharedCores          int
	margin, sensitivity  float64
	hosts, per, cores    int
	latency, spread      time.Duration
	bandwidth            float64
	seed                 uint64
	launcherCores        int
	skipScale, verbose   bool
	netns, netnsShapes   string
	netnsRounds          int
}

func main() {
	if code, ok := role(time.Now(), cpuTime()); ok {
		os.Exit(code)
	}
	var o options
	flag.BoolVar(&o.measure, "measure", false, "measure the costs from the real code first (else read -costs)")
	flag.BoolVar(&o.measureProc, "measure-process", false, "read -costs, measure only the process costs (start, idle) again (-gorun), and keep the rest")
	flag.BoolVar(&o.measureSock, "measure-sockets", false, "read -costs, measure only the socket costs between processes again, and keep the rest")
	flag.BoolVar(&o.measureWake, "measure-wake", false, "read -costs, measure only the wake-up excess again, and keep the rest")
	flag.StringVar(&o.measureDeath, "measure-death", "", "HOSTSxPER: measure the death costs from 3 such namespace jobs (needs -netns; with -measure or alone, reading -costs)")
	flag.StringVar(&o.costsIn, "costs", "sim/testdata/costs.json", "costs file to read when not measuring")
	flag.StringVar(&o.costsOut, "costs-out", "", "write the measured costs here")
	flag.StringVar(&o.gorunBin, "gorun", "bin/gorun", "gorun binary (agent start cost)")
	flag.StringVar(&o.rss, "rss", "", "gorun's VmRSS at several -np, as np:KB,np:KB,... (launcher memory per rank)")
	flag.IntVar(&o.rounds, "rounds", 3, "real runs per measurement and calibration row (median)")
	flag.StringVar(&o.calibrate, "calibrate", "4x4,8x4,16x4,32x4", "HOSTSxPER shapes run both for real and in the model (empty: none)")
	flag.IntVar(&o.sharedCores, "shared-cores", 2, "cores of the one CPU every host shares in calibration runs")
	flag.Float64Var(&o.margin, "margin", 2, "accepted calibration margin: model/real within [1/m, m]")
	flag.Float64Var(&o.sensitivity, "sensitivity", 2, "also run formation with every CPU cost multiplied by this (1: not)")
	flag.IntVar(&o.hosts, "hosts", 1000, "hosts of the scale table")
	flag.IntVar(&o.per, "per", 8, "ranks per host of the scale table")
	flag.IntVar(&o.cores, "cores", 8, "cores per host in the scale table")
	flag.DurationVar(&o.latency, "latency", 50*time.Microsecond, "one-way latency between hosts")
	flag.Float64Var(&o.bandwidth, "bandwidth", 1.25e9, "bytes per second of each host's link (10 Gb/s)")
	flag.DurationVar(&o.spread, "spread", time.Second, "ranks start spread over this window in the scale table")
	flag.Uint64Var(&o.seed, "seed", 1, "random seed of the model")
	flag.IntVar(&o.launcherCores, "launcher-cores", 8, "cores of the node gorun runs on")
	flag.BoolVar(&o.skipScale, "no-scale", false, "skip the scale table")
	flag.BoolVar(&o.verbose, "v", false, "print each measurement")
	flag.StringVar(&o.netns, "netns", "", "namespace calibration over the hosts of this netns-up.sh env file (STATE/env; root; empty: none)")
	flag.StringVar(&o.netnsShapes, "netns-shapes", "4x2,8x2,16x2,32x2", "HOSTSxPER shapes of the namespace calibration")
	flag.IntVar(&o.netnsRounds, "netns-rounds", 3, "real gorun jobs per namespace calibration row (median)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "simscale:", err)
		os.Exit(1)
	}
}

// role runs the binary as one of the processes the measurements start
// (a rank, the echo end, the socket peer, a victim, a stand-in), chosen by
// its environment, and returns its exit code; ok is false when it is the
// command itself. start and cpu0 are taken first thing in main.
func role(start time.Time, cpu0 time.Duration) (code int, ok bool) {
	switch {
	case os.Getenv(rankEnv) == "1":
		return rankMain(start, cpu0), true
	case os.Getenv(echoEnv) == "1":
		return echoMain(), true
	case os.Getenv(sockPeerEnv) == "1":
		return sockPeerMain(), true
	case os.Getenv(victimEnv) != "":
		return victimMain(), true
	case os.Getenv(standInEnv) != "":
		return standInMain(), true
	case os.Getenv(chatterEnv) != "":
		return chatterMain(), true
	}
	return 0, false
}

func run(o options) error {
	fmt.Println("simscale: a MODEL of gorun's protocols (package sim), costs measured from the real code on this machine")
	costs, err := loadOrMeasure(o)
	if err != nil {
		return err
	}
	printCosts(costs)
	if o.calibrate != "" {
		if err := calibrate(o, costs); err != nil {
			return err
		}
	}
	if o.netns != "" {
		if err := netnsCalibrate(o, costs); err != nil {
			return fmt.Errorf("namespace calibration: %w", err)
		}
	}
	if o.skipScale {
		return nil
	}
	return scaleTable(o, costs)
}

func loadOrMeasure(o options) (sim.Costs, error) {
	if o.measureProc || o.measureSock || o.measureWake || (!o.measure && o.measureDeath != "") {
		return remeasure(o)
	}
	if !o.measure {
		return sim.LoadCosts(o.costsIn)
	}
	pts, err := parseRSS(o.rss)
	if err != nil {
		return sim.Costs{}, err
	}
	fmt.Printf("\nmeasuring costs (real rendezvous.Join in this process, median of %d runs each):\n", o.rounds)
	logf := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	c, err := measureCosts(o.rounds, o.gorunBin, pts, logf)
	if err != nil {
		return c, fmt.Errorf("measure: %w", err)
	}
	if err := deathCosts(&c, o, logf); err != nil {
		return c, err
	}
	return c, validateAndWrite(c, o.costsOut)
}

// validateAndWrite checks c and writes it to path as JSON, if path is set.
func validateAndWrite(c sim.Costs, path string) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// remeasure reads -costs without validating them (a file from before
// ProcessStart or the socket costs lacks them), measures the process
// costs (-measure-process) or the socket costs (-measure-sockets) and
// writes the result to -costs-out if set.
func remeasure(o options) (sim.Costs, error) {
	var c sim.Costs
	b, err := os.ReadFile(o.costsIn)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil {
		return c, fmt.Errorf("-costs %s: %w", o.costsIn, err)
	}
	logf := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	if c.Source == nil {
		c.Source = map[string]string{}
	}
	if o.measureSock {
		fmt.Println("\nmeasuring the socket costs (two processes over loopback):")
		if err := measureSocketCosts(&c, 2*o.rounds+1, logf); err != nil {
			return c, err
		}
	}
	if o.measureProc {
		fmt.Println("\nmeasuring the process start cost (real 1×2 jobs on this machine):")
		if err := measureProcessCosts(&c, o.gorunBin, 2*o.rounds+1, logf); err != nil {
			return c, err
		}
	}
	if o.measureWake {
		fmt.Println("\nmeasuring the wake-up excess (stand-in processes with a rank's timers):")
		if err := measureWake(&c, o.rounds, rendezvous.DefaultConfig().GossipInterval, logf); err != nil {
			return c, err
		}
	}
	if o.measureDeath != "" {
		if err := deathCosts(&c, o, logf); err != nil {
			return c, err
		}
	}
	return c, validateAndWrite(c, o.costsOut)
}

// deathCosts measures the death costs from -measure-death's namespace
// jobs and the line relay from jobs of one rank, or, without hosts to
// run them on, keeps those of -costs and says so.
func deathCosts(c *sim.Costs, o options, logf func(string, ...any)) error {
	if o.measureDeath != "" && o.netns != "" {
		hosts, per, err := parseShape(o.measureDeath)
		if err != nil {
			return fmt.Errorf("-measure-death: %w", err)
		}
		fmt.Printf("\nmeasuring the death costs (real %s namespace jobs, gorun's own processes around a SIGKILL):\n", o.measureDeath)
		if err := measureDeath(c, o, hosts, per, 3, logf); err != nil {
			return err
		}
		fmt.Println("\nmeasuring the line relay (real jobs of one rank on a namespace host printing lines):")
		return measureLines(c, o, 3, logf)
	}
	if o.measureDeath != "" {
		return fmt.Errorf("-measure-death %s needs the namespace hosts (-netns)", o.measureDeath)
	}
	old, err := sim.LoadCosts(o.costsIn)
	if err != nil {
		return fmt.Errorf("death costs: not measured in this run (they need the namespace hosts: -netns, -measure-death), and -costs gave none: %w", err)
	}
	c.DeathLauncher, c.DeathAgent, c.DeathHost = old.DeathLauncher, old.DeathAgent, old.DeathHost
	c.LineLauncher, c.LineHost = old.LineLauncher, old.LineHost
	for _, k := range []string{"death_launcher_ns,death_agent_ns,death_host_ns", "line_launcher_ns,line_host_ns"} {
		c.Source[k] = "from " + o.costsIn + ", not measured in this run (it needs the namespace hosts): " + old.Source[k]
	}
	logf("  death costs: from %s (not measured in this run: no namespace hosts)", o.costsIn)
	return nil
}

func parseRSS(s string) ([]rssPoint, error) {
	if s == "" {
		return nil, fmt.Errorf("-rss: need gorun's VmRSS at two or more -np (np:KB,...), from scripts/sim-scale.sh")
	}
	var pts []rssPoint
	for _, f := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(f, ":")
		np, err1 := strconv.Atoi(a)
		kb, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || np < 1 || kb < 1 {
			return nil, fmt.Errorf("-rss: %q is not np:KB", f)
		}
		pts = append(pts, rssPoint{np, kb})
	}
	if len(pts) < 2 {
		return nil, fmt.Errorf("-rss: %d points; need two or more -np", len(pts))
	}
	return pts, nil
}

func printCosts(c sim.Costs) {
	fmt.Println("\ncosts (CPU time per occurrence; sizes in bytes):")
	fmt.Printf("  packet %v, ping %d B, alive msg %d B, gone %d B\n", c.Packet, c.PingBytes, c.AliveBytes, c.GoneBytes)
	fmt.Printf("  push-pull %v per end + %v per state byte; state %d B per member, %d B per attached rank\n", c.PushPull, c.StateByte, c.StateNodeBytes, c.StateRankBytes)
	fmt.Printf("  leader start %v, attach %v, table entry %v (%d B)\n", c.LeaderStart, c.Attach, c.TableEntry, c.TableEntryBytes)
	fmt.Printf("  ssh %v (wall %v), agent start %v, rank spawn %v, agent hello %v\n", c.SSH, c.SSHWall, c.AgentStart, c.RankSpawn, c.AgentHello)
	fmt.Printf("  launcher memory %d B per rank (+ %d KB)\n", c.LauncherBytesPerRank, c.LauncherBase/1024)
	keys := make([]string, 0, len(c.Source))
	for k := range c.Source {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("    %s: %s\n", k, c.Source[k])
	}
}

// parseShape reads HOSTSxPER.
func parseShape(s string) (int, int, error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "x")
	h, err1 := strconv.Atoi(a)
	p, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || h < 1 || p < 2 {
		return 0, 0, fmt.Errorf("shape %q is not HOSTSxPER (PER ≥ 2)", s)
	}
	return h, p, nil
}

// modelRun is one model run: formation, then a SIGKILLed attached rank,
// then a silent host, as runReal does with the real code.
type modelRun struct {
	formation, cpu     time.Duration
	rank, host         time.Duration
	suspicion          time.Duration // from the silence to the first suspicion
	rankMiss, hostMiss int
	world              *sim.World
	falseSusp          int64
}

func runModel(cfg sim.WorldConfig, detect bool) (modelRun, error) {
	var m modelRun
	w, err := sim.NewWorld(cfg)
	if err != nil {
		return m, err
	}
	m.world = w
	w.StartAll()
	w.Run(120*time.Second, w.FormedAll)
	f, ok := w.Formation()
	if !ok {
		return m, fmt.Errorf("model %d×%d did not form in 120 s", cfg.Hosts, cfg.PerHost)
	}
	m.formation = f
	for h := range cfg.Hosts {
		m.cpu += w.Busy(h)
		if cfg.SharedCores > 0 {
			break // one CPU
		}
	}
	if !detect {
		return m, nil
	}
	t := w.Now() + 2*time.Second // settle, as runReal does
	w.Run(t, nil)
	w.ResetLost()
	w.KillRank(cfg.PerHost + 1)
	w.Run(t+30*time.Second, w.AllSurfaced)
	m.rank, m.rankMiss = w.Surfaced(t)
	t = w.Now() + time.Second
	w.Run(t, nil)
	w.ResetLost()
	w.SilenceHost(cfg.Hosts / 2)
	w.Run(t+30*time.Second, w.AllSurfaced)
	m.host, m.hostMiss = w.Surfaced(t)
	m.suspicion = w.FirstSuspicion() - t
	m.falseSusp = w.Count.FalseSuspicions
	return m, nil
}
