//go:build linux

package comm_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// schedChild is a child process that joined a job's scheduling group.
type schedChild struct {
	cmd  *exec.Cmd
	in   *os.File
	out  *bufio.Reader
	line string // what it printed after joining
}

// field reads key=value from the child's line.
func (k *schedChild) field(key string) string {
	for _, f := range strings.Fields(k.line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// startSchedChild starts a child in a session of its own (as gorun starts
// ranks that are not on its runtime) and waits until it has joined job's
// scheduling group, failing the test unless it did.
func startSchedChild(t *testing.T, job string) *schedChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), schedChildEnv+"="+job)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = pr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	k := &schedChild{cmd: cmd, in: pw, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		k.in.Close()
		_ = k.cmd.Process.Kill()
		_ = k.cmd.Wait()
		_ = comm.RemoveSchedGroup(job)
	})
	if k.line, err = k.out.ReadString('\n'); err != nil {
		t.Fatalf("child: %v", err)
	}
	t.Logf("child %d: %s", cmd.Process.Pid, strings.TrimSpace(k.line))
	if e := k.field("err"); e != "<nil>" {
		t.Fatalf("child: JoinSchedGroup failed: %s", k.line)
	}
	if dir := k.field("joined"); filepath.Base(dir) != "gorun-sched-"+job {
		t.Fatalf("child joined %q, want the job's cgroup gorun-sched-%s", dir, job)
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if !strings.Contains(string(cg), ":/gorun-sched-"+job+"\n") {
		t.Errorf("the child's /proc/pid/cgroup does not show the job's cgroup:\n%s", cg)
	}
	return k
}

// gone waits until dir no longer exists.
func gone(t *testing.T, dir string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists", dir)
		}
	}
}

// Two ranks in sessions of their own on a crowded host are in two
// autogroups; each joins the job's scheduling cgroup, after which they
// publish one tag (so their shared-memory waiters yield to each other), and
// the last to leave removes the cgroup. Needs root and cgroup v1's cpu
// hierarchy with this process at its root (as on the reference host);
// skipped elsewhere, saying why.
func TestJoinSchedGroupSharesOneTag(t *testing.T) {
	if why := comm.SchedGroupHost(); why != "" {
		t.Skip("no scheduling group to join here: " + why)
	}
	job := "test-" + strconv.Itoa(os.Getpid())
	a, b := startSchedChild(t, job), startSchedChild(t, job)
	if a.field("autogroup") == b.field("autogroup") {
		t.Errorf("both children started in autogroup %s; want one each (own sessions)", a.field("autogroup"))
	}
	if ta, tb := a.field("tag"), b.field("tag"); ta != tb || ta == "0" {
		t.Errorf("tags after joining: %s and %s, want one nonzero tag", ta, tb)
	}
	for _, k := range []*schedChild{a, b} {
		fmt.Fprintln(k.in)
		if line, err := k.out.ReadString('\n'); err != nil || line != "left\n" {
			t.Fatalf("child %d: %q %v", k.cmd.Process.Pid, line, err)
		}
		if err := k.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", k.cmd.Process.Pid, err)
		}
	}
	gone(t, a.field("joined"))
}

// A rank that dies inside the cgroup leaves it behind; RemoveSchedGroup
// (the launcher, once the job's ranks are gone) removes it. A bad job id
// is refused by name.
func TestRemoveSchedGroup(t *testing.T) {
	if err := comm.RemoveSchedGroup("a/b"); err == nil || !strings.Contains(err.Error(), `"a/b"`) {
		t.Errorf("RemoveSchedGroup(a/b) = %v, want an error naming the job id", err)
	}
	if err := comm.RemoveSchedGroup("no-such-job-" + strconv.Itoa(os.Getpid())); err != nil {
		t.Errorf("RemoveSchedGroup of a job without a cgroup: %v", err)
	}
	if why := comm.SchedGroupHost(); why != "" {
		t.Skip("no scheduling group to leave behind here: " + why)
	}
	job := "test-left-" + strconv.Itoa(os.Getpid())
	k := startSchedChild(t, job)
	_ = k.cmd.Process.Kill()
	_ = k.cmd.Wait()
	dir := k.field("joined")
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the dead rank's cgroup: %v (want it left behind)", err)
	}
	if err := comm.RemoveSchedGroup(job); err != nil {
		t.Fatal(err)
	}
	gone(t, dir)
}
