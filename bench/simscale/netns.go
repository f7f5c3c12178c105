package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// The namespace calibration: real gorun jobs over namespace hosts
// (tests/testhosts: a network namespace per host with its own veth and
// sshd), one gorun, one agent per host started over ssh, real rank
// processes on real sockets, and every one of them on this machine's
// cores. Each job forms, loses a SIGKILLed rank, then a host cut off (its
// link down), as the model's runs do; the ranks report their own times
// (netnsrank.go).

// netnsRun is one real job's figures.
type netnsRun struct {
	// formation: the last rank's Join returning, after the last rank's
	// start (both from the ranks' clocks); cpu: the ranks' CPU between
	// their start and their formation, summed.
	formation, cpu time.Duration
	// rank, host: from the SIGKILL (the cut) until the last surviving
	// rank's MemberLost event for the victim (the cut host).
	rank, host time.Duration
	// launch: from gorun's exec until the last rank's start.
	launch time.Duration
	// starts are the ranks' start times after the first one's.
	starts []time.Duration
	// delay is messageDelay and share cpuShare, measured just before the
	// job.
	delay time.Duration
	share float64
	// exit is exitDelay, measured just before the job.
	exit time.Duration
	// death is what gorun's own processes spent on the SIGKILL.
	death deathCPU
	// rankMissed lists the ranks that never learned of the SIGKILLed
	// rank within 30 s (rank is then over those that did).
	rankMissed []int
}

// readNetns reads the KEY=VALUE file netns-up.sh writes (STATE/env) into a
// testhosts.Netns. The set is the caller's: it brought it up and takes it
// down (scripts/sim-scale.sh); nothing here closes it.
func readNetns(path string) (*testhosts.Netns, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-netns: %w", err)
	}
	kv := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			kv[k] = v
		}
	}
	h := &testhosts.Netns{Set: kv["SET"], Hosts: strings.Fields(kv["HOSTS"]), Addrs: strings.Fields(kv["ADDRS"]),
		Bridge: kv["BRIDGE"], BridgeAddr: kv["BRIDGE_ADDR"], Subnet: kv["SUBNET"], SSHConfig: kv["SSH_CONFIG"],
		Identity: kv["IDENTITY"], StateDir: kv["STATE"], Hostfile: kv["HOSTFILE"]}
	if h.Set == "" || len(h.Hosts) == 0 || len(h.Hosts) != len(h.Addrs) || h.SSHConfig == "" || h.BridgeAddr == "" {
		return nil, fmt.Errorf("-netns %s: not a netns-up.sh env file (SET, HOSTS, ADDRS, SSH_CONFIG, BRIDGE_ADDR)", path)
	}
	return h, nil
}

// vethLatency is the one-way latency to a namespace host: half the median
// time of a TCP connect to its sshd (SYN, SYN-ACK) over 21 tries. The
// path crosses the bridge and one veth, as host-to-host traffic crosses
// the bridge and two.
func vethLatency(addr string) (time.Duration, error) {
	var v []time.Duration
	for range 21 {
		t := time.Now()
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, "22"), 2*time.Second)
		if err != nil {
			return 0, fmt.Errorf("latency to %s: %w", addr, err)
		}
		v = append(v, time.Since(t))
		_ = c.Close()
	}
	slices.Sort(v)
	return v[len(v)/2] / 2, nil
}

// netnsJob is one gorun job on the first hosts of a set.
type netnsJob struct {
	h          *testhosts.Netns
	hosts, per int
	gorun, exe string
	dir        string
	verbose    bool
}

// rankLine is one parsed line of a rank's report.
type rankLine struct {
	kind             string // "formed" or "lost"
	rank, other, pid int
	start, t         int64 // ns
	cpu              time.Duration
}

func parseRankLine(s string) (rankLine, bool) {
	f := strings.Fields(s)
	n := make([]int64, len(f))
	for i := 1; i < len(f); i++ {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return rankLine{}, false
		}
		n[i] = v
	}
	switch {
	case len(f) == 6 && f[0] == "formed":
		return rankLine{kind: "formed", rank: int(n[1]), pid: int(n[2]), start: n[3], t: n[4], cpu: time.Duration(n[5])}, true
	case len(f) == 4 && f[0] == "lost":
		return rankLine{kind: "lost", rank: int(n[1]), other: int(n[2]), t: n[3]}, true
	case len(f) == 4 && f[0] == "idle":
		// t holds the wall time since formed, cpu the CPU over it.
		return rankLine{kind: "idle", rank: int(n[1]), cpu: time.Duration(n[2]), t: n[3]}, true
	}
	return rankLine{}, false
}

// jobRun is a started job: gorun's process, the ranks' parsed lines and
// what has been read of them.
type jobRun struct {
	j       *netnsJob
	cmd     *exec.Cmd
	stderr  bytes.Buffer
	lines   chan rankLine
	readers sync.WaitGroup
	got     []rankLine       // lines read since the last reset
	formed  map[int]rankLine // rank → its formed line
}

// start starts gorun on the first j.hosts hosts, j.per ranks each, the
// ranks told to leave when done appears.
func (j *netnsJob) start(ctx context.Context, done string) (*jobRun, error) {
	var hf strings.Builder
	for _, host := range j.h.Hosts[:j.hosts] {
		fmt.Fprintf(&hf, "%s slots=%d\n", host, j.per)
	}
	hostfile := filepath.Join(j.dir, fmt.Sprintf("hostfile.%d", j.hosts))
	if err := os.WriteFile(hostfile, []byte(hf.String()), 0o644); err != nil {
		return nil, err
	}
	if err := os.Remove(done); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	// --grace: the victim's death ends the job, and the ranks (which
	// ignore SIGTERM) must outlive that until the cut host is named.
	jr := &jobRun{j: j, lines: make(chan rankLine, 4*j.hosts*j.per), formed: map[int]rankLine{}}
	jr.cmd = exec.CommandContext(ctx, j.gorun, "--launch-agent", "ssh -F "+j.h.SSHConfig, "-hostfile", hostfile,
		"--bind-to", "none", "--grace", "60s", "--timeout", "150s",
		"-x", rankEnv+"=1", "-x", doneEnv+"="+done, "-x", holdEnv+"=120s", j.exe)
	jr.cmd.WaitDelay = 5 * time.Second
	jr.cmd.Stderr = &jr.stderr
	out, err := jr.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := jr.cmd.Start(); err != nil {
		return nil, err
	}
	jr.readers.Go(func() {
		defer close(jr.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l, ok := parseRankLine(sc.Text()); ok {
				jr.lines <- l
			} else if j.verbose {
				fmt.Println("  rank output:", sc.Text())
			}
		}
	})
	return jr, nil
}

// collect reads the ranks' lines until until() holds, for at most limit.
func (jr *jobRun) collect(until func() bool, limit time.Duration, what string) error {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for !until() {
		select {
		case l, ok := <-jr.lines:
			if !ok {
				return fmt.Errorf("%d×%d: gorun's output ended while waiting for %s; stderr:\n%s", jr.j.hosts, jr.j.per, what, lastLines(jr.stderr.String(), 20))
			}
			jr.got = append(jr.got, l)
			if l.kind == "formed" {
				jr.formed[l.rank] = l
			}
		case <-timer.C:
			return fmt.Errorf("%d×%d: %s not seen within %v; stderr:\n%s", jr.j.hosts, jr.j.per, what, limit, lastLines(jr.stderr.String(), 20))
		}
	}
	return nil
}

// seen returns a condition for collect: every rank not skipped has a
// MemberLost for a rank in [lo, hi]; lost gets each rank's first such
// time.
func (jr *jobRun) seen(lost map[int]int64, lo, hi int, skip func(int) bool) func() bool {
	n := jr.j.hosts * jr.j.per
	return func() bool {
		for _, l := range jr.got {
			if _, ok := lost[l.rank]; !ok && l.kind == "lost" && l.other >= lo && l.other <= hi {
				lost[l.rank] = l.t
			}
		}
		jr.got = jr.got[:0]
		for r := range n {
			if _, ok := lost[r]; !ok && !skip(r) {
				return false
			}
		}
		return true
	}
}

// stop tells the ranks to leave (done), runs restore, and reaps gorun:
// it exits with the victim's status once the ranks have left; one that
// does not within 90 s gets SIGTERM.
func (jr *jobRun) stop(done string, restore func()) {
	_ = os.WriteFile(done, nil, 0o644)
	restore()
	wait := make(chan error, 1)
	var waiter sync.WaitGroup
	waiter.Go(func() {
		for range jr.lines { //nolint:revive // drained so that the reader ends
		}
		jr.readers.Wait()
		wait <- jr.cmd.Wait()
	})
	select {
	case <-wait:
	case <-time.After(90 * time.Second):
		_ = jr.cmd.Process.Signal(syscall.SIGTERM)
	}
	waiter.Wait()
}

// run starts the job, waits for formation, SIGKILLs an attached rank of
// host 1, then cuts host hosts/2 off, as the model's runs do, and returns
// the figures. The link is restored and gorun reaped on every path.
func (j *netnsJob) run(ctx context.Context) (netnsRun, error) {
	var res netnsRun
	n := j.hosts * j.per
	victim, cutHost := j.per+1, j.hosts/2
	lo, hi := cutHost*j.per, cutHost*j.per+j.per-1
	done := filepath.Join(j.dir, "done")
	launched := time.Now()
	jr, err := j.start(ctx, done)
	if err != nil {
		return res, err
	}
	cut := false
	defer jr.stop(done, func() {
		if cut {
			_ = j.h.RestoreLink(j.h.Hosts[cutHost])
		}
	})
	if err := jr.collect(func() bool { return len(jr.formed) == n }, 120*time.Second, "every rank formed"); err != nil {
		return res, err
	}
	res.formationFrom(jr.formed, launched)
	// Settle 2 s, SIGKILL the victim; 1 s after every rank saw it, cut a
	// host off. gorun's own processes are read over the last second
	// before the kill and from it until the cut (death.go).
	procs, err := jr.procs()
	if err != nil {
		return res, err
	}
	time.Sleep(time.Second)
	s0 := procs.sample()
	time.Sleep(time.Second)
	s1 := procs.sample()
	lost := map[int]int64{}
	jr.got = jr.got[:0]
	tKill := time.Now()
	if err := syscall.Kill(jr.formed[victim].pid, syscall.SIGKILL); err != nil {
		return res, fmt.Errorf("SIGKILL rank %d (pid %d): %w", victim, jr.formed[victim].pid, err)
	}
	if err := jr.collect(jr.seen(lost, victim, victim, func(r int) bool { return r == victim }), 30*time.Second, "the SIGKILLed rank lost at every rank"); err != nil {
		// Ranks that never learn of it are a finding, not the end of
		// the job: counted, named, and the cut still measured.
		if len(lost) == 0 || !strings.Contains(err.Error(), "not seen within") {
			return res, fmt.Errorf("%w (seen by %d ranks: %v)", err, len(lost), keys(lost))
		}
		for r := range n {
			if _, ok := lost[r]; !ok && r != victim {
				res.rankMissed = append(res.rankMissed, r)
			}
		}
		fmt.Printf("  %d×%d: ranks %v never learned of the SIGKILLed rank %d within 30 s\n", j.hosts, j.per, res.rankMissed, victim)
	}
	res.rank = lastAfter(lost, tKill)
	time.Sleep(time.Second)
	res.death = deathExcess(victim/j.per, s0, s1, procs.sample())
	clear(lost)
	jr.got = jr.got[:0]
	tCut := time.Now()
	if err := j.h.CutLink(j.h.Hosts[cutHost]); err != nil {
		return res, err
	}
	cut = true
	skip := func(r int) bool { return r == victim || (r >= lo && r <= hi) }
	if err := jr.collect(jr.seen(lost, lo, hi, skip), 30*time.Second, "the cut host lost at every rank"); err != nil {
		return res, fmt.Errorf("%w (seen by %d ranks: %v)", err, len(lost), keys(lost))
	}
	res.host = lastAfter(lost, tCut)
	return res, nil
}

// formationFrom sets formation, cpu, launch and starts from the ranks'
// formed lines.
func (res *netnsRun) formationFrom(formed map[int]rankLine, launched time.Time) {
	var first, lastStart, lastFormed int64 = 1 << 62, 0, 0
	for _, l := range formed {
		first, lastStart, lastFormed = min(first, l.start), max(lastStart, l.start), max(lastFormed, l.t)
		res.cpu += l.cpu
	}
	res.formation = time.Duration(lastFormed - lastStart)
	res.launch = time.Duration(lastStart - launched.UnixNano())
	res.starts = make([]time.Duration, len(formed))
	for r, l := range formed {
		res.starts[r] = time.Duration(l.start - first)
	}
}

// lastAfter is the latest of the times in at, after t.
func lastAfter(at map[int]int64, t time.Time) time.Duration {
	var last int64
	for _, v := range at {
		last = max(last, v)
	}
	return time.Duration(last - t.UnixNano())
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// strays lists what is left running on the first hosts of the set (sshd
// aside) once a job has ended: none may be, or the next job would share
// the cores with it.
func strays(h *testhosts.Netns, hosts int) ([]string, error) {
	var left []string
	for _, host := range h.Hosts[:hosts] {
		pids, err := h.StrayPids(host)
		if err != nil {
			return nil, err
		}
		for _, p := range pids {
			left = append(left, fmt.Sprintf("%s:%d", host, p))
		}
	}
	return left, nil
}

// echoEnv makes the binary a UDP echo server (messageDelay's far end): it
// prints its port, echoes every packet, and leaves when stdin closes.
const echoEnv = "GORUN_SIMSCALE_ECHO"

func echoMain() int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "simscale echo:", err)
		return 1
	}
	fmt.Println(c.LocalAddr().(*net.UDPAddr).Port)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = c.Close()
	})
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			return 0
		}
		_, _ = c.WriteToUDP(buf[:n], from)
	}
}

// messageDelay is the one-way delay of a message from one idle process
// to another on a namespace host: half the median round trip of 101 UDP
// pings, 10 ms apart so that both ends are asleep when each arrives, to
// an echo process in host's namespace. Unlike vethLatency it includes
// waking each process (the scheduler, on cores shared with every other
// process of the machine), which every hop between ranks pays.
func messageDelay(ctx context.Context, h *testhosts.Netns, host string) (time.Duration, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", host, exe)
	cmd.Env = append(os.Environ(), echoEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	var port int
	if _, err := fmt.Fscan(out, &port); err != nil {
		return 0, fmt.Errorf("echo on %s: no port: %w", host, err)
	}
	c, err := net.Dial("udp4", net.JoinHostPort(h.Addr(host), strconv.Itoa(port)))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var rtt []time.Duration
	buf := make([]byte, 64)
	for range 101 {
		time.Sleep(10 * time.Millisecond)
		t := time.Now()
		if _, err := c.Write(buf[:32]); err != nil {
			return 0, err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(buf); err != nil {
			continue // a lost ping is not a delay
		}
		rtt = append(rtt, time.Since(t))
	}
	if len(rtt) < 51 {
		return 0, fmt.Errorf("echo on %s: %d of 101 pings answered", host, len(rtt))
	}
	slices.Sort(rtt)
	return rtt[len(rtt)/2] / 2, nil
}

// cpuShare is the share of a core a newcomer got just before a job: two
// threads spinning for 300 ms, their CPU ÷ (2 × wall). On cores loaded by
// other work, every handler of a job runs about this much slower than
// its measured CPU cost (the scheduler shares each core among the
// runnable threads); 1 on idle cores.
func cpuShare() float64 {
	const spin = 300 * time.Millisecond
	c0, t0 := cpuTime(), time.Now()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			x := 0
			for time.Since(t0) < spin {
				for i := range 1000 {
					x += i
				}
			}
			_ = x
		})
	}
	wg.Wait()
	return min(1, float64(cpuTime()-c0)/(2*float64(time.Since(t0))))
}

// keys lists m's keys in order.
func keys(m map[int]int64) []int {
	k := make([]int, 0, len(m))
	for r := range m {
		k = append(k, r)
	}
	slices.Sort(k)
	return k
}

// victimEnv makes the binary exitDelay's victim: it touches 16 MiB (a
// rank's resident size, about), dials the address in the variable and
// waits to be killed.
const victimEnv = "GORUN_SIMSCALE_VICTIM"

func victimMain() int {
	mem := make([]byte, 16<<20)
	for i := range mem {
		mem[i] = byte(i)
	}
	c, err := net.Dial("tcp", os.Getenv(victimEnv))
	if err != nil {
		return 1
	}
	_, _ = io.Copy(io.Discard, c) // blocks until killed
	return int(mem[len(mem)-1]) & 0
}

// exitDelay is how long a SIGKILLed process of a rank's size takes to
// close its sockets on this machine now: from the signal until its peer
// reads the end of a TCP stream it held, median of 11. The kernel frees
// the process's memory before it closes its files, so on shared cores
// this is milliseconds; a killed rank's leader learns of it no sooner.
func exitDelay(ctx context.Context) (time.Duration, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	var v []time.Duration
	for range 11 {
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), victimEnv+"="+ln.Addr().String())
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		c, err := ln.Accept()
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return 0, err
		}
		time.Sleep(20 * time.Millisecond) // asleep, as an idle rank
		t := time.Now()
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_, _ = io.Copy(io.Discard, c)
		v = append(v, time.Since(t))
		_ = c.Close()
		_ = cmd.Wait()
	}
	slices.Sort(v)
	return v[len(v)/2], nil
}
