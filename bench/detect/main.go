// Command detect measures the fault-detection promises: how long after a
// rank dies (SIGKILL) or freezes (SIGSTOP) in the middle of all-reduces
// every other rank has an error naming it, under gorun and without it.
//
//	detect [-runs 5] [-np 4] [-signal KILL|STOP] [-modes gorun,flat,direct,hosts]
//	       [-gorun PATH] [-hostfile F -launch-agent CMD] [-v]
//
// Modes:
//
//	gorun   gorun -np N on this host (host leaders: the default)
//	flat    the same with GORUN_RDZV_FLAT=1 (one gossip member per rank)
//	direct  N processes started here with RANK, WORLD_SIZE, MASTER_ADDR,
//	        MASTER_PORT, LOCAL_RANK and LOCAL_WORLD_SIZE, as torchrun or a
//	        direct srun would: no gorun watches them
//	hosts   gorun -hostfile F --launch-agent CMD (namespace hosts, one
//	        rank per host: every rank is a gossip member on its own host)
//
// Each run waits until every rank finished its first all-reduce, signals
// rank N/2 by its pid, and reads the survivors' "error RANK UNIXNS MSG"
// lines. It prints, per run, the slowest survivor's error after the signal
// (and how many survivors printed one: under gorun, gorun may stop a
// survivor first) and, under gorun, gorun's exit; then medians.
//
// The same binary is the rank program when GORUN_DETECT_RANK=1.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rank"
)

const rankEnv = "GORUN_DETECT_RANK"

func main() {
	if os.Getenv(rankEnv) == "1" {
		os.Exit(rankMain())
	}
	os.Exit(benchMain(os.Args[1:], os.Stdout, os.Stderr))
}

// rankMain all-reduces until an error, which it prints with its time.
func rankMain() int {
	ctx := context.Background()
	r, err := rank.Init(ctx, rank.DefaultOptions())
	if err != nil {
		fmt.Printf("error %s %d init: %v\n", os.Getenv("RANK"), time.Now().UnixNano(), err)
		return 3
	}
	defer r.Close()
	buf := make([]float32, 4096)
	for i := 0; ; i++ {
		if err := r.Comm().AllReduce(ctx, comm.Float32s(buf), comm.Float32s(buf), comm.Sum).Wait(ctx); err != nil {
			fmt.Printf("error %d %d %v\n", r.Rank(), time.Now().UnixNano(), strings.ReplaceAll(err.Error(), "\n", " "))
			return 3
		}
		if i == 0 {
			fmt.Printf("ready %d %d\n", r.Rank(), os.Getpid())
		}
	}
}

type options struct {
	runs     int
	np       int
	sig      syscall.Signal
	modes    []string
	gorun    string
	hostfile string
	agent    string
	verbose  bool
}

func benchMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("detect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var sig, modes string
	fs.IntVar(&o.runs, "runs", 5, "runs per mode")
	fs.IntVar(&o.np, "np", 4, "ranks (hosts mode: one per host of the hostfile)")
	fs.StringVar(&sig, "signal", "KILL", "KILL (a death) or STOP (a freeze)")
	fs.StringVar(&modes, "modes", "gorun,flat,direct", "comma-separated: gorun, flat, direct, hosts")
	fs.StringVar(&o.gorun, "gorun", "bin/gorun", "the gorun binary")
	fs.StringVar(&o.hostfile, "hostfile", "", "the hosts mode's hostfile (one slot per host)")
	fs.StringVar(&o.agent, "launch-agent", "ssh", "the hosts mode's --launch-agent")
	fs.BoolVar(&o.verbose, "v", false, "pass on the ranks' and gorun's standard error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch sig {
	case "KILL":
		o.sig = syscall.SIGKILL
	case "STOP":
		o.sig = syscall.SIGSTOP
	default:
		fmt.Fprintf(stderr, "detect: -signal %q: want KILL or STOP\n", sig)
		return 2
	}
	o.modes = strings.Split(modes, ",")
	for _, m := range o.modes {
		if !slices.Contains([]string{"gorun", "flat", "direct", "hosts"}, m) {
			fmt.Fprintf(stderr, "detect: -modes: unknown mode %q\n", m)
			return 2
		}
		if m == "hosts" && o.hostfile == "" {
			fmt.Fprintln(stderr, "detect: the hosts mode needs -hostfile")
			return 2
		}
	}
	if o.runs < 1 || o.np < 2 {
		fmt.Fprintln(stderr, "detect: -runs ≥ 1 and -np ≥ 2")
		return 2
	}
	fmt.Fprintf(stdout, "SIG%s of rank %d of %d mid all-reduce: slowest survivor's error after the signal (survivors that printed one) and gorun's exit\n",
		sig, o.np/2, o.np)
	fmt.Fprintf(stdout, "%-7s %-s\n", "mode", "runs")
	failed := false
	for _, m := range o.modes {
		var worst, exits []float64
		var cells []string
		for range o.runs {
			res, err := runOnce(o, m)
			if err != nil {
				cells = append(cells, "ERR("+err.Error()+")")
				failed = true
				continue
			}
			worst = append(worst, res.worst.Seconds())
			c := fmt.Sprintf("%.3f(%d/%d)", res.worst.Seconds(), res.printed, o.np-1)
			if res.exit > 0 {
				exits = append(exits, res.exit.Seconds())
				c += fmt.Sprintf("/exit %.3f", res.exit.Seconds())
			}
			cells = append(cells, c)
		}
		fmt.Fprintf(stdout, "%-7s %s\n", m, strings.Join(cells, " "))
		line := fmt.Sprintf("%-7s median slowest survivor's error %.3f s", "", median(worst))
		if len(exits) > 0 {
			line += fmt.Sprintf(", gorun's exit %.3f s", median(exits))
		}
		fmt.Fprintln(stdout, line)
	}
	if failed {
		return 1
	}
	return 0
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// result is one run: the slowest survivor's error after the signal, how
// many survivors printed one, and gorun's exit after the signal (0 for
// direct).
type result struct {
	worst   time.Duration
	printed int
	exit    time.Duration
}

// job is one launch: its processes and their merged output lines.
type job struct {
	cmds  []*exec.Cmd
	lines chan string
	// exited is closed when the first process (gorun, in the gorun
	// modes) has been waited for; exitAt is when.
	exited chan struct{}
	exitAt time.Time
	wg     sync.WaitGroup // the output readers and the waiter
}

// read passes r's lines on until EOF, then closes r.
func (j *job) read(r *os.File) {
	j.wg.Go(func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			j.lines <- sc.Text()
		}
	})
}

// start launches the mode's processes with their output read into lines.
func start(o options, mode string) (*job, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	j := &job{lines: make(chan string, 1024), exited: make(chan struct{})}
	env := append(os.Environ(), rankEnv+"=1")
	launch := func(c *exec.Cmd) error {
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		// Our own pipe: Wait does not close its read end, so the
		// reader sees every line, whenever the process is waited for.
		pr, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		c.Stdout, c.Stderr = pw, nil // nil: /dev/null
		if o.verbose {
			c.Stderr = os.Stderr
		}
		err = c.Start()
		pw.Close()
		if err != nil {
			pr.Close()
			return err
		}
		j.cmds = append(j.cmds, c)
		j.read(pr)
		if len(j.cmds) == 1 {
			j.wg.Go(func() {
				_ = c.Wait()
				j.exitAt = time.Now()
				close(j.exited)
			})
		}
		return nil
	}
	switch mode {
	case "direct":
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		for r := range o.np {
			c := exec.Command(self)
			c.Env = append(slices.Clone(env), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(o.np),
				"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(o.np),
				"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
			if err := launch(c); err != nil {
				j.stop()
				return nil, err
			}
		}
	default:
		args := []string{"-np", strconv.Itoa(o.np)}
		if mode == "hosts" {
			args = []string{"-hostfile", o.hostfile, "--launch-agent", o.agent, "-x", rankEnv + "=1", "-np", strconv.Itoa(o.np)}
		}
		c := exec.Command(o.gorun, append(args, self)...)
		c.Env = env
		if mode == "flat" {
			c.Env = append(c.Env, "GORUN_RDZV_FLAT=1")
		}
		if err := launch(c); err != nil {
			return nil, err
		}
	}
	return j, nil
}

// stop kills whatever is left (process groups) and waits for everything;
// lines nobody read are dropped.
func (j *job) stop() {
	for _, c := range j.cmds {
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
	for _, c := range j.cmds[1:] {
		_ = c.Wait()
	}
	done := make(chan struct{})
	go func() { // drains lines until the readers are done
		for {
			select {
			case <-j.lines:
			case <-done:
				return
			}
		}
	}()
	j.wg.Wait()
	close(done)
}

// runOnce is one run of one mode.
func runOnce(o options, mode string) (result, error) {
	var res result
	j, err := start(o, mode)
	if err != nil {
		return res, err
	}
	defer j.stop()
	victim := o.np / 2
	pids := map[int]int{}
	deadline := time.After(60 * time.Second)
	for len(pids) < o.np {
		select {
		case l := <-j.lines:
			f := strings.Fields(l)
			if len(f) == 3 && f[0] == "ready" {
				r, _ := strconv.Atoi(f[1])
				pids[r], _ = strconv.Atoi(f[2])
			} else if len(f) > 0 && f[0] == "error" {
				return res, fmt.Errorf("a rank failed before the fault: %s", l)
			}
		case <-deadline:
			return res, fmt.Errorf("only %d of %d ranks ready after 60 s", len(pids), o.np)
		}
	}
	t0 := time.Now()
	if err := syscall.Kill(pids[victim], o.sig); err != nil {
		return res, err
	}
	if o.sig == syscall.SIGSTOP {
		defer func() { _ = syscall.Kill(pids[victim], syscall.SIGKILL) }()
	}
	// gorun's exit, or every direct rank's error.
	var exited <-chan struct{}
	if mode != "direct" {
		exited = j.exited
	}
	errs := map[int]time.Duration{}
	limit := time.After(30 * time.Second)
	for len(errs) < o.np-1 {
		select {
		case l := <-j.lines:
			f := strings.Fields(l)
			if len(f) >= 3 && f[0] == "error" {
				r, _ := strconv.Atoi(f[1])
				ns, _ := strconv.ParseInt(f[2], 10, 64)
				if r != victim {
					errs[r] = time.Unix(0, ns).Sub(t0)
				}
			}
			continue
		case <-exited:
			res.exit = j.exitAt.Sub(t0)
		case <-limit:
			return res, fmt.Errorf("%d of %d survivors reported an error within 30 s", len(errs), o.np-1)
		}
		break
	}
	if exited != nil && res.exit == 0 {
		select {
		case <-exited:
			res.exit = j.exitAt.Sub(t0)
		case <-time.After(30 * time.Second):
			return res, fmt.Errorf("gorun still runs 30 s after the fault")
		}
	}
	if res.exit > 0 {
		// Lines gorun passed on before it exited.
		for drained := false; !drained; {
			select {
			case l := <-j.lines:
				if f := strings.Fields(l); len(f) >= 3 && f[0] == "error" {
					r, _ := strconv.Atoi(f[1])
					ns, _ := strconv.ParseInt(f[2], 10, 64)
					if r != victim {
						errs[r] = time.Unix(0, ns).Sub(t0)
					}
				}
			case <-time.After(100 * time.Millisecond):
				drained = true
			}
		}
	}
	res.printed = len(errs)
	for _, d := range errs {
		res.worst = max(res.worst, d)
	}
	if mode == "direct" && res.printed < o.np-1 {
		return res, fmt.Errorf("%d of %d survivors reported an error", res.printed, o.np-1)
	}
	return res, nil
}

// freePort returns a TCP port that was free on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
