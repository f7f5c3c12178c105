package multihost

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
)

// A remote host's supervisor killed (SIGKILL) or frozen (SIGSTOP) while
// its ranks have children in sessions of their own: the job ends within
// seconds, exit 255 naming the host, and nothing survives on any host.
// Before the fix the killed case hung gorun (the host agent waited on
// output pipes the escaped children held) and the frozen one kept the
// host's ranks running.
func TestHostSupervisorLossEndsJob(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		t.Run(sig.String(), func(t *testing.T) {
			h := requireHosts(t)
			j := newJob(t, h, 2, "setsid-grandchild", nil)
			if err := j.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waitReady(t, j, 8)
			victim := h.Hosts[2]
			sup := supervisorPid(t, agentPid(t, victim))
			if err := syscall.Kill(sup, sig); err != nil {
				t.Fatal(err)
			}
			hit := time.Now()
			code := j.wait()
			took := time.Since(hit)
			if code != 255 || !strings.Contains(j.stderr.String(), "gorun: lost host "+victim+": ") || took > 30*time.Second {
				t.Errorf("exit %d after %v, stderr:\n%s", code, took, j.stderr.String())
			}
			// The last line says what died: the supervisor, not the
			// agent or the host.
			last := lastLine(j.stderr.String())
			if !strings.Contains(last, "job supervisor") || strings.Contains(last, "host rebooted") {
				t.Errorf("last line %q, want it to name the job supervisor's death", last)
			}
			t.Logf("%v: gorun ended after %v: %s", sig, took.Round(time.Millisecond), last)
			j.noSurvivors()
		})
	}
}

// A remote host's supervisor SIGKILLed while each rank there has started
// a child that left its session and cleared its environment: nothing but
// the job's cgroup marks those children, so only the host agent's kill of
// that cgroup ends them. Exit 255 naming the host, and no survivor on any
// host (noSurvivors scans every host's processes, whatever their
// environment). Skipped, naming why, where gorun cannot write cgroups.
func TestHostSupervisorKilledCgroup(t *testing.T) {
	h := requireHosts(t)
	if _, err := supervisor.CgroupSupport(); err != nil {
		t.Skipf("no job cgroups on this host (%v): the escaped children would survive, as gorun doctor says", err)
	}
	j := newJob(t, h, 2, "setsid-clearenv", nil)
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, j, 8)
	var children []int
	for _, c := range regexp.MustCompile(`ready \d+ \d+ child (\d+)`).FindAllStringSubmatch(j.stdout.String(), -1) {
		pid, _ := strconv.Atoi(c[1])
		children = append(children, pid)
	}
	if len(children) != 8 {
		t.Fatalf("want 8 children, got %v:\n%s", children, j.stdout.String())
	}
	// Whatever happens below, none outlives the test.
	t.Cleanup(func() {
		for _, pid := range launchertest.Alive(children) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	victim := h.Hosts[2]
	if err := syscall.Kill(supervisorPid(t, agentPid(t, victim)), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(); code != 255 || !strings.Contains(j.stderr.String(), "gorun: lost host "+victim+": ") {
		t.Errorf("exit %d, stderr:\n%s", code, j.stderr.String())
	}
	if alive := launchertest.Alive(children); len(alive) > 0 {
		t.Errorf("children that left their session and cleared their environment survive: %v (%s)\nstderr:\n%s", alive, describe(alive), j.stderr.String())
	}
	j.noSurvivors()
}

// supervisorPid finds the job supervisor among the children of a host
// agent.
func supervisorPid(t *testing.T, agent int) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		if ppid, _ := strconv.Atoi(f[1]); ppid != agent {
			continue
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if bytes.Contains(env, []byte("GORUN_INTERNAL_SUPERVISOR=")) {
			return pid
		}
	}
	t.Fatalf("no supervisor under host agent %d", agent)
	return 0
}

// A host agent frozen (SIGSTOP) ends the job naming its host, and its
// ranks die without it: the supervisor's lease on the agent runs out.
// Before, they ran on until the agent was continued.
func TestHostAgentStopKillsItsRanks(t *testing.T) {
	h := requireHosts(t)
	j := newJob(t, h, 2, "setsid-grandchild", nil)
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, j, 8)
	victim := h.Hosts[1]
	agent := agentPid(t, victim)
	if err := syscall.Kill(agent, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// However the test ends, the agent is not left stopped.
	defer syscall.Kill(agent, syscall.SIGCONT)
	code := j.wait()
	if code != 255 || !strings.Contains(j.stderr.String(), "gorun: lost host "+victim+": ") {
		t.Errorf("exit %d, stderr:\n%s", code, j.stderr.String())
	}
	// Checked while the agent is still stopped: the ranks and their
	// children must not wait for it.
	if !launchertest.WaitFor(30*time.Second, func() bool { return len(launchertest.Survivors(j.token)) == 0 }) {
		t.Errorf("ranks survive while their host agent is stopped: %v", launchertest.Survivors(j.token))
	}
	// Continued, the agent finds its job over and leaves.
	_ = syscall.Kill(agent, syscall.SIGCONT)
	j.noSurvivors()
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
