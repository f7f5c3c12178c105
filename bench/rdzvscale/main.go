// Command rdzvscale measures, in one process, how long a world of N members
// takes to form and how long the survivors take to learn that one member's
// host went away (its address cut off on the network), for several N. It
// prints a table:
//
//	go run ./bench/rdzvscale -sizes 64,256,1024
//
// Members talk over rendezvoustest's in-memory network (real UDP/TCP
// sockets with -net udp): packets, encryption, probes and gossip are real,
// and every member competes for the same cores, which is harsher than N
// hosts. Goals (issue 3): formation < 2 s at 1024, detection < 2 s at
// every size.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

// logLevel is the -log flag.
var logLevel string

// tune holds the failure-detection settings under test (flags).
var tune rendezvous.Config

func main() {
	sizes := flag.String("sizes", "64,256,1024", "comma-separated world sizes")
	network := flag.String("net", "mem", "mem (in-memory network) or udp (loopback sockets)")
	verbose := flag.Bool("v", false, "log warnings")
	flag.StringVar(&logLevel, "log", "", "log level (debug, info, warn); overrides -v")
	def := rendezvous.DefaultConfig()
	flag.DurationVar(&tune.ProbeInterval, "probe", def.ProbeInterval, "Config.ProbeInterval")
	flag.DurationVar(&tune.ProbeTimeout, "probe-timeout", def.ProbeTimeout, "Config.ProbeTimeout")
	flag.DurationVar(&tune.GossipInterval, "gossip", def.GossipInterval, "Config.GossipInterval")
	flag.DurationVar(&tune.SuspicionTimeout, "suspicion", def.SuspicionTimeout, "Config.SuspicionTimeout")
	flag.IntVar(&tune.RetransmitMult, "retransmit", def.RetransmitMult, "Config.RetransmitMult")
	flag.IntVar(&tune.GossipNodes, "gossip-nodes", def.GossipNodes, "Config.GossipNodes")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "rdzvscale:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "rdzvscale:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Printf("%-6s %-5s %12s %12s %12s %12s\n", "size", "net", "formation", "detect-min", "detect-max", "false-loss")
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 2 {
			fmt.Fprintf(os.Stderr, "rdzvscale: bad size %q\n", s)
			os.Exit(2)
		}
		r, err := measure(n, *network, *verbose)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rdzvscale: %d members: %v\n", n, err)
			pprof.StopCPUProfile()
			os.Exit(1)
		}
		fmt.Printf("%-6d %-5s %11.3fs %11.3fs %11.3fs %12d\n", n, *network,
			r.formation.Seconds(), r.detectMin.Seconds(), r.detectMax.Seconds(), r.falseLoss)
	}
}

type result struct {
	formation, detectMin, detectMax time.Duration
	falseLoss                       int // survivors that reported a member other than the victim
}

func measure(n int, network string, verbose bool) (result, error) {
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
	cfgs := make([]rendezvous.Config, n)
	addrs := make([]string, n)
	for r := range cfgs {
		c := rendezvous.DefaultConfig()
		c.JobID, c.Rank, c.WorldSize = "scale", r, n
		c.Host = fmt.Sprintf("h%d", r)
		c.Seed = seed
		c.Secret = []byte("0123456789abcdef0123456789abcdef")
		c.FormationTimeout = 60 * time.Second
		c.ProbeInterval, c.ProbeTimeout, c.GossipInterval = tune.ProbeInterval, tune.ProbeTimeout, tune.GossipInterval
		c.SuspicionTimeout, c.RetransmitMult, c.GossipNodes = tune.SuspicionTimeout, tune.RetransmitMult, tune.GossipNodes
		c.Logger = log
		if network == "mem" {
			addrs[r] = fmt.Sprintf("10.%d.%d.%d:7946", r/62500, r/250%250, r%250+1)
			if r == 0 {
				addrs[r] = seed
			}
			tr, err := nw.NewTransport(addrs[r])
			if err != nil {
				return res, err
			}
			c.Transport = tr
		}
		cfgs[r] = c
	}
	ws := make([]*rendezvous.World, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for r := range cfgs {
		wg.Go(func() { ws[r], errs[r] = rendezvous.Join(context.Background(), cfgs[r]) })
	}
	wg.Wait()
	res.formation = time.Since(start)
	defer func() {
		var cw sync.WaitGroup
		for _, w := range ws {
			if w != nil {
				cw.Go(func() { _ = w.Close() })
			}
		}
		cw.Wait()
	}()
	for r, err := range errs {
		if err != nil {
			return res, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	if network != "mem" {
		return res, nil // no way to cut a loopback member off from here
	}
	// Let the world settle (the seed's pushes, first probes) before the cut.
	time.Sleep(2 * time.Second)
	victim := n / 2
	var falseLoss atomic.Int32
	lat := make([]time.Duration, 0, n-1)
	var mu sync.Mutex
	cut := time.Now()
	nw.Isolate(addrs[victim])
	var dw sync.WaitGroup
	for r, w := range ws {
		if r == victim {
			continue
		}
		dw.Go(func() {
			select {
			case <-w.Failed():
			case <-time.After(30 * time.Second):
				return
			}
			d := time.Since(cut)
			var le *rendezvous.LostError
			if e, ok := w.Err().(*rendezvous.LostError); ok {
				le = e
			}
			if le == nil || le.Rank != victim {
				falseLoss.Add(1)
			}
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
		})
	}
	dw.Wait()
	if len(lat) != n-1 {
		return res, fmt.Errorf("only %d of %d survivors saw the loss within 30 s", len(lat), n-1)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	res.detectMin, res.detectMax = lat[0], lat[len(lat)-1]
	res.falseLoss = int(falseLoss.Load())
	return res, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
