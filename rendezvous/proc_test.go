package rendezvous

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/rankenv"
	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

// The test binary is the rank program: with envHelper set it runs one rank
// (see helperMain) instead of the tests.
const envHelper = "GORUN_RDZV_TEST_HELPER"

// helperMain runs the test binary as a rank when envHelper asks for it; it
// reports whether it did (then TestMain returns without running tests).
// Actions:
//
//	barrier: join, print the world, barrier, leave, exit 0
//	wait:    join, print "ready", block until the world fails, print the
//	         error and exit 3
//	wait-exit: as wait, but exit at once without closing the World, as a
//	         program that ends on an error does (a C rank returning from
//	         main, a Go one calling os.Exit): its goroutines get no
//	         chance to run after the exit
func helperMain() bool {
	action, ok := os.LookupEnv(envHelper)
	if !ok {
		return false
	}
	os.Exit(runHelper(action))
	return true
}

func runHelper(action string) int {
	cfg, err := ConfigFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.Logger = zerolog.New(os.Stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	if d := os.Getenv(EnvRdzvTimeout); d == "" {
		cfg.FormationTimeout = 30 * time.Second
	}
	ctx := context.Background()
	w, err := Join(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	hosts := make([]string, w.Size())
	for r := range hosts {
		hosts[r] = w.Host(r)
	}
	fmt.Printf("world rank=%d size=%d epoch=%d hosts=%s\n", w.Rank(), w.Size(), w.Epoch(), strings.Join(hosts, ","))
	switch action {
	case "wait-term":
		// Under gorun: the launcher SIGTERMs the survivors as soon as the
		// killed rank exits; ignoring it (within --grace) lets this rank
		// show that it learns of the loss by itself.
		signal.Ignore(syscall.SIGTERM)
		fallthrough
	case "wait", "wait-exit":
		fmt.Printf("ready rank=%d pid=%d\n", w.Rank(), os.Getpid())
		<-w.Failed()
		fmt.Printf("failed at=%d err=%v\n", time.Now().UnixNano(), w.Err())
		if action == "wait-exit" {
			return 3 // helperMain's os.Exit
		}
		_ = w.Close()
		return 3
	default:
		if err := w.Barrier(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			_ = w.Close()
			return 1
		}
		fmt.Println("barrier ok")
		if err := w.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}
}

// rankEnv is what gorun gives rank r (the GORUN_* subset this package reads).
func rankEnv(job, seed, secret string, r, n int) []string {
	return append(os.Environ(),
		rankenv.JobID+"="+job, rankenv.Secret+"="+secret, rankenv.RdzvEndpoint+"="+seed,
		rankenv.GorunRank+"="+strconv.Itoa(r), rankenv.GorunWorldSize+"="+strconv.Itoa(n),
		rankenv.GorunLocalRank+"="+strconv.Itoa(r), rankenv.GorunHost+"=host"+strconv.Itoa(r/4),
	)
}

const hexSecret = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

// proc is a rank process with its output collected line by line.
type proc struct {
	cmd   *exec.Cmd
	lines chan string // stdout lines; closed at EOF
	mu    sync.Mutex
	out   strings.Builder // stdout and stderr, for failure messages
}

func startRank(t *testing.T, action string, env []string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(env, envHelper+"="+action)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 100)}
	cmd.Stderr = writerFunc(func(b []byte) {
		p.mu.Lock()
		p.out.Write(b)
		p.mu.Unlock()
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
	}()
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// waitLine waits for a stdout line with the prefix, up to a generous
// deadline (the machine is shared; this is not a timing assertion).
func (p *proc) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("rank exited before %q; output:\n%s", prefix, p.output())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			t.Fatalf("no %q after 60s; output:\n%s", prefix, p.output())
		}
	}
}

// drain waits for the process to exit (bounded) and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	for range p.lines {
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		t.Fatalf("rank did not exit; output:\n%s", p.output())
		return -1
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

// Ranks as separate processes on loopback, with the GORUN_* environment
// gorun gives them: they form one world, barrier, and exit 0.
func TestProcessesFormAndBarrier(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const n = 8
	seed := rendezvoustest.FreeSeed(t)
	procs := make([]*proc, n)
	for r := range procs {
		procs[r] = startRank(t, "barrier", rankEnv("procjob", seed, hexSecret, r, n))
	}
	want := fmt.Sprintf("size=%d epoch=1 hosts=host0,host0,host0,host0,host1,host1,host1,host1", n)
	for r, p := range procs {
		line := p.waitLine(t, "world ")
		if !strings.Contains(line, fmt.Sprintf("rank=%d ", r)) || !strings.Contains(line, want) {
			t.Errorf("rank %d printed %q", r, line)
		}
		p.waitLine(t, "barrier ok")
	}
	for r, p := range procs {
		if code := p.wait(t); code != 0 {
			t.Errorf("rank %d exit %d:\n%s", r, code, p.output())
		}
		if out := p.output(); strings.Contains(out, "lost") {
			t.Errorf("rank %d reported a loss at a normal exit:\n%s", r, out)
		}
	}
}

// SIGKILL one rank: every other rank reports it, naming rank and host and
// the proof (the real kernel refused a connection to its gossip port, not
// the lease's silence), and exits with an error. The 2 s bound is asserted
// under synctest (TestCrashDetectedWithin2s); here the latency is logged,
// and only a generous bound is checked, since the machine is shared.
func TestProcessKilledIsReported(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const n, victim = 6, 4
	seed := rendezvoustest.FreeSeed(t)
	procs := make([]*proc, n)
	for r := range procs {
		procs[r] = startRank(t, "wait", rankEnv("killjob", seed, hexSecret, r, n))
	}
	worst := killRank(t, procs, victim, "rendezvous: rank 4 (host host1) lost: "+ErrRefused.Error())
	t.Logf("slowest detection of a SIGKILLed rank: %v", worst)
}

// killRank waits until every "wait" rank in procs is ready, SIGKILLs
// victim and checks that every survivor reports a failure containing want
// (within a generous 20 s; the machine is shared) and exits 3. It returns
// the slowest report's delay.
func killRank(t *testing.T, procs []*proc, victim int, want string) time.Duration {
	t.Helper()
	return signalRank(t, procs, victim, syscall.SIGKILL, want)
}

// signalRank is killRank with any signal. A victim that sig does not end
// (SIGSTOP: frozen) is SIGKILLed once every survivor has reported it.
func signalRank(t *testing.T, procs []*proc, victim int, sig syscall.Signal, want string) time.Duration {
	t.Helper()
	for _, p := range procs {
		p.waitLine(t, "ready")
	}
	killed := time.Now()
	if err := procs[victim].cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if sig != syscall.SIGKILL {
		// Whatever happens below, the frozen rank does not outlive the test.
		t.Cleanup(func() { _ = procs[victim].cmd.Process.Kill() })
	}
	var worst time.Duration
	for r, p := range procs {
		if r == victim {
			continue
		}
		line := p.waitLine(t, "failed ")
		if !strings.Contains(line, want) {
			t.Errorf("rank %d: %q, want %q", r, line, want)
		}
		at, _ := strconv.ParseInt(strings.TrimPrefix(strings.Fields(line)[1], "at="), 10, 64)
		d := time.Unix(0, at).Sub(killed)
		worst = max(worst, d)
		if d > 20*time.Second {
			t.Errorf("rank %d saw the kill after %v", r, d)
		}
		if code := p.wait(t); code != 3 {
			t.Errorf("rank %d exit %d, want 3", r, code)
		}
	}
	if sig != syscall.SIGKILL {
		_ = procs[victim].cmd.Process.Kill()
	}
	procs[victim].wait(t)
	return worst
}

// A process without the job secret is refused: its join fails and the
// members never see it.
func TestForeignProcessRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	seed := rendezvoustest.FreeSeed(t)
	cfgs := make([]Config, 2)
	for r := range cfgs {
		c := LocalConfig()
		c.JobID, c.Rank, c.WorldSize, c.Host, c.Seed = "fjob", r, 3, "local", seed
		c.Secret = []byte(hexSecret[:32])
		c.Logger = testLogger(t)
		cfgs[r] = c
	}
	// Ranks 0 and 1 run here and wait for rank 2; the foreign process
	// claims to be rank 2 of the same job, without the secret.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ws []*World
	var errs []error
	done := make(chan struct{})
	go func() { ws, errs = joinAll(ctx, cfgs); close(done) }()
	env := rankEnv("fjob", seed, strings.Repeat("ab", 32), 2, 3)
	env = append(env, EnvRdzvTimeout+"=3s")
	p := startRank(t, "barrier", env)
	code := p.wait(t)
	out := p.output()
	if code != 1 || !strings.Contains(out, "rendezvous: rank 2 could not join the seed "+seed) {
		t.Errorf("foreign process: exit %d, output:\n%s", code, out)
	}
	cancel()
	<-done
	for r, err := range errs {
		if !strings.Contains(fmt.Sprint(err), "2/3 ranks") {
			t.Errorf("rank %d: %v (want still waiting for rank 2)", r, err)
		}
	}
	closeAll(ws)
}

// Launched torch style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
// nothing of gorun's), ranks form their world with MASTER_ADDR:MASTER_PORT
// as the seed, and warn that the job secret is derived.
func TestProcessesTorchStyle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const n = 4
	port := rendezvoustest.FreePort(t)
	var base []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GORUN_") && !strings.HasPrefix(kv, "SLURM_") {
			base = append(base, kv)
		}
	}
	procs := make([]*proc, n)
	for r := range procs {
		procs[r] = startRank(t, "barrier", append(slices.Clone(base),
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n), "LOCAL_RANK="+strconv.Itoa(r),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port)))
	}
	for r, p := range procs {
		p.waitLine(t, "barrier ok")
		if code := p.wait(t); code != 0 {
			t.Errorf("rank %d exit %d:\n%s", r, code, p.output())
		}
		if !strings.Contains(p.output(), "not protected") {
			t.Errorf("rank %d: no warning about the derived secret:\n%s", r, p.output())
		}
	}
}
