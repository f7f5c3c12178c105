package multihost

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// The MPI program of tests/mpi, built with MPICH once for this package.
var (
	mpiOnce sync.Once
	mpiProg string
	mpiErr  error
)

func requireMPICH(t *testing.T) string {
	t.Helper()
	mpiOnce.Do(func() {
		if _, err := exec.LookPath("mpicc.mpich"); err != nil {
			mpiErr = fmt.Errorf("mpicc.mpich is not installed; scripts/install-test-deps.sh installs Debian's mpich and libmpich-dev")
			return
		}
		// The hosts are network namespaces of this machine: they share
		// its file system, so the binary sits next to gorun's (TestMain
		// removes that directory) where every host finds it.
		mpiProg = filepath.Join(filepath.Dir(gorunBin), "mpiprog")
		if out, err := exec.Command("mpicc.mpich", "-O1", "-o", mpiProg, "../mpi/testdata/mpiprog.c").CombinedOutput(); err != nil {
			mpiErr = fmt.Errorf("mpicc.mpich: %v\n%s", err, out)
		}
	})
	if mpiErr != nil {
		t.Fatal(mpiErr)
	}
	return mpiProg
}

// mpiJob is gorun running the MPI program on np ranks over hosts of slots
// ranks each; leading "--flag value" pairs in args go to gorun.
func mpiJob(t *testing.T, np, slots int, args ...string) *job {
	t.Helper()
	h := requireHosts(t)
	prog := requireMPICH(t)
	hf, err := h.WriteHostfile(t.TempDir(), slots)
	if err != nil {
		t.Fatal(err)
	}
	j := &job{t: t, h: h, token: launchertest.NewToken(t.Name())}
	// Flags for gorun come first in args, the program's after them.
	var flags []string
	for len(args) > 1 && strings.HasPrefix(args[0], "--") {
		flags, args = append(flags, args[0], args[1]), args[2:]
	}
	a := append([]string{"--launch-agent", strings.Join(h.SSHArgs(), " "), "-hostfile", hf, "-np", fmt.Sprint(np),
		"--grace", "3s", "--tag-output", "-x", launchertest.TokenEnv + "=" + j.token}, flags...)
	a = append(a, prog)
	j.cmd = exec.Command(gorunBin, append(a, args...)...)
	j.cmd.Stdout, j.cmd.Stderr = &j.stdout, &j.stderr
	return j
}

// 2 hosts × 2 ranks: the four ranks form one MPI world (job-wide PMI
// barrier through gorun), MPICH's collectives, split and ring give the
// values the placement implies, and each rank runs where the plan says; in
// both PMI modes (each host's server on a socketpair per rank, or on that
// host's loopback port).
func TestMPIWorldTwoHostsTwoRanks(t *testing.T) {
	for _, mode := range []string{"fd", "port"} {
		t.Run(mode, func(t *testing.T) { mpiWorld(t, mode) })
	}
}

func mpiWorld(t *testing.T, mode string) {
	j := mpiJob(t, 4, 2, "--pmi", mode, "check")
	if code := j.run(); code != 0 {
		t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", code, j.stdout.String(), j.stderr.String())
	}
	out := j.stdout.String()
	if strings.Contains(out, "FAIL") {
		t.Fatalf("the program saw a wrong value:\n%s", out)
	}
	for rank := range 4 {
		host := j.h.Hosts[rank/2]
		for _, want := range []string{
			fmt.Sprintf("[%d,%s] ok world rank=%d size=4 host=%s", rank, host, rank, host),
			fmt.Sprintf("[%d,%s] ok allreduce rank=%d sum=10", rank, host, rank),
			fmt.Sprintf("[%d,%s] ok bcast rank=%d val=4246", rank, host, rank),
			// Two ranks per host: MPICH's node map, from gorun's
			// PMI_process_mapping, must say so (the namespace hosts
			// share one /dev/shm, so a wrong map would still run).
			fmt.Sprintf("[%d,%s] ok node rank=%d nodesize=2", rank, host, rank),
		} {
			if !strings.Contains(out, want) {
				t.Errorf("missing %q\noutput:\n%s", want, out)
			}
		}
	}
	if !strings.Contains(out, "ok ring rank=0 token=10") {
		t.Errorf("the ring did not come round:\n%s", out)
	}
	j.noSurvivors()
}

// An MPI_Abort on the second host ends the job on both hosts with that
// rank and host named and its code as gorun's; nothing survives anywhere.
func TestMPIAbortAcrossHosts(t *testing.T) {
	j := mpiJob(t, 4, 2, "abort", "3", "5")
	if code := j.run(); code != 5 {
		t.Fatalf("gorun exited %d, want 5\nstderr:\n%s", code, j.stderr.String())
	}
	want := regexp.MustCompile(`gorun: rank 3 \(host ` + regexp.QuoteMeta(j.h.Hosts[1]) + `, pid \d+\) called MPI_Abort with code 5; stopped 3 other ranks`)
	if !want.MatchString(j.stderr.String()) {
		t.Errorf("stderr does not match %q:\n%s", want, j.stderr.String())
	}
	j.noSurvivors()
}

// A rank SIGKILLed on the second host while every rank loops over
// MPI_Allreduce ends the job on both hosts, naming it; its peers, spinning
// in MPICH's progress engine on either host, are stopped and none survives.
func TestMPIKillInCollectiveAcrossHosts(t *testing.T) {
	j := mpiJob(t, 4, 2, "collective", "3")
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`pid (\d+) in collective`)
	var pid int
	if !launchertest.WaitFor(30*time.Second, func() bool {
		m := re.FindStringSubmatch(j.stdout.String())
		if m != nil {
			pid, _ = strconv.Atoi(m[1])
		}
		return m != nil
	}) {
		_ = j.cmd.Process.Kill()
		j.wait()
		t.Fatalf("rank 3 never reached the collective\nstdout:\n%s\nstderr:\n%s", j.stdout.String(), j.stderr.String())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(); code != 137 {
		t.Fatalf("gorun exited %d, want 137\nstderr:\n%s", code, j.stderr.String())
	}
	want := fmt.Sprintf("gorun: rank 3 (host %s, pid %d) killed by signal 9 (killed); stopped 3 other ranks", j.h.Hosts[1], pid)
	if !strings.Contains(j.stderr.String(), want) {
		t.Errorf("stderr does not say %q:\n%s", want, j.stderr.String())
	}
	j.noSurvivors()
}
