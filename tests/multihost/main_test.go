package multihost

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// Shared by the tests of this package: starting hosts costs seconds, so one
// set serves them all (the tests run one after another).
var (
	hosts    *testhosts.Netns
	hostsErr error
	gorunBin string
	buildErr error
)

const numHosts = 4

func TestMain(m *testing.M) {
	maybeRdzvRank()
	launchertest.MaybeRunHelper()
	launchertest.FastRaceExit()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	dir, err := os.MkdirTemp("", "gorun-multihost-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if !testing.Short() && os.Geteuid() == 0 {
		gorunBin = filepath.Join(dir, "gorun")
		buildErr = launchertest.GoBuild(dir, "cmd/gorun")
		hosts, hostsErr = testhosts.StartNetns(context.Background(), numHosts)
		if hosts != nil {
			defer hosts.Close()
		}
	}
	return m.Run()
}

// requireHosts skips or fails the test when the shared hosts are missing.
func requireHosts(t *testing.T) *testhosts.Netns {
	t.Helper()
	switch {
	case testing.Short():
		t.Skip("skipping: namespace hosts take seconds to start (-short)")
	case os.Geteuid() != 0:
		t.Skip("skipping: namespace hosts need root")
	case buildErr != nil:
		t.Fatal(buildErr)
	case hostsErr != nil:
		var ue *testhosts.UnsupportedError
		if errors.As(hostsErr, &ue) {
			t.Skipf("skipping: %v", hostsErr)
		}
		t.Fatal(hostsErr)
	}
	return hosts
}

// job is one gorun run on the namespace hosts.
type job struct {
	t      *testing.T
	h      *testhosts.Netns
	token  string
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	// tmp is gorun's TMPDIR when a test gives it one, and before what
	// leftoverNames saw there and in /dev/shm before the job.
	tmp    string
	before map[string]bool
}

// newJob prepares `gorun --launch-agent 'ssh -F …' -hostfile H args... TESTBIN`
// where every rank runs helper mode (perRank overrides by rank).
func newJob(t *testing.T, h *testhosts.Netns, slots int, mode string, perRank map[int]string, args ...string) *job {
	t.Helper()
	hf, err := h.WriteHostfile(t.TempDir(), slots)
	if err != nil {
		t.Fatal(err)
	}
	return newJobOn(t, h, hf, mode, perRank, args...)
}

// newJobOn is newJob with the hostfile hf.
func newJobOn(t *testing.T, h *testhosts.Netns, hf string, mode string, perRank map[int]string, args ...string) *job {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	j := &job{t: t, h: h, token: launchertest.NewToken(t.Name())}
	a := []string{"--launch-agent", strings.Join(h.SSHArgs(), " "), "-hostfile", hf, "--grace", "3s",
		"-x", launchertest.HelperEnv + "=" + mode, "-x", launchertest.TokenEnv + "=" + j.token, "-x", "GORACE=atexit_sleep_ms=0"}
	for r, m := range perRank {
		a = append(a, "-x", launchertest.RankHelperEnv(r)+"="+m)
	}
	a = append(a, args...)
	a = append(a, exe)
	j.cmd = exec.Command(gorunBin, a...)
	j.cmd.Stdout, j.cmd.Stderr = &j.stdout, &j.stderr
	return j
}

// wait runs the job to its end (bounded) and returns gorun's exit code.
func (j *job) wait() int {
	j.t.Helper()
	done := make(chan error, 1)
	go func() { done <- j.cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		} else if err != nil {
			j.t.Fatal(err)
		}
		return 0
	case <-time.After(2 * time.Minute):
		_ = j.cmd.Process.Kill()
		<-done
		j.t.Fatalf("gorun did not end within 2 minutes\nstdout:\n%s\nstderr:\n%s", j.stdout.String(), j.stderr.String())
		return -1
	}
}

func (j *job) run() int {
	j.t.Helper()
	if err := j.cmd.Start(); err != nil {
		j.t.Fatal(err)
	}
	return j.wait()
}

// noSurvivors is the orphan check: no process of the job anywhere (the
// ranks carry the token; /proc shows every namespace's processes) and
// nothing but sshd on any host. The agents of a host whose link was cut
// need their lease to notice, so this polls.
func (j *job) noSurvivors() {
	j.t.Helper()
	var last string
	ok := launchertest.WaitFor(30*time.Second, func() bool {
		last = ""
		if s := launchertest.Survivors(j.token); len(s) > 0 {
			last = fmt.Sprintf("ranks %v survive", s)
			return false
		}
		for _, host := range j.h.Hosts {
			stray, err := j.h.StrayPids(host)
			if err != nil {
				last = err.Error()
				return false
			}
			if len(stray) > 0 {
				last = fmt.Sprintf("host %s still runs %v (%s)", host, stray, describe(stray))
				return false
			}
		}
		return true
	})
	if !ok {
		j.t.Errorf("processes of the job survive: %s", last)
	}
}

func describe(pids []int) string {
	var parts []string
	for _, p := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		parts = append(parts, strings.ReplaceAll(strings.TrimSpace(string(b)), "\x00", " "))
	}
	return strings.Join(parts, "; ")
}

// syncBuffer is shared with the other process tests.
type syncBuffer = launchertest.SyncBuffer
