package nccl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rankenv"
	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

var (
	_ Bootstrap = (*rendezvous.World)(nil)
	_ Bootstrap = (*rendezvous.Group)(nil)
)

// rankMain is one rank process: join the rendezvous world from the
// environment gorun gives ranks, make the NCCL communicator over it (rank
// 0's unique id goes round by gossip, or the host leader's socket), check an
// all-reduce across processes, then, with HELPER_VICTIM set, issue a second
// one that the victim never joins and report how it ends.
func rankMain() int {
	rc, err := rendezvous.ConfigFromEnv()
	if err != nil {
		fmt.Println("rank env:", err)
		return 2
	}
	rc.FormationTimeout = 30 * time.Second
	rc.Logger = zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	ctx := context.Background()
	w, err := rendezvous.Join(ctx, rc)
	if err != nil {
		fmt.Println("join:", err)
		return 1
	}
	defer w.Close()
	cfg := DefaultConfig()
	cfg.Library = LibraryConfig{NCCL: os.Getenv("HELPER_NCCL"), CUDA: os.Getenv("HELPER_CUDA"), MinVersion: MinVersion}
	c, err := New(ctx, w, cfg)
	if err != nil {
		fmt.Println("new:", err)
		return 1
	}
	defer c.Close()
	const count = 100000 // larger than the stand-in's rings: several laps
	me, n := c.Rank(), c.Size()
	b, err := c.Device().Alloc(comm.Float32, count)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer b.Free()
	if err := b.CopyFrom(enc(comm.Float32, inputs(me, count))); err != nil {
		fmt.Println(err)
		return 1
	}
	if err := c.AllReduce(ctx, b, b, comm.Sum).Wait(ctx); err != nil {
		fmt.Println("allreduce:", err)
		return 1
	}
	out := make([]byte, count*4)
	if err := b.CopyTo(out); err != nil {
		fmt.Println(err)
		return 1
	}
	for i, v := range dec(comm.Float32, out) {
		want := 0.0
		for q := range n {
			want += input(q, i)
		}
		if v != want {
			fmt.Printf("allreduce: element %d = %v, want %v\n", i, v, want)
			return 1
		}
	}
	fmt.Printf("allreduce ok rank=%d\n", me)
	if aborter, err := strconv.Atoi(os.Getenv("HELPER_ABORTER")); err == nil {
		if me == aborter {
			fmt.Println("ready")
			time.Sleep(300 * time.Millisecond) // the peers' call is in flight
			c.Abort(errors.New("gave up in the test"))
			fmt.Printf("aborted at=%d\n", time.Now().UnixNano())
			select {} // alive: the peers must learn of it from the notice
		}
		h := c.AllReduce(ctx, b, b, comm.Sum)
		fmt.Println("ready")
		err = h.Wait(ctx)
		fmt.Printf("failed at=%d err=%v\n", time.Now().UnixNano(), err)
		fmt.Printf("future err=%v\n", c.AllReduce(ctx, b, b, comm.Sum).Wait(ctx))
		return 3
	}
	victim, err := strconv.Atoi(os.Getenv("HELPER_VICTIM"))
	if err != nil {
		return 0
	}
	if me == victim {
		fmt.Println("ready")
		select {} // killed by the test
	}
	h := c.AllReduce(ctx, b, b, comm.Sum)
	fmt.Println("ready")
	err = h.Wait(ctx)
	fmt.Printf("failed at=%d err=%v\n", time.Now().UnixNano(), err)
	return 3
}

type rankProc struct {
	cmd   *exec.Cmd
	lines chan string
	mu    sync.Mutex
	out   strings.Builder
}

func startRank(t *testing.T, env []string) *rankProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, "GORUN_NCCL_HELPER=rank", "HELPER_NCCL="+standins.NCCL, "HELPER_CUDA="+standins.CUDA)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &rankProc{cmd: cmd, lines: make(chan string, 100)}
	go func() { // owned: ends at the pipe's EOF, which Wait below waits for
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range p.lines {
		}
		_ = cmd.Wait()
	})
	return p
}

func (p *rankProc) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.mu.Lock()
				defer p.mu.Unlock()
				t.Fatalf("rank exited before printing %q:\n%s", prefix, p.out.String())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("no %q within 60 s", prefix)
		}
	}
}

func rankEnv(seed string, r, n int, leaders bool) []string {
	env := []string{
		rankenv.JobID + "=nccljob", rankenv.Secret + "=" + strings.Repeat("5a", 32), rankenv.RdzvEndpoint + "=" + seed,
		rankenv.GorunRank + "=" + strconv.Itoa(r), rankenv.GorunWorldSize + "=" + strconv.Itoa(n),
		rankenv.GorunLocalRank + "=" + strconv.Itoa(r), rankenv.GorunHost + "=host0",
	}
	if leaders {
		// Local rank 0 is the host's gossip member; the others attach
		// to it and get the unique id through it.
		env = append(env, rankenv.GorunLocalSize+"="+strconv.Itoa(n))
	}
	return env
}

// Separate rank processes bootstrap one NCCL communicator through gorun's
// rendezvous (flat gossip, and host leaders relaying to attached ranks) and
// all-reduce across processes; a SIGKILLed rank then fails the survivors'
// pending call within seconds, naming it.
func TestProcessesBootstrapAndLoseARank(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, leaders := range []bool{false, true} {
		t.Run(fmt.Sprintf("hostleaders=%v", leaders), func(t *testing.T) {
			const n, victim = 3, 2
			seed := rendezvoustest.FreeSeed(t)
			procs := make([]*rankProc, n)
			for r := range n {
				env := rankEnv(seed, r, n, leaders)
				if !leaders {
					env = append(env, "HELPER_VICTIM="+strconv.Itoa(victim))
				}
				procs[r] = startRank(t, env)
			}
			for r, p := range procs {
				p.waitLine(t, fmt.Sprintf("allreduce ok rank=%d", r))
			}
			if leaders {
				for r, p := range procs {
					if err := p.cmd.Wait(); err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
				}
				return
			}
			for _, p := range procs {
				p.waitLine(t, "ready")
			}
			time.Sleep(100 * time.Millisecond) // the survivors' call is in flight
			killed := time.Now()
			if err := procs[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			for r, p := range procs {
				if r == victim {
					continue
				}
				line := p.waitLine(t, "failed ")
				if !strings.Contains(line, "peer lost") || !strings.Contains(line, "rank 2") {
					t.Errorf("rank %d: %q, want a lost peer naming rank 2", r, line)
				}
				at, _ := strconv.ParseInt(strings.TrimPrefix(strings.Fields(line)[1], "at="), 10, 64)
				d := time.Unix(0, at).Sub(killed)
				t.Logf("rank %d failed %v after the kill", r, d)
				if d > 20*time.Second { // generous: the machine is shared
					t.Errorf("rank %d failed %v after the kill", r, d)
				}
			}
		})
	}
}

// A rank that aborts its communicator while staying alive tells its peers
// through the rendezvous (gossip streams, or the host leader's socket for
// attached ranks): their pending call and the next one fail within
// seconds, naming the rank and its reason, not as a lost peer and not
// after their own timeouts.
func TestProcessesAbortTellsPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, leaders := range []bool{false, true} {
		t.Run(fmt.Sprintf("hostleaders=%v", leaders), func(t *testing.T) {
			const n, aborter = 3, 1
			seed := rendezvoustest.FreeSeed(t)
			procs := make([]*rankProc, n)
			for r := range n {
				procs[r] = startRank(t, append(rankEnv(seed, r, n, leaders), "HELPER_ABORTER="+strconv.Itoa(aborter)))
			}
			for _, p := range procs {
				p.waitLine(t, "ready")
			}
			line := procs[aborter].waitLine(t, "aborted ")
			at, _ := strconv.ParseInt(strings.TrimPrefix(strings.Fields(line)[1], "at="), 10, 64)
			aborted := time.Unix(0, at)
			for r, p := range procs {
				if r == aborter {
					continue
				}
				line := p.waitLine(t, "failed ")
				if !strings.Contains(line, "rank 1 (host host0) aborted the communicator") || !strings.Contains(line, "gave up in the test") ||
					strings.Contains(line, "peer lost") {
					t.Errorf("rank %d: %q, want rank 1's abort and its reason", r, line)
				}
				at, _ := strconv.ParseInt(strings.TrimPrefix(strings.Fields(line)[1], "at="), 10, 64)
				d := time.Unix(0, at).Sub(aborted)
				t.Logf("rank %d failed %v after the abort", r, d)
				if d > 10*time.Second { // generous: the machine is shared
					t.Errorf("rank %d failed %v after the abort", r, d)
				}
				if future := p.waitLine(t, "future "); !strings.Contains(future, "rank 1 (host host0) aborted the communicator") {
					t.Errorf("rank %d: next call: %q", r, future)
				}
			}
			if err := procs[aborter].cmd.Process.Signal(syscall.Signal(0)); err != nil {
				t.Errorf("the aborting rank is gone (%v): the test proves nothing about notices", err)
			}
		})
	}
}
