package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/sim"
)

// The rank program of the namespace calibration: the same binary, started
// by gorun on the namespace hosts with rankEnv set. It forms its world from
// gorun's environment as any rank does (rendezvous.ConfigFromEnv, Join),
// and reports on stdout, with its own clock (every host is this machine,
// so the clocks agree):
//
//	formed RANK PID START_NS FORMED_NS CPU_NS   once Join returns
//	lost RANK LOST_RANK NS                      per MemberLost event
//	idle RANK CPU_NS WALL_NS                    when told to leave: CPU and
//	                                            wall time since formed
//
// START_NS is taken first thing in main, FORMED_NS when Join returns, and
// CPU_NS is the process's CPU time between the two (the Go runtime's own
// start-up before main is left out, as the model's costs leave it out).
// NS is the event's own time (when the World published it).
const (
	rankEnv = "GORUN_SIMSCALE_RANK"
	// doneEnv names a file the harness creates once it has what it
	// measures (every host shares this machine's file system); the rank
	// leaves when it appears, or after holdEnv.
	doneEnv = "GORUN_SIMSCALE_DONE"
	holdEnv = "GORUN_SIMSCALE_HOLD"
)

// rankMain is the rank program. It ignores SIGTERM: when the harness
// SIGKILLs a rank, gorun ends the job (its first failure), and the ranks
// must keep reporting until the harness has cut a host off and seen it
// named; gorun's --grace (set long by the harness) bounds them. A rank
// leaves only when told (the done file), so that no rank's leaving is
// mistaken for a failure by the others.
func rankMain(start time.Time, cpu0 time.Duration) int {
	signal.Ignore(syscall.SIGTERM)
	done := os.Getenv(doneEnv)
	hold, err := time.ParseDuration(os.Getenv(holdEnv))
	if done == "" || err != nil {
		fmt.Fprintf(os.Stderr, "simscale rank: %s and %s must be set (%q, %v)\n", doneEnv, holdEnv, done, err)
		return 2
	}
	cfg, err := rendezvous.ConfigFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "simscale rank:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), hold)
	defer cancel()
	w, err := rendezvous.Join(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "simscale rank %d: join: %v\n", cfg.Rank, err)
		return 3
	}
	formed := time.Now()
	cpu := cpuTime() - cpu0
	defer w.Close()
	me := w.Rank()
	fmt.Printf("formed %d %d %d %d %d\n", me, os.Getpid(), start.UnixNano(), formed.UnixNano(), int64(cpu))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case ev := <-w.Events():
			if ev.Kind == rendezvous.MemberLost {
				fmt.Printf("lost %d %d %d\n", me, ev.Rank, ev.Time.UnixNano())
			}
		case <-tick.C:
			if _, err := os.Stat(done); err == nil {
				fmt.Printf("idle %d %d %d\n", me, int64(cpuTime()-cpu0-cpu), int64(time.Since(formed)))
				return 0
			}
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "simscale rank %d: not told to leave within %v\n", me, hold)
			return 4
		}
	}
}

// measureProcess measures Costs.ProcessStart and Costs.ProcessIdle with
// real 1×2 jobs of the rank program on this machine (gorun -np 2, no
// ssh): each rank's CPU from main to formed, median over jobs of the mean
// per rank, less what the model charges per rank for the same job without
// it (c's other costs, ranks in one process); then, left formed for idle,
// each rank's CPU over that time, per second, median over jobs of the
// mean per rank. c must hold every other cost.
func measureProcess(c sim.Costs, gorunBin string, jobs int, idle time.Duration, logf func(string, ...any)) (start, perSec time.Duration, err error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, 0, err
	}
	dir, err := os.MkdirTemp("", "simscale-proc-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	var starts, idles []time.Duration
	for k := range jobs {
		s, i, err := processJob(gorunBin, exe, filepath.Join(dir, fmt.Sprintf("done.%d", k)), idle)
		if err != nil {
			return 0, 0, fmt.Errorf("1×2 job %d: %w", k+1, err)
		}
		starts, idles = append(starts, s), append(idles, i)
	}
	slices.Sort(starts)
	slices.Sort(idles)
	med, medIdle := starts[(len(starts)-1)/2], idles[(len(idles)-1)/2]
	// What the model charges the job otherwise: everything but the two
	// process costs themselves, the sockets between the processes
	// included (each rank its own process).
	c.ProcessStart, c.ProcessIdle = time.Nanosecond, time.Nanosecond
	m, err := runModel(sim.WorldConfig{Hosts: 1, PerHost: 2, SharedCores: 2, Latency: 20 * time.Microsecond,
		Rdzv: rendezvous.DefaultConfig(), Costs: c, Seed: 1}, false)
	if err != nil {
		return 0, 0, err
	}
	logf("  process start: a rank's CPU from main to formed in 1×2 jobs %v (median of %d, each the mean of 2 ranks; all: %v); the model charges %v of it otherwise",
		med, jobs, starts, m.cpu/2)
	logf("  process idle: a formed rank's CPU per second over %v idle %v (median; all: %v)", idle, medIdle, idles)
	return max(time.Microsecond, med-m.cpu/2), max(time.Microsecond, medIdle), nil
}

// processJob runs one 1×2 job and returns the mean rank's CPU from main
// to formed, and its CPU per second over idle once formed.
func processJob(gorunBin, exe, done string, idle time.Duration) (start, perSec time.Duration, err error) {
	cmd := exec.Command(gorunBin, "-np", "2", "--bind-to", "none", "--timeout", "60s",
		"-x", rankEnv+"=1", "-x", doneEnv+"="+done, "-x", holdEnv+"=50s", exe)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	var cpu, idleCPU, idleWall time.Duration
	formed, left := 0, 0
	sc := bufio.NewScanner(out)
	for left < 2 && sc.Scan() {
		l, ok := parseRankLine(sc.Text())
		switch {
		case !ok:
		case l.kind == "formed":
			cpu += l.cpu
			if formed++; formed == 2 {
				time.Sleep(idle)
				_ = os.WriteFile(done, nil, 0o644)
			}
		case l.kind == "idle":
			idleCPU, idleWall = idleCPU+l.cpu, idleWall+time.Duration(l.t)
			left++
		}
	}
	_ = os.WriteFile(done, nil, 0o644) // whatever happened, let the ranks go
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil || left < 2 {
		return 0, 0, fmt.Errorf("%d of 2 ranks formed, %d left, %v; stderr:\n%s", formed, left, err, lastLines(stderr.String(), 10))
	}
	return cpu / 2, time.Duration(float64(idleCPU) / idleWall.Seconds()), nil
}
