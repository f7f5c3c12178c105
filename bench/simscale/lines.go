package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/sim"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// The CPU gorun's processes spend relaying one line a rank prints
// (Costs.LineHost, LineLauncher): the calibration's ranks each print a
// line when they form, and those lines cross the agent and reach gorun's
// output while other ranks are still forming, on the same cores. A job of
// one rank on one namespace host (over ssh, as the calibration's) prints
// chatterLines lines chatterGap apart, after a quiet second; gorun's side
// (gorun and its descendants) and the host's (its sshd sessions and
// agent, not the rank) are read from /proc before the quiet second,
// after it and after the last line; what they spent over the lines
// beyond their quiet rate, per line.

// chatterEnv makes the binary the chatty rank: "N GAP".
const chatterEnv = "GORUN_SIMSCALE_CHATTER"

const (
	chatterLines = 500
	chatterGap   = 2 * time.Millisecond
)

// chatterMain prints "start PID", sleeps 1.5 s, prints n lines gap apart
// (each the length of a formed line), prints "end", and leaves 1 s later.
func chatterMain() int {
	f := append(strings.Fields(os.Getenv(chatterEnv)), "", "")
	n, err1 := strconv.Atoi(f[0])
	gap, err2 := time.ParseDuration(f[1])
	if f[2] != "" || err1 != nil || err2 != nil || n < 1 || gap < 0 {
		fmt.Fprintf(os.Stderr, "simscale chatter: %s=%q is not \"N GAP\"\n", chatterEnv, os.Getenv(chatterEnv))
		return 2
	}
	fmt.Printf("start %d\n", os.Getpid())
	time.Sleep(1500 * time.Millisecond)
	for k := range n {
		fmt.Printf("formed %d %d %d %d %d\n", k, os.Getpid(), time.Now().UnixNano(), time.Now().UnixNano(), k)
		time.Sleep(gap)
	}
	fmt.Println("end")
	time.Sleep(time.Second)
	return 0
}

// lineJob runs one chatty job on host and returns what gorun's side and
// the host's side spent per line beyond their quiet rate.
func lineJob(o options, h *testhosts.Netns, host, exe, dir string) (launcher, hostSide time.Duration, err error) {
	hostfile := filepath.Join(dir, "hostfile.lines")
	if err := os.WriteFile(hostfile, []byte(host+" slots=1\n"), 0o644); err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, o.gorunBin, "--launch-agent", "ssh -F "+h.SSHConfig, "-hostfile", hostfile, "-np", "1",
		"--bind-to", "none", "-x", fmt.Sprintf("%s=%d %v", chatterEnv, chatterLines, chatterGap), exe)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	defer func() {
		for sc.Scan() { //nolint:revive // drained so that gorun can exit
		}
	}()
	var s [3]cpuSample
	var procs jobProcs
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "start":
			pid, _ := strconv.Atoi(f[1])
			if procs, err = hostProcs(h, host, cmd.Process.Pid, pid); err != nil {
				return 0, 0, err
			}
			s[0] = procs.sample()
			time.Sleep(time.Second)
			s[1] = procs.sample()
		case len(f) == 1 && f[0] == "end":
			if s[1].at.IsZero() {
				return 0, 0, fmt.Errorf("chatty rank ended before it started")
			}
			s[2] = procs.sample()
			d := deathExcess(0, s[0], s[1], s[2])
			return d.launcher / chatterLines, d.victimHost / chatterLines, nil
		}
	}
	return 0, 0, fmt.Errorf("chatty job's output ended before its last line (%v)", sc.Err())
}

// hostProcs is jobProcs for a job of one rank (pid rank) on host, gorun
// being pid gorun.
func hostProcs(h *testhosts.Netns, host string, gorun, rank int) (jobProcs, error) {
	p := jobProcs{launcher: append([]int{gorun}, descendants(gorun)...)}
	pids, err := h.Pids(host)
	if err != nil {
		return p, err
	}
	daemon := h.SSHDPid(host)
	var mine []int
	for _, pid := range pids {
		if pid != daemon && pid != rank {
			mine = append(mine, pid)
		}
	}
	p.hosts = [][]int{mine}
	return p, nil
}

// measureLines sets c's LineHost and LineLauncher from jobs chatty jobs on
// the first host of -netns.
func measureLines(c *sim.Costs, o options, jobs int, logf func(string, ...any)) error {
	h, exe, dir, err := netnsWorkspace(o, "simscale-lines-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var ls, hs []time.Duration
	for k := range jobs {
		l, hh, err := lineJob(o, h, h.Hosts[0], exe, dir)
		if err != nil {
			return fmt.Errorf("line job %d: %w", k+1, err)
		}
		if left, err := strays(h, 1); err != nil || len(left) > 0 {
			return fmt.Errorf("line job %d: left running after the job: %v %v", k+1, left, err)
		}
		logf("  line job %d: per line a rank prints, gorun's side %v, the host's (agent, sshd) %v", k+1, l, hh)
		ls, hs = append(ls, l), append(hs, hh)
	}
	slices.Sort(ls)
	slices.Sort(hs)
	c.LineLauncher, c.LineHost = positive(float64(ls[(jobs-1)/2])), positive(float64(hs[(jobs-1)/2]))
	c.Source["line_launcher_ns,line_host_ns"] = fmt.Sprintf("%d real jobs of one rank on a namespace host (gorun over ssh) printing %d lines %v apart after a quiet second: "+
		"the CPU (each thread's schedstat) of gorun and its descendants, and of the host's agent and sshd sessions, over the lines beyond their quiet rate, per line; median of the jobs",
		jobs, chatterLines, chatterGap)
	logf("  line relay: gorun's side %v, the host's %v per line (medians)", c.LineLauncher, c.LineHost)
	return nil
}
