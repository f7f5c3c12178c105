// Command rdzvscale measures, in one process, how long a world of N members
// takes to form and how long the survivors take to learn that a member is
// gone, for several N, both with one gossip member per rank (flat) and with
// host leaders (-per ranks on each simulated host: the host's local rank 0
// gossips, the others attach to it). It prints a table:
//
//	go run ./bench/rdzvscale -sizes 64,256,1024 -mode both -per 16
//
// Detection is measured for what can go away: in flat mode a member whose
// address is cut off; with host leaders an attached rank whose stream to its
// leader closes (what a crash does) and a leader cut off together with its
// host's streams (a host lost), counted on the ranks of the other hosts.
//
// Members talk over rendezvoustest's in-memory network (real UDP/TCP
// sockets with -net udp): packets, encryption, probes and gossip are real,
// and every member competes for the same cores, which is harsher than N
// hosts. Goals: formation < 2 s at 1024, detection < 2 s at
// every size.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

// logLevel is the -log flag.
var logLevel string

// formOnly is the -form-only flag: the largest sizes are about formation.
var formOnly bool

// attachMode is the -attach flag. With real Unix sockets an attach stream
// is buffered by the kernel, as in a job, and carries its peer's pid, so a
// silent stream's lease asks the kernel whether the peer is stopped or only
// waits for a CPU (internal/liveness). In-memory pipes are unbuffered;
// "mem" pipes name this process as their peer (rendezvous.PeerCredConn),
// which is what a Unix socket would say of ranks in one process, so the
// lease asks the kernel too; "bare" pipes carry no pid and the lease
// alone decides, with only the process's stall log to excuse what the
// process lost: it cannot see a goroutine that is ready and not run until
// that goroutine runs, and in a process of thousands of ranks the Go
// scheduler leaves some of them waiting seconds while others run on time.
var attachMode string

// cpuProfile and memProfile are the -cpuprofile and -memprofile flags;
// runs counts the measurements made, to name their profiles.
var (
	cpuProfile, memProfile string
	runs                   int
)

// profileName is the file of this run's profile: base for the first run,
// base.k for the k-th after it.
func profileName(base string) string {
	if runs == 0 {
		return base
	}
	return base + "." + strconv.Itoa(runs)
}

// startProfile starts the CPU profile of a formation (if asked for) and
// returns what ends it and writes the allocation profile.
func startProfile() (func(), error) {
	var f *os.File
	if cpuProfile != "" {
		var err error
		if f, err = os.Create(profileName(cpuProfile)); err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return nil, err
		}
	}
	return func() {
		if f != nil {
			pprof.StopCPUProfile()
			_ = f.Close()
		}
		if memProfile != "" {
			// Cumulative since the process started: allocations by
			// earlier runs are in it too (one size per run to read it).
			if mf, err := os.Create(profileName(memProfile)); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(mf, 0)
				_ = mf.Close()
			}
		}
		runs++
	}, nil
}

// tune holds the failure-detection settings under test (flags).
var tune rendezvous.Config

// formationTimeout is the -formation-timeout flag.
var formationTimeout time.Duration

func main() {
	sizes := flag.String("sizes", "64,256,1024", "comma-separated world sizes")
	network := flag.String("net", "mem", "mem (in-memory network) or udp (loopback sockets)")
	mode := flag.String("mode", "both", "flat, hier (host leaders) or both")
	per := flag.Int("per", 16, "ranks per simulated host with host leaders")
	verbose := flag.Bool("v", false, "log warnings")
	flag.StringVar(&logLevel, "log", "", "log level (debug, info, warn); overrides -v")
	def := rendezvous.DefaultConfig()
	flag.DurationVar(&tune.ProbeInterval, "probe", def.ProbeInterval, "Config.ProbeInterval")
	flag.DurationVar(&tune.ProbeTimeout, "probe-timeout", def.ProbeTimeout, "Config.ProbeTimeout")
	flag.DurationVar(&tune.GossipInterval, "gossip", def.GossipInterval, "Config.GossipInterval")
	flag.DurationVar(&tune.SuspicionTimeout, "suspicion", def.SuspicionTimeout, "Config.SuspicionTimeout")
	flag.DurationVar(&tune.GossipLease, "gossip-lease", def.GossipLease, "Config.GossipLease")
	flag.IntVar(&tune.RetransmitMult, "retransmit", def.RetransmitMult, "Config.RetransmitMult")
	flag.IntVar(&tune.GossipNodes, "gossip-nodes", def.GossipNodes, "Config.GossipNodes")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of each formation (Join to the last Join's return) to this file (.1, .2, ... appended after the first run)")
	flag.StringVar(&memProfile, "memprofile", "", "write the allocations made up to the end of each formation to this file (suffixed like -cpuprofile)")
	flag.BoolVar(&formOnly, "form-only", false, "measure formation only (no detection)")
	flag.DurationVar(&formationTimeout, "formation-timeout", time.Minute, "Config.FormationTimeout (DefaultConfig's is 2m)")
	flag.StringVar(&attachMode, "attach", "mem", "host leaders' attach streams: mem (in-memory pipes naming this process as their peer, as a Unix socket would), bare (in-memory pipes without a peer: the lease alone judges) or unix (abstract Unix sockets, as in a job; formation only)")
	flag.Parse()
	if attachMode != "mem" && attachMode != "bare" && attachMode != "unix" {
		fmt.Fprintf(os.Stderr, "rdzvscale: -attach %q: want mem, bare or unix\n", attachMode)
		os.Exit(2)
	}
	if memProfile != "" {
		runtime.MemProfileRate = 64 << 10
	}
	fmt.Printf("%-6s %-5s %-11s %10s %8s %8s %21s %21s %10s %12s %12s %10s\n", "size", "net", "mode", "formation", "cpu", "lag",
		"detect rank min..max", "detect host min..max", "false-loss", "heap/member", "stack/member", "goroutines")
	var modes []int // ranks per host; 1 is flat
	switch *mode {
	case "flat":
		modes = []int{1}
	case "hier":
		modes = []int{*per}
	default:
		modes = []int{1, *per}
	}
	failed := false
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 2 {
			fmt.Fprintf(os.Stderr, "rdzvscale: bad size %q\n", s)
			os.Exit(2)
		}
		for _, p := range modes {
			name := "flat"
			if p > 1 {
				if n%p != 0 {
					fmt.Fprintf(os.Stderr, "rdzvscale: %d ranks do not split into hosts of %d\n", n, p)
					os.Exit(2)
				}
				name = fmt.Sprintf("%dx%d", n/p, p)
			}
			r, err := measure(n, p, *network, *verbose)
			if err != nil {
				fmt.Printf("%-6d %-5s %-11s %10s %8s %7.3fs  %v\n", n, *network, name, "-", "-", r.lag.Seconds(), err)
				failed = true
				continue
			}
			span := func(a, b time.Duration) string {
				if a == 0 && b == 0 {
					return "-"
				}
				return fmt.Sprintf("%.3fs..%.3fs", a.Seconds(), b.Seconds())
			}
			fmt.Printf("%-6d %-5s %-11s %9.3fs %7.3fs %7.3fs %21s %21s %10d %10.1fKB %10.1fKB %10d\n", n, *network, name, r.formation.Seconds(), r.cpu.Seconds(), r.lag.Seconds(),
				span(r.detectMin, r.detectMax), span(r.hostMin, r.hostMax), r.falseLoss,
				float64(r.mem.heap)/float64(n)/1024, float64(r.mem.stack)/float64(n)/1024, r.mem.goroutines)
		}
	}
	if failed {
		os.Exit(1)
	}
}

type result struct {
	formation, detectMin, detectMax time.Duration
	cpu                             time.Duration // CPU time (user + system) of the whole process during formation
	lag                             time.Duration // the longest a ticking goroutine waited past its tick during formation
	hostMin, hostMax                time.Duration // host leaders: a whole host lost
	falseLoss                       int           // survivors that reported a member other than the victim
	mem                             memUse        // the process's memory once formation ended
}

// memUse is what the process holds once formation has ended, after a
// garbage collection: what every member costs while the world lives,
// without the garbage that peak RSS also counts.
type memUse struct {
	heap       uint64 // live heap bytes (HeapAlloc after a GC)
	stack      uint64 // goroutine stacks in use (StackInuse)
	goroutines int
}

// memAfter collects garbage and reads memUse.
func memAfter() memUse {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memUse{heap: ms.HeapAlloc, stack: ms.StackInuse, goroutines: runtime.NumGoroutine()}
}

// rankAttach is one rank's view of the in-memory attach network; it keeps
// the stream the rank dialled, so the benchmark can close it as a crash of
// that rank would.
type rankAttach struct {
	*rendezvoustest.AttachNet
	mu   sync.Mutex
	conn net.Conn
}

func (a *rankAttach) Dial(ctx context.Context, name string) (net.Conn, error) {
	c, err := a.AttachNet.Dial(ctx, name)
	if err == nil {
		c = a.named(c)
		a.mu.Lock()
		a.conn = c
		a.mu.Unlock()
	}
	return c, err
}

// Listen wraps the leader's listener so that its streams name their peer
// too (-attach mem).
func (a *rankAttach) Listen(name string) (net.Listener, error) {
	ln, err := a.AttachNet.Listen(name)
	if err != nil || attachMode == "bare" {
		return ln, err
	}
	return namedListener{ln}, nil
}

// named is c naming this process as its peer, unless -attach bare.
func (a *rankAttach) named(c net.Conn) net.Conn {
	if attachMode == "bare" {
		return c
	}
	return procConn{c}
}

// procConn is an in-memory stream whose peer is this process, said as a
// Unix socket's kernel would say it (rendezvous.PeerCredConn). No
// compile-time assertion of that: the bench script builds this driver
// over older revisions of rendezvous too (ANCHOR), which ignore the
// method.
type procConn struct{ net.Conn }

func (procConn) PeerCred() (uid, pid int, ok bool) { return os.Getuid(), os.Getpid(), true }

// namedListener accepts procConns.
type namedListener struct{ net.Listener }

func (l namedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return procConn{c}, nil
}

func (a *rankAttach) sever() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		_ = a.conn.Close()
	}
}

func measure(n, per int, network string, verbose bool) (result, error) {
	var res result
	lvl := zerolog.ErrorLevel + 1
	if verbose {
		lvl = zerolog.WarnLevel
	}
	if l, err := zerolog.ParseLevel(logLevel); logLevel != "" && err == nil {
		lvl = l
	}
	log := zerolog.New(os.Stderr).Level(lvl)
	nw := &rendezvoustest.Network{}
	seed := "10.0.0.1:7946"
	if network == "udp" {
		p, err := freePort()
		if err != nil {
			return res, err
		}
		seed = "127.0.0.1:" + strconv.Itoa(p)
	}
	cfgs, addrs, attach, err := configs(n, per, network, seed, nw, log)
	if err != nil {
		return res, err
	}
	ws := make([]*rendezvous.World, n)
	errs := make([]error, n)
	ended := make([]time.Time, n) // when each Join returned: the first failure is the cause, the rest follow
	var wg sync.WaitGroup
	stopProfile, err := startProfile()
	if err != nil {
		return res, err
	}
	cpu0 := cpuTime()
	stopLag := watchLag()
	start := time.Now()
	for r := range cfgs {
		wg.Go(func() {
			ws[r], errs[r] = rendezvous.Join(context.Background(), cfgs[r])
			ended[r] = time.Now()
		})
	}
	wg.Wait()
	res.formation = time.Since(start)
	res.cpu = cpuTime() - cpu0
	res.lag = stopLag()
	stopProfile()
	res.mem = memAfter()
	defer func() {
		var cw sync.WaitGroup
		for _, w := range ws {
			if w != nil {
				cw.Go(func() { _ = w.Close() })
			}
		}
		cw.Wait()
	}()
	first, failed := -1, 0
	for r, err := range errs {
		if err != nil {
			failed++
			if first < 0 || ended[r].Before(ended[first]) {
				first = r
			}
		}
	}
	if first >= 0 {
		return res, fmt.Errorf("%d ranks failed, the first after %.1fs: rank %d: %w", failed, ended[first].Sub(start).Seconds(), first, errs[first])
	}
	if network != "mem" || formOnly || attachMode == "unix" {
		return res, nil // no way to cut a loopback member off from here
	}
	// Let the world settle (the seed's pushes, first probes) before the cut.
	time.Sleep(2 * time.Second)
	if per == 1 {
		victim := n / 2
		lat, fl, err := detect(ws, victim, []int{victim}, func() { nw.Isolate(addrs[victim]) })
		res.detectMin, res.detectMax, res.falseLoss = lat[0], lat[len(lat)-1], fl
		return res, err
	}
	// An attached rank of one host, then (once that settled) the leader of
	// another with its streams: every rank of that host is lost.
	victim := n/2 + 1
	lat, fl, err := detect(ws, victim, []int{victim}, func() { attach[victim].sever() })
	if err != nil {
		return res, err
	}
	res.detectMin, res.detectMax, res.falseLoss = lat[0], lat[len(lat)-1], fl
	time.Sleep(time.Second)
	leader := n / 4 / per * per
	var host []int
	for r := leader; r < leader+per; r++ {
		host = append(host, r)
	}
	host = append(host, victim)
	lat, fl, err = detect(ws, leader, host, func() {
		nw.Isolate(addrs[leader])
		for _, r := range host[1:per] {
			attach[r].sever()
		}
	})
	if err != nil {
		return res, err
	}
	res.hostMin, res.hostMax, res.falseLoss = lat[0], lat[len(lat)-1], res.falseLoss+fl
	return res, nil
}

// configs are the n members' configurations, per to a host (per > 1:
// host leaders with attached ranks, over in-memory attach streams unless
// -attach unix), with the in-memory gossip network's addresses of the
// members that gossip (network "mem").
func configs(n, per int, network, seed string, nw *rendezvoustest.Network, log zerolog.Logger) ([]rendezvous.Config, []string, []*rankAttach, error) {
	cfgs := make([]rendezvous.Config, n)
	addrs := make([]string, n)
	an := &rendezvoustest.AttachNet{}
	attach := make([]*rankAttach, n)
	for r := range cfgs {
		c := rendezvous.DefaultConfig()
		c.JobID, c.Rank, c.WorldSize = "scale", r, n
		c.Host = fmt.Sprintf("h%d", r)
		c.Seed = seed
		c.Secret = []byte("0123456789abcdef0123456789abcdef")
		c.FormationTimeout = formationTimeout
		c.ProbeInterval, c.ProbeTimeout, c.GossipInterval = tune.ProbeInterval, tune.ProbeTimeout, tune.GossipInterval
		c.SuspicionTimeout, c.RetransmitMult, c.GossipNodes = tune.SuspicionTimeout, tune.RetransmitMult, tune.GossipNodes
		c.GossipLease = tune.GossipLease
		c.Logger = log
		if per > 1 {
			c.Host = fmt.Sprintf("h%d", r/per)
			c.LocalRank, c.LocalWorldSize = r%per, per
			attach[r] = &rankAttach{AttachNet: an}
			c.AttachNet = attach[r]
			if network != "mem" || attachMode == "unix" {
				c.AttachNet = nil // real abstract Unix sockets
			}
		}
		if network == "mem" && r%per == 0 {
			addrs[r] = fmt.Sprintf("10.%d.%d.%d:7946", r/62500, r/250%250, r%250+1)
			if r == 0 {
				addrs[r] = seed
			}
			tr, err := nw.NewTransport(addrs[r])
			if err != nil {
				return nil, nil, nil, err
			}
			c.Transport = tr
		}
		cfgs[r] = c
	}
	return cfgs, addrs, attach, nil
}

// detect runs cut and measures how long each member outside skip takes to
// see its World fail (for the first victim) or, when the World had already
// failed, to get the MemberLost event for victim.
func detect(ws []*rendezvous.World, victim int, skip []int, cut func()) ([]time.Duration, int, error) {
	var falseLoss atomic.Int32
	lat := make([]time.Duration, 0, len(ws))
	var mu sync.Mutex
	start := time.Now()
	cut()
	var dw sync.WaitGroup
	for r, w := range ws {
		if slices.Contains(skip, r) {
			continue
		}
		dw.Go(func() {
			timeout := time.After(30 * time.Second)
			for {
				select {
				case ev := <-w.Events():
					if ev.Kind != rendezvous.MemberLost {
						continue
					}
					if ev.Rank != victim {
						if !slices.Contains(skip, ev.Rank) {
							falseLoss.Add(1)
						}
						continue
					}
				case <-timeout:
					return
				}
				break
			}
			d := time.Since(start)
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
		})
	}
	dw.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if want := len(ws) - len(skip); len(lat) != want {
		return []time.Duration{0}, int(falseLoss.Load()), fmt.Errorf("only %d of %d survivors saw rank %d lost within 30 s", len(lat), want, victim)
	}
	return lat, int(falseLoss.Load()), nil
}

// watchLag starts a goroutine that ticks every 10 ms and notes how late
// each tick is received: the process's own scheduling delay, which every
// member's timers and leases suffer too. The returned func stops it and
// returns the longest delay seen.
func watchLag() func() time.Duration {
	const period = 10 * time.Millisecond
	stop, done := make(chan struct{}), make(chan time.Duration)
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		var worst time.Duration
		last := time.Now()
		for {
			select {
			case <-stop:
				done <- worst
				return
			case <-t.C:
				n := time.Now()
				worst = max(worst, n.Sub(last)-period)
				last = n
			}
		}
	}()
	return func() time.Duration { close(stop); return <-done }
}

// cpuTime is the CPU time this process has used so far (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
