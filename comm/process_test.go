//go:build linux

package comm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
)

// Multi-process tests re-execute the test binary as ranks. Peers find each
// other through a directory: each rank listens, writes its address to
// addr.<rank>, and waits for the others' files (a tiny static address list,
// standing in for the rendezvous).
const (
	childEnv = "GORUN_COMM_CHILD" // the mode: allreduce, crash, desync, home, bench
	exitLost = 3                  // crash mode: error named the victim
	exitBad  = 4
)

func childMain() int {
	rank, _ := strconv.Atoi(os.Getenv("GORUN_COMM_RANK"))
	size, _ := strconv.Atoi(os.Getenv("GORUN_COMM_SIZE"))
	dir := os.Getenv("GORUN_COMM_DIR")
	mode := os.Getenv(childEnv)
	ecfg := comm.DefaultEndpointConfig()
	ecfg.Addr = "127.0.0.1:0"
	ecfg.Secret = []byte(os.Getenv("GORUN_COMM_SECRET"))
	ecfg.ForceTCP = os.Getenv("GORUN_COMM_TRANSPORT") == "tcp"
	ecfg.ShmDir = os.Getenv("GORUN_COMM_SHMDIR")
	if v, err := strconv.Atoi(os.Getenv("GORUN_COMM_RING")); err == nil {
		ecfg.ShmRingBytes = v // tuning experiments
	}
	if tune := os.Getenv("GORUN_COMM_TUNE"); tune != "" {
		// One tuning for the whole run: "spin,yield,inline,slowWait,cpuCheck".
		f := strings.Split(tune+",,,,", ",")
		d := func(i int) time.Duration { v, _ := time.ParseDuration(f[i]); return v }
		comm.SetTuning(d(0), d(1), f[2] == "1", d(3), f[4] != "0")
	}
	comm.SetYieldIdle(os.Getenv("GORUN_COMM_YIELDIDLE") == "1")
	if v, err := strconv.Atoi(os.Getenv("GORUN_COMM_FASTLIMIT")); err == nil {
		comm.SetFastLimit(v) // tuning experiments
	}
	ep, err := comm.Listen(ecfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitBad
	}
	defer ep.Close()
	addrs, err := exchangeAddrs(dir, rank, size, ep.Addr())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitBad
	}
	hosts := make([]string, size)
	for r := range hosts {
		hosts[r] = "localhost" // one host: shared memory unless forced off
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := comm.DefaultConfig()
	cfg.Deterministic = os.Getenv("GORUN_COMM_DET") == "1"
	if v, err := strconv.Atoi(os.Getenv("GORUN_COMM_SEG")); err == nil {
		cfg.SegmentBytes = v // tuning experiments
		cfg.TCPSegmentBytes = v
	}
	c, err := comm.New(ctx, commtest.NewStaticGroup(rank, addrs, hosts), ep, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitBad
	}
	defer c.Close()
	switch mode {
	case "allreduce":
		for _, n := range []int{1, 1000, 1 << 20} {
			buf := make([]float32, n)
			for i := range buf {
				buf[i] = float32(rank + i%7)
			}
			if err := c.AllReduce(ctx, comm.Float32s(buf), comm.Float32s(buf), comm.Sum).Wait(ctx); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return exitBad
			}
			for i, v := range buf {
				if want := float32(size*(size-1)/2 + size*(i%7)); v != want {
					fmt.Fprintf(os.Stderr, "rank %d: element %d = %v, want %v\n", rank, i, v, want)
					return exitBad
				}
			}
		}
		fmt.Println("ok", strings.Join(c.LinkKinds(), ","))
		return 0
	case "crash":
		victim := size - 1
		buf := comm.Float32s(make([]float32, 1<<18))
		for i := 0; ; i++ {
			if rank == victim && i == 5 {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
			err := c.AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx)
			if err != nil {
				fmt.Fprintln(os.Stderr, "rank", rank, "error:", err)
				if strings.Contains(err.Error(), fmt.Sprintf("rank %d", victim)) {
					return exitLost
				}
				return exitBad
			}
		}
	case "desync":
		buf := make([]float32, 10)
		var err error
		if rank == 0 {
			out := make([]float32, 10*size)
			err = c.AllGather(ctx, comm.Float32s(buf), comm.Float32s(out)).Wait(ctx)
		} else {
			err = c.AllReduce(ctx, comm.Float32s(buf), comm.Float32s(buf), comm.Sum).Wait(ctx)
		}
		if err == nil {
			err = c.Barrier(ctx).Wait(ctx)
		}
		fmt.Fprintln(os.Stderr, "rank", rank, "error:", err)
		if err != nil && strings.Contains(err.Error(), "AllGather(") && strings.Contains(err.Error(), "AllReduce(") {
			return exitLost
		}
		return exitBad
	case "home":
		fmt.Println("home", comm.HomeCPU())
		return 0
	case "bench":
		if p := os.Getenv("GORUN_COMM_CPUPROFILE"); p != "" && rank == 0 {
			f, err := os.Create(p)
			if err == nil {
				_ = pprof.StartCPUProfile(f)
				defer pprof.StopCPUProfile()
			}
		}
		return childBench(ctx, c)
	}
	return exitBad
}

func childBench(ctx context.Context, c *comm.Comm) int {
	if ab := os.Getenv("GORUN_COMM_AB"); ab != "" {
		return childBenchAB(ctx, c, strings.Split(ab, " "))
	}
	n := c.Size()
	for _, size := range benchSizes() {
		buf := comm.Float32s(make([]float32, max(size/4, 1)))
		iters := max(5, min(2000, (128<<20)/max(size, 1)))
		for range 3 {
			_ = c.AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx)
		}
		if err := c.Barrier(ctx).Wait(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return exitBad
		}
		// Per-iteration times: on a shared host the median resists the
		// noise that other processes add to the mean.
		times := make([]time.Duration, iters)
		cpu0 := cpuTime()
		start := time.Now()
		for i := range iters {
			t0 := time.Now()
			if err := c.AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return exitBad
			}
			times[i] = time.Since(t0)
		}
		sec := time.Since(start).Seconds() / float64(iters)
		cpu := (cpuTime() - cpu0).Seconds() / float64(iters)
		slices.Sort(times)
		med := times[iters/2].Seconds()
		bw := func(s float64) float64 { return float64(size) / s / 1e9 * 2 * float64(n-1) / float64(n) }
		if c.Rank() == 0 {
			fmt.Printf("%10d %12.2f us %8.3f GB/s busbw  median %10.2f us %8.3f GB/s  cpu %10.2f us\n", size, sec*1e6, bw(sec), med*1e6, bw(med), cpu*1e6)
		}
	}
	return 0
}

// childBenchAB compares tunings in one pair of processes: for each size it
// cycles through them in short blocks, many times, so that every tuning
// sees the same load from the rest of the host. A tuning is
// "label=spin,yield,inline[,segmentBytes[,slowWait]]", e.g.
// "old=200us,10us,0" (slowWait 0 or absent: no adaptive yielding).
func childBenchAB(ctx context.Context, c *comm.Comm, specs []string) int {
	type tuning struct {
		label       string
		spin, yield time.Duration
		inline      bool
		seg         int
		slow        time.Duration
		times       []time.Duration
		cpu         time.Duration
	}
	var tunings []*tuning
	for _, s := range specs {
		label, rest, _ := strings.Cut(s, "=")
		f := strings.Split(rest, ",")
		for len(f) < 5 {
			f = append(f, "")
		}
		if len(f) != 5 {
			fmt.Fprintln(os.Stderr, "bad tuning", s)
			return exitBad
		}
		spin, _ := time.ParseDuration(f[0])
		yield, _ := time.ParseDuration(f[1])
		seg, _ := strconv.Atoi(f[3])
		slow, _ := time.ParseDuration(f[4])
		tunings = append(tunings, &tuning{label: label, spin: spin, yield: yield, inline: f[2] == "1", seg: seg, slow: slow})
	}
	n := c.Size()
	for _, size := range benchSizes() {
		buf := comm.Float32s(make([]float32, max(size/4, 1)))
		block := max(2, min(200, (4<<20)/max(size, 1)))
		rounds := max(3, min(20, (256<<20)/max(size, 1)/block/len(tunings)))
		for _, t := range tunings {
			t.times, t.cpu = t.times[:0], 0
		}
		for range 3 {
			_ = c.AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx)
		}
		for round := range rounds {
			for k := range tunings {
				// Rotate the order so no tuning always follows the same one.
				t := tunings[(k+round)%len(tunings)]
				comm.SetTuning(t.spin, t.yield, t.inline, t.slow, true)
				if t.seg > 0 {
					comm.SetSegmentBytes(c, t.seg)
				}
				if err := c.Barrier(ctx).Wait(ctx); err != nil {
					fmt.Fprintln(os.Stderr, err)
					return exitBad
				}
				cpu0 := cpuTime()
				for range block {
					t0 := time.Now()
					if err := c.AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx); err != nil {
						fmt.Fprintln(os.Stderr, err)
						return exitBad
					}
					t.times = append(t.times, time.Since(t0))
				}
				t.cpu += cpuTime() - cpu0
			}
		}
		if c.Rank() != 0 {
			continue
		}
		fmt.Printf("%10d", size)
		for _, t := range tunings {
			slices.Sort(t.times)
			med := t.times[len(t.times)/2].Seconds()
			bw := float64(size) / med / 1e9 * 2 * float64(n-1) / float64(n)
			fmt.Printf("  %s %9.2f us %6.3f GB/s cpu %8.2f", t.label, med*1e6, bw, t.cpu.Seconds()*1e6/float64(len(t.times)))
		}
		fmt.Println()
	}
	return 0
}

// cpuTime is the user and system time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchSizes() []int {
	if s := os.Getenv("GORUN_COMM_SIZES"); s != "" {
		var out []int
		for _, f := range strings.Split(s, ",") {
			v, _ := strconv.Atoi(f)
			out = append(out, v)
		}
		return out
	}
	return []int{8, 1 << 10, 64 << 10, 256 << 10, 2 << 20, 8 << 20, 32 << 20, 64 << 20}
}

type procResult struct {
	code   int
	stdout string
	stderr string
}

// runRanks starts n copies of this test binary as ranks and waits for all.
func runRanks(t *testing.T, n int, mode, transport string, extraEnv ...string) ([]procResult, string) {
	t.Helper()
	dir, shmDir := t.TempDir(), t.TempDir()
	limit := 2 * hangGuard
	if mode == "bench" {
		limit = 10 * time.Minute // a sweep on a shared 2-core host; still a hang guard
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmds := make([]*exec.Cmd, n)
	outs := make([]*bytes.Buffer, n)
	errs := make([]*bytes.Buffer, n)
	for r := range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+mode,
			"GORUN_COMM_RANK="+strconv.Itoa(r), "GORUN_COMM_SIZE="+strconv.Itoa(n),
			"GORUN_COMM_DIR="+dir, "GORUN_COMM_SHMDIR="+shmDir,
			"GORUN_COMM_SECRET=multi-process test secret", "GORUN_COMM_TRANSPORT="+transport)
		cmd.Env = append(cmd.Env, extraEnv...)
		outs[r], errs[r] = &bytes.Buffer{}, &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[r], errs[r]
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	res := make([]procResult, n)
	for r, cmd := range cmds {
		err := cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			res[r].code = ee.ExitCode()
		default:
			t.Fatalf("rank %d: %v", r, err)
		}
		res[r].stdout, res[r].stderr = outs[r].String(), errs[r].String()
	}
	if ctx.Err() != nil {
		t.Fatalf("ranks did not finish within %v (hang)", limit)
	}
	return res, shmDir
}

func TestMultiProcessAllReduce(t *testing.T) {
	for _, transport := range []string{"shm", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			res, shmDir := runRanks(t, 3, "allreduce", transport)
			for r, p := range res {
				if p.code != 0 || !strings.Contains(p.stdout, "ok") {
					t.Errorf("rank %d: exit %d\n%s%s", r, p.code, p.stdout, p.stderr)
				}
				if !strings.Contains(p.stdout, transport) {
					t.Errorf("rank %d did not use %s: %s", r, transport, p.stdout)
				}
			}
			if ents, _ := os.ReadDir(shmDir); len(ents) != 0 {
				t.Errorf("shared memory left behind: %v", ents)
			}
		})
	}
}

// Ranks of a host with at least two per CPU start on the CPU their place
// among the host's ranks gives them, in consecutive blocks (ranks 0 and 1
// on the first CPU of two), when they connect (spreadOnce, from the
// endpoint's connect: comm/spread_linux.go); ranks that fit the CPUs are
// left where the kernel put them.
func TestCrowdedRanksStartSpread(t *testing.T) {
	cpus := comm.AllowedCPUs()
	online := comm.OnlineCPUs()
	if len(cpus) < 2 || online > 4 {
		t.Skipf("%d CPUs allowed of %d online: the test wants 2 to 4", len(cpus), online)
	}
	for _, n := range []int{2 * online, len(cpus)} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			res, _ := runRanks(t, n, "home", "shm")
			for r, p := range res {
				want := -1 // not crowded
				if n > online {
					want = cpus[r*len(cpus)/n%len(cpus)]
				}
				if p.code != 0 || strings.TrimSpace(p.stdout) != fmt.Sprintf("home %d", want) {
					t.Errorf("rank %d of %d: exit %d, %q, want \"home %d\"\n%s", r, n, p.code, p.stdout, want, p.stderr)
				}
			}
		})
	}
}

// SIGKILL of one rank mid-collective: the others fail with an error naming
// it, nobody hangs, and no shared-memory segment survives.
func TestMultiProcessPeerKilled(t *testing.T) {
	for _, transport := range []string{"shm", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			const n = 3
			res, shmDir := runRanks(t, n, "crash", transport)
			for r, p := range res[:n-1] {
				if p.code != exitLost {
					t.Errorf("rank %d: exit %d, want %d\n%s", r, p.code, exitLost, p.stderr)
				}
				t.Logf("rank %d: %s", r, strings.TrimSpace(p.stderr))
			}
			if res[n-1].code != -1 {
				t.Errorf("victim exit %d, want killed", res[n-1].code)
			}
			if ents, _ := os.ReadDir(shmDir); len(ents) != 0 {
				t.Errorf("shared memory left behind: %v", ents)
			}
		})
	}
}

// Ranks in different processes that issue different collectives all fail
// with an error naming both calls.
func TestMultiProcessDesync(t *testing.T) {
	res, _ := runRanks(t, 3, "desync", "shm")
	for r, p := range res {
		if p.code != exitLost {
			t.Errorf("rank %d: exit %d\n%s", r, p.code, p.stderr)
		}
	}
	t.Log(strings.TrimSpace(res[1].stderr))
}

// TestMultiProcessBench prints all-reduce busbw between 2 processes over
// shared memory and TCP. Opt in: GORUN_COMM_BENCH=1 go test -run MultiProcessBench -v ./comm/
func TestMultiProcessBench(t *testing.T) {
	if os.Getenv("GORUN_COMM_BENCH") == "" {
		t.Skip("set GORUN_COMM_BENCH=1 to run")
	}
	for _, transport := range []string{"shm", "tcp"} {
		for _, det := range []string{"0", "1"} {
			if f := os.Getenv("GORUN_COMM_BENCH_ONLY"); f != "" && f != transport+det {
				continue // e.g. GORUN_COMM_BENCH_ONLY=shm0
			}
			res, _ := runRanks(t, 2, "bench", transport, "GORUN_COMM_DET="+det, "GORUN_COMM_SIZES="+os.Getenv("GORUN_COMM_SIZES"))
			for r, p := range res {
				if p.code != 0 {
					t.Errorf("rank %d: exit %d\n%s", r, p.code, p.stderr)
				}
			}
			t.Logf("all-reduce float32 sum, 2 processes, %s, deterministic=%s:\n%s", transport, det, res[0].stdout)
		}
	}
}

// exchangeAddrs publishes this child's endpoint address in dir (written
// aside and renamed, so a reader never sees half of it) and waits up to
// 30 s for every rank's: the process tests' stand-in for the rendezvous,
// which comm does not depend on.
func exchangeAddrs(dir string, rank, size int, addr string) ([]string, error) {
	tmp := filepath.Join(dir, fmt.Sprintf(".addr.%d", rank))
	_ = os.WriteFile(tmp, []byte(addr), 0o600)
	_ = os.Rename(tmp, filepath.Join(dir, fmt.Sprintf("addr.%d", rank)))
	addrs := make([]string, size)
	deadline := time.Now().Add(30 * time.Second)
	for r := 0; r < size; {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("addr.%d", r)))
		if err == nil {
			addrs[r] = string(b)
			r++
			continue
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("peers did not appear in %s within 30 s (%d of %d did)", dir, r, size)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return addrs, nil
}
