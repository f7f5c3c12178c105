package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/sim"
)

// The wake-up excess (Costs.WakeExcess): how much later a message reaches
// a process parked in epoll when N other processes on the same cores are
// alive with a rank's timers, beyond the same message with none. The
// socket costs and the message delay are measured with nothing else of
// the job's alive; in a real job every message between ranks wakes its
// receiver among the job's other processes, whose timers (gossip every
// 20 ms, probes, the Go runtime's) take the cores in short bursts. The
// model's CPU queue charges those bursts' CPU, not the scheduler's
// latency in waking a process among them.
//
// Stand-ins, not ranks: each is this binary with standInEnv set, a Go
// process that wakes every GossipInterval and spends ProcessIdle's share
// of it (a rank's measured idle CPU per second × the interval) spinning,
// so N of them load the cores as N idle ranks do. This process pings the
// socket peer (sockets.go: a parked Go process echoing UDP) pingGap apart
// and takes half the mean round trip (every hop of a formation pays the
// mean, not the median). A sweep measures N = 0 (no stand-ins), then adds
// stand-ins up to each N of wakeCounts, then removes them all and
// measures N = 0 again; the excess at N is its delay less the mean of the
// two N = 0 figures of its sweep (the anchor, measured in the same
// minute). Median over sweeps.

// standInEnv makes the binary a stand-in: "PERIOD SPIN" (durations); it
// leaves when its stdin closes.
const standInEnv = "GORUN_SIMSCALE_STANDIN"

// wakeCounts are the stand-in counts of a sweep: the namespace
// calibration's 4×2 to 32×2 jobs have 8 to 64 rank processes.
var wakeCounts = []int{8, 16, 32, 64}

const (
	pingGap   = 5 * time.Millisecond
	wakePings = 301
)

func standInMain() int {
	period, spin, err := parseStandIn(os.Getenv(standInEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "simscale stand-in:", err)
		return 2
	}
	fmt.Println("ready")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	})
	defer wg.Wait()
	tick := time.NewTicker(period)
	defer tick.Stop()
	x := 0
	for {
		select {
		case <-stop:
			return x & 0
		case <-tick.C:
			// Spin on this process's own CPU clock, so that a stand-in
			// preempted mid-spin still spends spin, no more.
			c0 := cpuTime()
			for cpuTime()-c0 < spin {
				for i := range 1000 {
					x += i
				}
			}
		}
	}
}

// parseStandIn reads standInEnv's "PERIOD SPIN".
func parseStandIn(v string) (period, spin time.Duration, err error) {
	f := strings.Fields(v)
	if len(f) == 2 {
		period, err = time.ParseDuration(f[0])
		if err == nil {
			spin, err = time.ParseDuration(f[1])
		}
	}
	if len(f) != 2 || err != nil || period <= 0 || spin < 0 {
		return 0, 0, fmt.Errorf("%s=%q is not \"PERIOD SPIN\" (two durations, PERIOD > 0, SPIN ≥ 0)", standInEnv, v)
	}
	return period, spin, nil
}

// standIns is a set of running stand-in processes.
type standIns struct {
	cmds  []*exec.Cmd
	stdin []io.WriteCloser
}

func (s *standIns) add(exe string, n int, period, spin time.Duration) error {
	for range n {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%v %v", standInEnv, period, spin))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		s.cmds, s.stdin = append(s.cmds, cmd), append(s.stdin, in)
		// It is counted only once it runs its timer.
		var line string
		if _, err := fmt.Fscan(out, &line); err != nil || line != "ready" {
			return fmt.Errorf("stand-in %d did not start (%q, %v)", len(s.cmds), line, err)
		}
	}
	return nil
}

// alive reports an error if a stand-in has exited: it must run until
// stop, or the figure measured with it is not at its count.
func (s *standIns) alive() error {
	for i, c := range s.cmds {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			return fmt.Errorf("stand-in %d (pid %d) exited early: %w", i+1, c.Process.Pid, err)
		}
	}
	return nil
}

// stop closes every stand-in's stdin and reaps them all; an error if one
// did not exit cleanly.
func (s *standIns) stop() error {
	for _, in := range s.stdin {
		_ = in.Close()
	}
	var first error
	for i, c := range s.cmds {
		if err := c.Wait(); err != nil && first == nil {
			first = fmt.Errorf("stand-in %d: %w", i+1, err)
		}
	}
	s.cmds, s.stdin = nil, nil
	return first
}

// pingDelay is half the mean round trip of wakePings UDP pings to addr,
// pingGap apart (both ends parked when each arrives); a lost ping is
// not a delay.
func pingDelay(addr string) (time.Duration, error) {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var sum time.Duration
	n := 0
	buf := make([]byte, 64)
	for range wakePings {
		time.Sleep(pingGap)
		t := time.Now()
		if _, err := c.Write(buf[:32]); err != nil {
			return 0, err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(buf); err != nil {
			continue
		}
		sum += time.Since(t)
		n++
	}
	if n < wakePings/2 {
		return 0, fmt.Errorf("ping %s: %d of %d answered", addr, n, wakePings)
	}
	return sum / time.Duration(2*n), nil
}

// wakeSweep is one sweep: the delay with no stand-ins, at each of
// wakeCounts, and with none again.
func wakeSweep(exe, echo string, period, spin time.Duration) (base0, base1 time.Duration, at []time.Duration, err error) {
	var s standIns
	defer func() { _ = s.stop() }()
	if base0, err = pingDelay(echo); err != nil {
		return
	}
	for _, n := range wakeCounts {
		if err = s.add(exe, n-len(s.cmds), period, spin); err != nil {
			return
		}
		time.Sleep(200 * time.Millisecond) // their start-up is not their timers
		var d time.Duration
		if d, err = pingDelay(echo); err != nil {
			return
		}
		if err = s.alive(); err != nil {
			return
		}
		at = append(at, d)
	}
	if err = s.stop(); err != nil {
		return
	}
	base1, err = pingDelay(echo)
	return
}

// measureWake measures c.WakeExcess over sweeps sweeps, stand-ins with
// c.ProcessIdle's share of each GossipInterval.
func measureWake(c *sim.Costs, sweeps int, gossip time.Duration, logf func(string, ...any)) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if c.ProcessIdle <= 0 {
		return fmt.Errorf("wake excess: ProcessIdle unset (the stand-ins' idle CPU); measure it first")
	}
	spin := time.Duration(float64(c.ProcessIdle) * gossip.Seconds())
	p, err := startSockPeer()
	if err != nil {
		return err
	}
	defer p.stop()
	cores := runtime.NumCPU()
	ex := make([][]time.Duration, len(wakeCounts))
	for k := range sweeps {
		b0, b1, at, err := wakeSweep(exe, p.udp, gossip, spin)
		if err != nil {
			return fmt.Errorf("wake sweep %d: %w", k+1, err)
		}
		base := (b0 + b1) / 2
		logf("  wake sweep %d: one-way delay with no stand-ins %v and %v; with %v stand-ins %v", k+1, b0, b1, wakeCounts, at)
		for i, d := range at {
			ex[i] = append(ex[i], d-base)
		}
	}
	c.WakeExcess = nil
	for i, n := range wakeCounts {
		slices.Sort(ex[i])
		e := max(0, ex[i][(len(ex[i])-1)/2])
		c.WakeExcess = append(c.WakeExcess, sim.WakePoint{PerCore: float64(n) / float64(cores), Excess: e})
		logf("  wake excess at %d stand-ins (%.1f per core): %v (median of %d sweeps: %v)", n, float64(n)/float64(cores), e, sweeps, ex[i])
	}
	c.Source["wake_excess"] = fmt.Sprintf("%d sweeps: half the mean round trip of %d UDP pings %v apart from this process to a parked echo process (Go netpoller both ends), "+
		"with N stand-in processes alive on the %d cores (each waking every %v and spinning %v of its own CPU, a rank's measured idle CPU), "+
		"less the same with none measured before and after in the same sweep; median over sweeps, negative taken as 0; N = %s",
		sweeps, wakePings, pingGap, cores, gossip, spin, strconv.Quote(fmt.Sprint(wakeCounts)))
	return nil
}
