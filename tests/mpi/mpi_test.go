package mpi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// Built once for the package by TestMain (see main_test.go).
var (
	gorunBin, mpichProg, ompiProg string
	setupErr                      error
	pmi2Prog                      string
	hwlocProg                     string
	pmi2Err                       error
	missing                       string // a tool the tests need that is not installed
)

// run is one gorun run of an MPI program, bounded in time.
type run struct {
	t              *testing.T
	token          string
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
}

func newRun(t *testing.T, args ...string) *run {
	t.Helper()
	requireMPI(t)
	r := &run{t: t, token: launchertest.NewToken(t.Name())}
	// The token marks every rank (and anything a rank starts), so the
	// orphan check finds exactly this run's processes.
	a := append([]string{"--grace", "3s", "-x", launchertest.TokenEnv + "=" + r.token}, args...)
	r.cmd = exec.Command(gorunBin, a...)
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	return r
}

func (r *run) start() {
	r.t.Helper()
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
}

// wait returns gorun's exit code; a run longer than a minute is a hang.
func (r *run) wait() int {
	r.t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		} else if err != nil {
			r.t.Fatal(err)
		}
		return 0
	case <-time.After(time.Minute):
		_ = r.cmd.Process.Kill()
		<-done
		r.t.Fatalf("gorun hangs (killed after a minute)\nstdout:\n%s\nstderr:\n%s", r.stdout.String(), r.stderr.String())
		return -1
	}
}

// noSurvivors fails the test when any process of the run is left.
func (r *run) noSurvivors() {
	r.t.Helper()
	var left []int
	if !launchertest.WaitFor(10*time.Second, func() bool { left = launchertest.Survivors(r.token); return len(left) == 0 }) {
		r.t.Errorf("processes of the job survive: %v", left)
	}
}

// TestWorlds runs the checks (rank/size, Allreduce, Bcast, Comm_split, a
// ring) under gorun -np 1..4, in both PMI modes for 3 ranks: every rank
// must see the whole world, not a singleton, and every value must be the
// one the placement implies.
func TestWorlds(t *testing.T) {
	for _, tc := range []struct {
		np  int
		pmi string
	}{{1, "fd"}, {2, "fd"}, {3, "fd"}, {4, "fd"}, {3, "port"}} {
		t.Run(fmt.Sprintf("np%d-%s", tc.np, tc.pmi), func(t *testing.T) {
			r := newRun(t, "-np", strconv.Itoa(tc.np), "--pmi", tc.pmi, mpichProg, "check")
			r.start()
			if code := r.wait(); code != 0 {
				t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", code, r.stdout.String(), r.stderr.String())
			}
			checkWorld(t, r.stdout.String(), tc.np, nil, tc.np)
		})
	}
}

// checkWorld verifies the "ok" lines of np ranks. hosts, when set, maps
// each rank to the host it must run on; perNode is the number of ranks on
// each node (MPICH learns it from PMI_process_mapping).
func checkWorld(t *testing.T, out string, np int, hosts map[int]string, perNode int) {
	t.Helper()
	got := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		// Tagged output ("[rank,host] line") is reduced to the line.
		if i := strings.Index(l, "] "); strings.HasPrefix(l, "[") && i > 0 {
			l = l[i+2:]
		}
		if strings.HasPrefix(l, "FAIL") {
			t.Errorf("the program saw a wrong value: %s", l)
		}
		if strings.HasPrefix(l, "ok ") {
			got[l] = true
		}
	}
	var want []string
	for rank := range np {
		host, _ := os.Hostname()
		if hosts != nil {
			host = hosts[rank]
		}
		want = append(want,
			fmt.Sprintf("ok world rank=%d size=%d host=%s", rank, np, host),
			fmt.Sprintf("ok allreduce rank=%d sum=%d", rank, np*(np+1)/2),
			fmt.Sprintf("ok bcast rank=%d val=%d", rank, 4242+np))
		n, hsum, hrank := 0, 0, 0
		for r := rank % 2; r < np; r += 2 {
			n++
			hsum += r
			if r > rank {
				hrank++ // key -rank: higher ranks come first
			}
		}
		want = append(want, fmt.Sprintf("ok split rank=%d color=%d hrank=%d hsize=%d hsum=%d", rank, rank%2, hrank, n, hsum),
			fmt.Sprintf("ok node rank=%d nodesize=%d", rank, perNode))
	}
	want = append(want, fmt.Sprintf("ok ring rank=0 token=%d", np*(np+1)/2))
	var miss []string
	for _, w := range want {
		if !got[w] {
			miss = append(miss, w)
		}
	}
	if len(miss) > 0 || len(got) != len(want) {
		sort.Strings(miss)
		t.Errorf("%d of %d expected lines missing (%d lines seen):\n%s\noutput:\n%s", len(miss), len(want), len(got), strings.Join(miss, "\n"), out)
	}
}

// TestAbort: MPI_Abort on rank 1 of 3 ends the job with its code and one
// line naming it; the ranks waiting in MPI_Barrier are stopped, none
// survives.
func TestAbort(t *testing.T) {
	r := newRun(t, "-np", "3", mpichProg, "abort", "1", "7")
	r.start()
	if code := r.wait(); code != 7 {
		t.Fatalf("gorun exited %d, want 7 (the abort code)\nstderr:\n%s", code, r.stderr.String())
	}
	if want := regexp.MustCompile(`gorun: rank 1 \(host \S+, pid \d+\) called MPI_Abort with code 7; stopped 2 other ranks`); !want.MatchString(r.stderr.String()) {
		t.Errorf("stderr does not name the aborting rank as %q:\n%s", want, r.stderr.String())
	}
	r.noSurvivors()
}

// TestNoFinalize: a rank that returns 0 after MPI_Init without
// MPI_Finalize would leave the others in MPI_Barrier forever; gorun ends
// the job naming it, with exit code 1.
func TestNoFinalize(t *testing.T) {
	r := newRun(t, "-np", "3", mpichProg, "no-finalize", "2")
	r.start()
	if code := r.wait(); code != 1 {
		t.Fatalf("gorun exited %d, want 1\nstderr:\n%s", code, r.stderr.String())
	}
	if want := regexp.MustCompile(`gorun: rank 2 \(host \S+, pid \d+\) exited before MPI_Finalize`); !want.MatchString(r.stderr.String()) {
		t.Errorf("stderr does not name rank 2 as %q:\n%s", want, r.stderr.String())
	}
	r.noSurvivors()
}

// A rank SIGKILLed around MPI_Init ends the job with one line naming it
// and exit code 137, and nothing survives: killed while it waits inside
// MPI_Init for peers that have not arrived (TestKillDuringInit), or killed
// before MPI_Init while its peers wait inside MPI_Init for it — in a PMI
// barrier that can never complete, which must not hang the job
// (TestKillWhilePeersInInit).
func TestKillDuringInit(t *testing.T) {
	r, pids := startKill(t, "init-stall")
	waitInPMIRead(t, pids[victim])
	killAndCheck(t, r, pids[victim])
}

func TestKillWhilePeersInInit(t *testing.T) {
	r, pids := startKill(t, "init-late")
	for rank, pid := range pids {
		if rank != victim {
			waitInPMIRead(t, pid)
		}
	}
	killAndCheck(t, r, pids[victim])
}

// TestKillDuringCollective: the same while every rank loops over
// MPI_Allreduce (MPICH's progress engine spinning in the peers).
func TestKillDuringCollective(t *testing.T) {
	r := newRun(t, "-np", "4", mpichProg, "collective", strconv.Itoa(victim))
	r.start()
	pid := 0
	re := regexp.MustCompile(`pid (\d+) in collective`)
	if !launchertest.WaitFor(30*time.Second, func() bool {
		m := re.FindStringSubmatch(r.stdout.String())
		if m != nil {
			pid, _ = strconv.Atoi(m[1])
		}
		return m != nil
	}) {
		r.abandon("rank never reached the collective")
	}
	killAndCheck(t, r, pid)
}

const victim = 2

// startKill starts 4 ranks in mode with the victim rank and returns the
// pid of every rank, once each has said what it is doing.
func startKill(t *testing.T, mode string) (*run, map[int]int) {
	t.Helper()
	r := newRun(t, "-np", "4", mpichProg, mode, strconv.Itoa(victim))
	r.start()
	re := regexp.MustCompile(`rank (\d+) pid (\d+) (entering|sleeping)`)
	pids := map[int]int{}
	if !launchertest.WaitFor(30*time.Second, func() bool {
		for _, m := range re.FindAllStringSubmatch(r.stdout.String(), -1) {
			rank, _ := strconv.Atoi(m[1])
			pids[rank], _ = strconv.Atoi(m[2])
		}
		return len(pids) == 4
	}) {
		r.abandon("not every rank reported its pid")
	}
	return r, pids
}

// waitInPMIRead waits until pid is blocked reading its PMI socket
// (descriptor 3) — inside MPI_Init, in the PMI barrier: /proc/PID/syscall
// then starts with "0 0x3 " (read(3, ...)).
func waitInPMIRead(t *testing.T, pid int) {
	t.Helper()
	if !launchertest.WaitFor(20*time.Second, func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
		return strings.HasPrefix(string(b), "0 0x3 ")
	}) {
		t.Errorf("pid %d never blocked reading its PMI socket", pid)
	}
}

func killAndCheck(t *testing.T, r *run, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(); code != 128+9 {
		t.Fatalf("gorun exited %d, want 137\nstderr:\n%s", code, r.stderr.String())
	}
	want := fmt.Sprintf("gorun: rank %d (host localhost, pid %d) killed by signal 9 (killed); stopped 3 other ranks", victim, pid)
	if !strings.Contains(r.stderr.String(), want) {
		t.Errorf("stderr does not say %q:\n%s", want, r.stderr.String())
	}
	r.noSurvivors()
}

// abandon ends a run that did not get where the test needed it.
func (r *run) abandon(why string) {
	r.t.Helper()
	_ = r.cmd.Process.Kill()
	r.wait()
	r.noSurvivors()
	r.t.Fatalf("%s\nstdout:\n%s\nstderr:\n%s", why, r.stdout.String(), r.stderr.String())
}

// TestOpenMPIRefused: an Open MPI program would run as one singleton per
// rank; gorun refuses it before any rank starts, saying why and what to
// do, and runs it (as singletons, as asked) only with --pmi none.
func TestOpenMPIRefused(t *testing.T) {
	requireMPI(t)
	if ompiProg == "" {
		t.Skip("skipping: mpicc.openmpi is not installed (Debian libopenmpi-dev)")
	}
	r := newRun(t, "-np", "2", ompiProg, "check")
	r.start()
	if code := r.wait(); code != 127 {
		t.Fatalf("gorun exited %d, want 127\nstdout:\n%s\nstderr:\n%s", code, r.stdout.String(), r.stderr.String())
	}
	for _, want := range []string{"linked against Open MPI", "libmpi.so.40", "mpirun", "mpicc.mpich"} {
		if !strings.Contains(r.stderr.String(), want) {
			t.Errorf("refusal does not mention %q:\n%s", want, r.stderr.String())
		}
	}
	if r.stdout.Len() != 0 {
		t.Errorf("a rank ran: %q", r.stdout.String())
	}
}

// TestOpenMPILoadedAtRunTimeRefused: python3 with Debian's mpi4py (built
// for Open MPI) passes the library check, since the interpreter does not
// link MPI. Under gorun every rank must still fail with an error that
// names gorun, never print "rank 0 of 1" as a singleton and exit 0.
func TestOpenMPILoadedAtRunTimeRefused(t *testing.T) {
	requireMPI(t)
	const py = "/usr/bin/python3"
	out, err := exec.Command(py, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Open MPI") {
		t.Skipf("skipping: %s has no mpi4py built for Open MPI (Debian python3-mpi4py): %v %.200s", py, err, out)
	}
	script := filepath.Join(t.TempDir(), "hello.py")
	if err := os.WriteFile(script, []byte("from mpi4py import MPI\nc = MPI.COMM_WORLD\nprint('rank %d of %d' % (c.Get_rank(), c.Get_size()), flush=True)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newRun(t, "-np", "2", py, script)
	r.start()
	code := r.wait()
	if code == 0 || strings.Contains(r.stdout.String(), "rank 0 of 1") {
		t.Fatalf("gorun exited %d with the ranks run as singletons\nstdout:\n%s\nstderr:\n%s", code, r.stdout.String(), r.stderr.String())
	}
	if !strings.Contains(r.stderr.String(), "gorun_does_not_serve_Open_MPI") {
		t.Errorf("the ranks' error does not name gorun:\n%s", r.stderr.String())
	}
	r.noSurvivors()
	// --pmi none: run as asked, singletons.
	r = newRun(t, "-np", "2", "--pmi", "none", py, script)
	r.start()
	if code := r.wait(); code != 0 || strings.Count(r.stdout.String(), "rank 0 of 1") != 2 {
		t.Errorf("--pmi none: exit %d, stdout %q, want two singletons", code, r.stdout.String())
	}
}

// TestEnvironmentHonest: with PMI served a rank sees PMI_FD and, of Open
// MPI's variables, only the parameter that makes its MPI_Init refuse
// (OMPI_MCA_pml naming gorun); with --pmi none it sees no PMI_* and no
// OMPI_* variable at all.
func TestEnvironmentHonest(t *testing.T) {
	requireMPI(t)
	for _, tc := range []struct {
		pmi        string
		want, none []string
	}{
		{"fd", []string{"PMI_RANK=1", "PMI_SIZE=2", "PMI_FD=3", "OMPI_MCA_pml=gorun_does_not_serve_Open_MPI"}, []string{"PMI_PORT", "PMI_ID", "OMPI_COMM"}},
		{"port", []string{"PMI_RANK=1", "PMI_SIZE=2", "PMI_PORT=127.0.0.1:", "PMI_ID=", "OMPI_MCA_pml=gorun_does_not_serve_Open_MPI"}, []string{"PMI_FD", "OMPI_COMM"}},
		{"none", nil, []string{"PMI_", "OMPI_"}},
	} {
		t.Run(tc.pmi, func(t *testing.T) {
			// Inherited values (gorun run under another launcher) must
			// not leak through.
			r := newRun(t, "-np", "2", "--pmi", tc.pmi, "/bin/sh", "-c", `if [ "$RANK" = 1 ]; then env; fi`)
			r.cmd.Env = append(os.Environ(), "PMI_FD=9", "PMI_PORT=elsewhere:1", "PMI_ID=5", "OMPI_COMM_WORLD_RANK=9")
			r.start()
			if code := r.wait(); code != 0 {
				t.Fatalf("gorun exited %d\nstderr:\n%s", code, r.stderr.String())
			}
			env := "\n" + r.stdout.String()
			for _, w := range tc.want {
				if !strings.Contains(env, "\n"+w) {
					t.Errorf("rank 1's environment lacks %s", w)
				}
			}
			for _, n := range tc.none {
				if strings.Contains(env, "\n"+n) {
					t.Errorf("rank 1's environment has %s*:\n%s", n, env)
				}
			}
		})
	}
}

// TestPMI2 runs Slurm's PMI-2 client (libpmi2) under gorun in both modes:
// fullinit, puts with ';' and spaces in values, a job-wide fence, gets of
// every rank's value, the process mapping, a node attribute waited for,
// a second fence and finalize.
func TestPMI2(t *testing.T) {
	requireMPI(t)
	if pmi2Err != nil {
		t.Fatal(pmi2Err)
	}
	for _, mode := range []string{"fd", "port"} {
		t.Run(mode, func(t *testing.T) {
			r := newRun(t, "-np", "3", "--pmi", mode, pmi2Prog)
			r.start()
			if code := r.wait(); code != 0 {
				t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", code, r.stdout.String(), r.stderr.String())
			}
			for rank := range 3 {
				for _, want := range []string{
					fmt.Sprintf("ok init rank=%d size=3 appnum=0 spawned=0", rank),
					fmt.Sprintf("ok kvs rank=%d cards=3", rank),
					fmt.Sprintf("ok mapping rank=%d (vector,(0,1,3))", rank),
					fmt.Sprintf("ok nodeattr rank=%d from-0", rank),
				} {
					if !strings.Contains(r.stdout.String(), want+"\n") {
						t.Errorf("missing %q\nstdout:\n%s", want, r.stdout.String())
					}
				}
			}
		})
	}
}

// TestPMI2Abort: Slurm's PMI2_Abort sends its abort and exits 1 at once;
// gorun still reports the abort (with its message), not a plain exit.
func TestPMI2Abort(t *testing.T) {
	requireMPI(t)
	if pmi2Err != nil {
		t.Fatal(pmi2Err)
	}
	r := newRun(t, "-np", "3", pmi2Prog, "abort", "1")
	r.start()
	if code := r.wait(); code != 1 {
		t.Fatalf("gorun exited %d, want 1\nstderr:\n%s", code, r.stderr.String())
	}
	if want := regexp.MustCompile(`gorun: rank 1 \(host \S+, pid \d+\) called MPI_Abort with code 1 \(rank gives up\); stopped 2 other ranks`); !want.MatchString(r.stderr.String()) {
		t.Errorf("stderr does not match %q:\n%s", want, r.stderr.String())
	}
	r.noSurvivors()
}

// syncBuffer is shared with the other process tests.
type syncBuffer = launchertest.SyncBuffer

// build compiles the test program with an MPI compiler wrapper into dir.
func build(cc, dir, name string) (string, error) {
	out := filepath.Join(dir, name)
	b, err := exec.Command(cc, "-O1", "-Wall", "-o", out, "testdata/mpiprog.c").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s: %v\n%s", cc, err, b)
	}
	return out, nil
}
