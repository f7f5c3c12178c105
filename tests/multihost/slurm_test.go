package multihost

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// requireSlurm returns the shared test cluster and the gorun binary.
func requireSlurm(t *testing.T) *testhosts.Slurm {
	t.Helper()
	s := testhosts.RequireSlurm(t)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return s
}

// slurmJob is `salloc -n N gorun ARGS TESTBIN`: gorun inside an
// allocation, as in an sbatch script, with no host list of its own.
func slurmJob(t *testing.T, s *testhosts.Slurm, n int, mode string, args ...string) *job {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	j := &job{t: t, token: launchertest.NewToken(t.Name())}
	a := []string{"-n", strconv.Itoa(n), gorunBin, "--grace", "2s",
		"-x", launchertest.HelperEnv + "=" + mode, "-x", launchertest.TokenEnv + "=" + j.token, "-x", "GORACE=atexit_sleep_ms=0"}
	a = append(append(a, args...), exe)
	j.cmd = s.Command(context.Background(), "salloc", a...)
	j.cmd.Stdout, j.cmd.Stderr = &j.stdout, &j.stderr
	return j
}

// Inside an allocation gorun takes its hosts and slots from SLURM and
// starts its agents with srun, so the ranks run inside a job step.
func TestSlurmAllocation(t *testing.T) {
	s := requireSlurm(t)
	j := slurmJob(t, s, 4, "print-env", "--tag-output")
	if code := j.run(); code != 0 {
		t.Fatalf("salloc gorun exited %d\nstderr:\n%s", code, j.stderr.String())
	}
	seen := map[string]map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(j.stdout.String()))
	for sc.Scan() {
		tag, kv, ok := strings.Cut(sc.Text(), "] ")
		if !ok {
			continue
		}
		if seen[tag] == nil {
			seen[tag] = map[string]string{}
		}
		k, v, _ := strings.Cut(kv, "=")
		seen[tag][k] = v
	}
	for r := range 4 {
		env := seen[fmt.Sprintf("[%d,%s", r, s.Node)]
		if env == nil {
			t.Fatalf("no output tagged [%d,%s]\nstdout:\n%s\nstderr:\n%s", r, s.Node, j.stdout.String(), j.stderr.String())
		}
		if env["WORLD_SIZE"] != "4" || env["RANK"] != strconv.Itoa(r) || env["SLURM_STEP_ID"] == "" || env["NCCL_SOCKET_IFNAME"] == "" {
			t.Errorf("rank %d: WORLD_SIZE=%q RANK=%q SLURM_STEP_ID=%q NCCL_SOCKET_IFNAME=%q; want 4, %d, a step, an interface",
				r, env["WORLD_SIZE"], env["RANK"], env["SLURM_STEP_ID"], env["NCCL_SOCKET_IFNAME"], r)
		}
	}
	j.noSurvivorsLocal()
}

// SLURM's pre-timeout signals: SIGUSR1 sent to the job's steps reaches the
// ranks and leaves gorun's agents running; SIGTERM to gorun (the batch
// script's process) is forwarded and the grace period applies before
// SIGKILL.
func TestSlurmSignals(t *testing.T) {
	s := requireSlurm(t)

	j := slurmJob(t, s, 2, "wait-usr1")
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, j, 2)
	jobID := grantedJob(t, j)
	if out, err := s.Command(context.Background(), "scancel", "--signal=USR1", jobID).CombinedOutput(); err != nil {
		t.Fatalf("scancel: %v %s", err, out)
	}
	if code := j.wait(); code != 0 || strings.Count(j.stdout.String(), "usr1") != 2 {
		t.Errorf("after SIGUSR1 to the steps: exit %d, stdout %q, stderr:\n%s", code, j.stdout.String(), j.stderr.String())
	}
	j.noSurvivorsLocal()

	j = slurmJob(t, s, 2, "ignore-sigterm")
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, j, 2)
	gorun := findGorun(t, j.token)
	start := time.Now()
	if err := syscall.Kill(gorun, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := j.wait()
	if code != 143 || !strings.Contains(j.stderr.String(), "gorun: received signal 15 (terminated); stopped 2 ranks") {
		t.Errorf("after SIGTERM to gorun: exit %d, stderr:\n%s", code, j.stderr.String())
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Errorf("ranks that ignore SIGTERM were gone after %s, before the 2s grace", took)
	}
	j.noSurvivorsLocal()
}

// noSurvivorsLocal checks that no process of the job remains.
func (j *job) noSurvivorsLocal() {
	j.t.Helper()
	if !launchertest.WaitFor(30*time.Second, func() bool { return len(launchertest.Survivors(j.token)) == 0 }) {
		j.t.Errorf("processes of the job survive: %v", launchertest.Survivors(j.token))
	}
}

var grantedRE = regexp.MustCompile(`Granted job allocation (\d+)`)

func grantedJob(t *testing.T, j *job) string {
	t.Helper()
	m := grantedRE.FindStringSubmatch(j.stderr.String())
	if m == nil {
		t.Fatalf("salloc did not print its job id:\n%s", j.stderr.String())
	}
	return m[1]
}

// findGorun finds the gorun process of the job by the token on its
// command line.
func findGorun(t *testing.T, token string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && args[0] == gorunBin && args[1] != "agent" && strings.Contains(string(b), token) {
			return pid
		}
	}
	t.Fatal("gorun process not found")
	return 0
}
