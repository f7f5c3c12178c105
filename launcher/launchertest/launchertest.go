// Package launchertest turns a test binary into the rank program of launcher
// tests, in the manner of os/exec's helper process: a TestMain calls
// MaybeRunHelper first, and a process started with HelperEnv set behaves as
// the named helper instead of running tests.
//
// It also finds a test's processes after the fact: every helper process
// carries the test's token in its environment (TokenEnv), inherited by
// every child it starts, so Survivors can scan /proc for exactly the
// processes of one test, wherever they were reparented.
package launchertest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/collateral"
	grank "github.com/gorun-hpc/gorun/rank"
)

const (
	// HelperEnv selects the helper mode for every rank.
	HelperEnv = "GORUN_TEST_HELPER"
	// TokenEnv carries the test's unique token.
	TokenEnv = "GORUN_TEST_TOKEN"
)

// FastRaceExit makes processes started from this test binary skip the race
// detector's one-second sleep at exit (GORACE atexit_sleep_ms), which
// otherwise dominates every launch in a -race run. Call it from TestMain
// before m.Run; an explicit GORACE setting is kept.
func FastRaceExit() {
	if _, ok := os.LookupEnv("GORACE"); !ok {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
}

// RankHelperEnv is the variable that overrides the mode for one rank.
func RankHelperEnv(rank int) string { return HelperEnv + "_" + strconv.Itoa(rank) }

// Env returns the environment that makes the test binary behave as helper
// mode for every rank, marked with token, based on os.Environ. perRank maps
// ranks to a different mode.
func Env(token, mode string, perRank map[int]string) []string {
	env := append(os.Environ(), HelperEnv+"="+mode, TokenEnv+"="+token)
	for r, m := range perRank {
		env = append(env, RankHelperEnv(r)+"="+m)
	}
	return env
}

// NewToken returns a token unique to this test process and call.
func NewToken(name string) string {
	return fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(name, "/", "_"), os.Getpid(), time.Now().UnixNano())
}

// MaybeRunHelper runs the helper mode named in the environment and exits;
// it returns at once when HelperEnv is unset. Modes:
//
//	print-env          print every NAME=VALUE of the environment, one a line
//	exit:N             exit with code N
//	kill-self:S        kill itself with signal S
//	hang               print "ready", then sleep until killed
//	ignore-sigterm     ignore SIGTERM and SIGINT, print "ready", then hang
//	spawn-grandchild   start a hanging child, print "ready", then hang
//	setsid-grandchild  start a hanging child in a new session, print "ready", hang
//	setsid-orphan      start a hanging child in a new session, print "ready", exit 0
//	setsid-clearenv    start "sleep 3600" in a new session with an empty
//	                   environment (nothing marks it as the job's: Survivors
//	                   cannot find it; scan its pid with Alive), print
//	                   "ready R PID child CPID", hang
//	flood:N            print N numbered lines quickly, then exit 0
//	partial            print "partial-line" without a newline, then exit 0
//	cat                copy stdin to stdout, then exit 0
//	note-sigterm       print "ready RANK PID", wait for SIGTERM, then print
//	                   "sigterm RANK" and exit 0 (shows that gorun's teardown,
//	                   not a kill, ended the rank)
//	wait-usr1          print "ready", wait for SIGUSR1, print "usr1", exit 0
//	args               print the arguments after argv[0] on one line, exit 0
//	allreduce          join the job's world communicator (package rank), run
//	                   all-reduces in a loop, printing "ready" after the
//	                   first; on the first error print it and exit 6 (a
//	                   rank that gives up when a peer is lost)
//	restart-aware      print "world R torch T job J key K" from GORUN_RESTART_COUNT,
//	                   TORCHELASTIC_RESTART_COUNT, GORUN_JOB_ID and a hash of
//	                   GORUN_SECRET; in
//	                   world 0 print "ready" and hang (restart-aware:allreduce:
//	                   run the allreduce mode instead), in later worlds report
//	                   step 1 and exit 0 (restart-aware:grow: as allreduce,
//	                   but world 1 prints "ready" and hangs, printing
//	                   "checkpoint signal at NS" for each SIGUSR1)
//	steps:N            join the world and run N "training steps": an
//	                   all-reduce, rank.ReportStep(i), print "step i",
//	                   sleep 20 ms; exit 0 (on an error print it, exit 6)
//	split:MS           join the world and run five 16-float all-reduces,
//	                   except call #4: the upper half of the ranks Broadcast
//	                   (root 0) instead, a desync (MS 0), or the last rank
//	                   sleeps MS milliseconds before it (a straggler). Print
//	                   "ready" after call #3; "ok" and exit 0 at the end, or
//	                   the error and exit 3 for a DesyncError, else 6
//	split-busy:MS      split:0 (the desync), but this rank is busy for MS
//	                   milliseconds before call #4 (for one rank, through
//	                   RankHelperEnv): the others fail the job meanwhile
//	ticker:MS          for MS milliseconds wake every 5 ms, then print
//	                   "maxgap N" (the longest gap between wake-ups, in ms;
//	                   a stopped rank shows its stop), exit 0
//
// A test binary started as a job reaper (argv[0] "job-reaper") whose
// TestMain did not take the reaper's role exits here instead of running
// the tests again: each run would start reapers of its own, a fork bomb.
func MaybeRunHelper() {
	if os.Args[0] == "job-reaper" {
		fmt.Fprintln(os.Stderr, "launchertest: this test binary was started as a job reaper, but its TestMain did not run the reaper (call supervisor.Is/Main first); refusing to run the tests")
		os.Exit(2)
	}
	mode, ok := os.LookupEnv(HelperEnv)
	if !ok {
		return
	}
	if m, ok := os.LookupEnv(RankHelperEnv(atoi(os.Getenv("RANK")))); ok {
		mode = m
	}
	os.Exit(runHelper(mode))
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func runHelper(mode string) int {
	name, arg, _ := strings.Cut(mode, ":")
	rank := os.Getenv("RANK")
	switch name {
	case "print-env":
		w := bufio.NewWriter(os.Stdout)
		for _, kv := range os.Environ() {
			fmt.Fprintln(w, kv)
		}
		// Where the rank may run, in the same NAME=VALUE form.
		if st, err := os.ReadFile("/proc/self/status"); err == nil {
			for _, line := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
					fmt.Fprintf(w, "GORUN_TEST_CPUS=%s\n", strings.TrimSpace(v))
				}
			}
		}
		w.Flush()
		return 0
	case "exit":
		return atoi(arg)
	case "kill-self":
		syscall.Kill(os.Getpid(), syscall.Signal(atoi(arg)))
		select {}
	case "hang":
		fmt.Printf("ready %s %d\n", rank, os.Getpid())
		select {}
	case "ignore-sigterm":
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
		fmt.Printf("ready %s %d\n", rank, os.Getpid())
		select {}
	case "spawn-grandchild", "setsid-grandchild", "setsid-orphan":
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), HelperEnv+"=hang", RankHelperEnv(atoi(rank))+"=hang")
		if name != "spawn-grandchild" {
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 90
		}
		fmt.Printf("ready %s %d child %d\n", rank, os.Getpid(), cmd.Process.Pid)
		if name == "setsid-orphan" {
			return 0
		}
		select {}
	case "setsid-clearenv":
		cmd := exec.Command("sleep", "3600")
		cmd.Env = []string{}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 90
		}
		fmt.Printf("ready %s %d child %d\n", rank, os.Getpid(), cmd.Process.Pid)
		select {}
	case "flood":
		w := bufio.NewWriterSize(os.Stdout, 4096)
		pad := strings.Repeat("x", 100)
		for i := range atoi(arg) {
			fmt.Fprintf(w, "r%s l%d %s\n", rank, i, pad)
		}
		w.Flush()
		return 0
	case "partial":
		fmt.Print("partial-line")
		return 0
	case "stat":
		// The rank's /proc/self/stat line: its process group and session.
		b, err := os.ReadFile("/proc/self/stat")
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 90
		}
		fmt.Printf("%s\n", bytes.TrimSpace(b))
		return 0
	case "cat":
		io.Copy(os.Stdout, os.Stdin)
		return 0
	case "note-sigterm":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		fmt.Printf("ready %s %d\n", rank, os.Getpid())
		<-c
		fmt.Printf("sigterm %s\n", rank)
		return 0
	case "wait-usr1":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGUSR1)
		fmt.Printf("ready %s %d\n", rank, os.Getpid())
		<-c
		fmt.Println("usr1")
		return 0
	case "args":
		fmt.Println(strings.Join(os.Args[1:], " "))
		return 0
	case "watch-rank":
		// A program that does not use gorun's runtime (so it reports
		// nothing collateral) whose ranks all depend on one: rank V
		// writes its pid to DIR/victim and waits; every other rank
		// exits 1 as soon as V's process is gone, as an MPI program's
		// ranks do when a peer dies. Spelled watch-rank:V:DIR.
		v, dir, _ := strings.Cut(arg, ":")
		file := filepath.Join(dir, "victim")
		if rank == v {
			if err := os.WriteFile(file+".tmp", []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
				fmt.Fprintln(os.Stderr, "helper:", err)
				return 90
			}
			_ = os.Rename(file+".tmp", file)
			fmt.Printf("ready %s %d\n", rank, os.Getpid())
			select {}
		}
		fmt.Printf("ready %s %d\n", rank, os.Getpid())
		for {
			b, err := os.ReadFile(file)
			if err == nil {
				st, err := os.ReadFile("/proc/" + string(b) + "/stat")
				if i := bytes.LastIndexByte(st, ')'); err != nil || (i > 0 && i+2 < len(st) && st[i+2] == 'Z') {
					fmt.Fprintf(os.Stderr, "helper: rank %s: rank %s is gone\n", rank, v)
					return 1
				}
			}
			time.Sleep(50 * time.Microsecond)
		}
	case "allreduce":
		return allReduceLoop(rank, 0)
	case "allreduce-for":
		// All-reduces for arg milliseconds, then a clean exit (0): a job
		// of these fails only if the runtime loses a rank.
		return allReduceLoop(rank, time.Duration(atoi(arg))*time.Millisecond)
	case "restart-aware":
		w := os.Getenv("GORUN_RESTART_COUNT")
		// The secret's hash, not the secret: a test compares worlds.
		key := sha256.Sum256([]byte(os.Getenv("GORUN_SECRET")))
		fmt.Printf("world %s torch %s job %s key %x\n", w, os.Getenv("TORCHELASTIC_RESTART_COUNT"), os.Getenv("GORUN_JOB_ID"), key[:6])
		if w == "1" && arg == "grow" {
			// Until gorun stops this world to grow back: a world
			// that can end no other way keys the test to that event.
			// The checkpoint signal gorun may send first is printed
			// with when it came (Unix ns).
			ck := make(chan os.Signal, 1)
			signal.Notify(ck, syscall.SIGUSR1)
			fmt.Printf("ready %s %d\n", rank, os.Getpid())
			for range ck {
				fmt.Printf("checkpoint signal at %d\n", time.Now().UnixNano())
			}
		}
		if w != "0" {
			// A restarted world's first step (gorun's report times
			// the recovery by it), then done.
			collateral.TellStep(collateral.Step{Rank: atoi(rank), Step: 1})
			return 0
		}
		if arg == "allreduce" || arg == "grow" {
			return allReduceLoop(rank, 0)
		}
		fmt.Printf("ready %s %d\n", rank, os.Getpid())
		select {}
	case "steps":
		return stepLoop(rank, atoi(arg))
	case "split":
		return splitLoop(rank, time.Duration(atoi(arg))*time.Millisecond, 0)
	case "split-busy":
		return splitLoop(rank, 0, time.Duration(atoi(arg))*time.Millisecond)
	case "ticker":
		end := time.Now().Add(time.Duration(atoi(arg)) * time.Millisecond)
		// Step 1 is the ticker's start: a fault after-steps=1 lands
		// inside the measured window however late the rank started.
		collateral.TellStep(collateral.Step{Rank: atoi(rank), Step: 1})
		var maxGap time.Duration
		for last := time.Now(); last.Before(end); {
			time.Sleep(5 * time.Millisecond)
			now := time.Now()
			maxGap = max(maxGap, now.Sub(last))
			last = now
		}
		fmt.Printf("maxgap %d\n", maxGap.Milliseconds())
		return 0
	}
	fmt.Fprintf(os.Stderr, "launchertest: unknown helper mode %q\n", mode)
	return 99
}

// allReduceLoop is the "allreduce" mode: all-reduces until one fails (exit
// 6), or, with a positive d, until d has passed (every rank then closes
// after the same number of calls, agreed through a final all-reduce of the
// count, and exits 0).
func allReduceLoop(rankName string, d time.Duration) int {
	ctx := context.Background()
	r, cm, code := joinWorld(ctx)
	if r == nil {
		return code
	}
	var err error
	buf := make([]float64, 1<<14)
	end := time.Now().Add(d)
	for i := 0; ; i++ {
		if err = cm.AllReduce(ctx, comm.Float64s(buf), comm.Float64s(buf), comm.Sum).Wait(ctx); err != nil {
			break
		}
		if i == 0 {
			fmt.Printf("ready %s %d\n", rankName, os.Getpid())
			// Step 1 is the first all-reduce, which every rank has
			// joined: a fault after-steps=1 fires only once every rank
			// is up and has printed what it printed before.
			r.ReportStep(1)
		}
		if d > 0 && i%16 == 15 {
			// Ranks decide together whether to stop, so that none
			// leaves while the others still call.
			stop := []float64{0}
			if time.Now().After(end) {
				stop[0] = 1
			}
			if err = cm.AllReduce(ctx, comm.Float64s(stop), comm.Float64s(stop), comm.Max).Wait(ctx); err != nil {
				break
			}
			if stop[0] > 0 {
				fmt.Printf("done %s %d calls\n", rankName, i+1)
				if err = r.Close(); err != nil {
					fmt.Fprintf(os.Stderr, "helper: rank %s: close: %v\n", rankName, err)
					return 7
				}
				return 0
			}
		}
	}
	fmt.Fprintf(os.Stderr, "helper: rank %s: %v\n", rankName, err)
	r.Abort(err)
	_ = r.Close()
	return 6
}

// joinWorld joins the job's world (package rank) for the modes that
// communicate; on failure it prints why and returns the exit code 91.
func joinWorld(ctx context.Context) (*grank.Rank, *comm.Comm, int) {
	r, err := grank.Init(ctx, grank.DefaultOptions())
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: init:", err)
		return nil, nil, 91
	}
	return r, r.Comm(), 0
}

// splitLoop is the "split" and "split-busy" mode.
func splitLoop(rankName string, late, busy time.Duration) int {
	ctx := context.Background()
	r, cm, code := joinWorld(ctx)
	if r == nil {
		return code
	}
	var err error
	me, n := cm.Rank(), cm.Size()
	b := comm.Float32s(make([]float32, 16))
	for i := 1; i <= 5 && err == nil; i++ {
		if i == 4 {
			time.Sleep(busy)
		}
		switch {
		case i == 4 && late == 0 && me >= n/2:
			err = cm.Broadcast(ctx, b, b, 0).Wait(ctx)
		case i == 4 && me == n-1:
			time.Sleep(late)
			fallthrough
		default:
			err = cm.AllReduce(ctx, b, b, comm.Sum).Wait(ctx)
		}
		if i == 3 && err == nil {
			fmt.Printf("ready %s %d\n", rankName, os.Getpid())
		}
	}
	if err != nil {
		fmt.Printf("rank %s: %v\n", rankName, err)
		r.Abort(err)
		_ = r.Close()
		var de *comm.DesyncError
		if errors.As(err, &de) {
			return 3
		}
		return 6
	}
	if err := r.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "helper: rank %s: close: %v\n", rankName, err)
		return 6
	}
	fmt.Println("ok")
	return 0
}

// stepLoop is the "steps" mode.
func stepLoop(rankName string, n int) int {
	ctx := context.Background()
	r, cm, code := joinWorld(ctx)
	if r == nil {
		return code
	}
	var err error
	buf := make([]float64, 64)
	for i := 1; i <= n; i++ {
		if err = cm.AllReduce(ctx, comm.Float64s(buf), comm.Float64s(buf), comm.Sum).Wait(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "helper: rank %s: %v\n", rankName, err)
			r.Abort(err)
			_ = r.Close()
			return 6
		}
		r.ReportStep(i)
		fmt.Printf("step %d\n", i)
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "helper: rank %s: close: %v\n", rankName, err)
		return 6
	}
	return 0
}

// Survivors returns the pids of live processes whose environment carries
// token. Zombies are left out: they hold no resources and vanish when
// reaped.
func Survivors(token string) []int {
	needle := []byte(TokenEnv + "=" + token + "\x00")
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(append(env, 0), needle) {
			continue
		}
		if running(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// running reports whether pid exists and is not a zombie.
func running(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return !(i > 0 && i+2 < len(stat) && stat[i+2] == 'Z')
}

// Alive returns those of pids that still run (exist and are not zombies):
// the survivor scan for processes that Survivors cannot recognise, such
// as one that cleared its environment.
func Alive(pids []int) []int {
	var out []int
	for _, pid := range pids {
		if running(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// WaitFor polls cond every 10 ms until it holds or the deadline passes, and
// reports whether it held. Tests use generous deadlines: the machine is
// shared, and only the condition matters, not how fast it came.
func WaitFor(deadline time.Duration, cond func() bool) bool {
	end := time.Now().Add(deadline)
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SyncBuffer is a bytes.Buffer that a command's output goroutines write
// while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Len is how many bytes were written so far.
func (s *SyncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

// Module is gorun's module path; GoBuild takes packages relative to it.
const Module = "github.com/gorun-hpc/gorun"

// GoBuild compiles gorun's packages (paths relative to Module, such as
// "cmd/gorun" or "examples/trainer") into dir, one binary each, named as
// go names them. It is for TestMain, where there is no *testing.T; the
// error carries the compiler's output.
func GoBuild(dir string, pkgs ...string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, p := range pkgs {
		args = append(args, Module+"/"+p)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", strings.Join(pkgs, " "), err, out)
	}
	return nil
}

// Build compiles gorun's packages into a directory of the test's and
// returns it; a build that fails ends the test.
func Build(t interface {
	Helper()
	TempDir() string
	Fatal(...any)
}, pkgs ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := GoBuild(dir, pkgs...); err != nil {
		t.Fatal(err)
	}
	return dir
}
