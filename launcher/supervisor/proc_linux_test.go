package supervisor

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// directChildren is the /proc scan's answer to noChildren's question.
func directChildren(pid int) []int {
	var out []int
	for _, p := range readProcs() {
		if p.ppid == pid {
			out = append(out, p.pid)
		}
	}
	return out
}

// TestDescendantsOfSelf checks the shortcut descendants takes for the
// calling process: noChildren must agree with the /proc scan with a live
// child, with a zombie child and with none, must not reap the zombie (its
// exec.Cmd still collects the exit status), and descendants must still
// find a grandchild.
func TestDescendantsOfSelf(t *testing.T) {
	self := os.Getpid()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), launchertest.HelperEnv+"=spawn-grandchild", "RANK=0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Its own process group, which the grandchild shares: whatever
	// fails below, killing the group leaves nothing running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if !waited {
			_ = cmd.Wait()
		}
	})
	var child, grandchild int
	line, err := bufio.NewReader(out).ReadString('\n')
	if err == nil {
		var rank string
		_, err = fmt.Sscanf(line, "ready %s %d child %d", &rank, &child, &grandchild)
	}
	if err != nil || child != cmd.Process.Pid {
		t.Fatalf("helper said %q (%v), want ready with its pid %d", line, err, cmd.Process.Pid)
	}

	if noChildren() {
		t.Errorf("noChildren with child %d running", child)
	}
	d := descendants(self)
	if !slices.Contains(d, child) || !slices.Contains(d, grandchild) {
		t.Errorf("descendants = %v, want child %d and grandchild %d among them", d, child, grandchild)
	}

	// The grandchild first, and until it is dead, so that it dies as the
	// helper's child and does not outlive the test; then the helper, left
	// unreaped. SIGKILL takes effect asynchronously: killed together, a
	// grandchild still dying when the helper is gone is reparented (to
	// this process, if a test made it a subreaper) and listed alive by
	// the last scan below (seen in clean-clone CI under a PID namespace).
	_ = syscall.Kill(grandchild, syscall.SIGKILL)
	if !launchertest.WaitFor(10*time.Second, func() bool {
		ps := readProcs()
		i := slices.IndexFunc(ps, func(p procInfo) bool { return p.pid == grandchild })
		return i < 0 || ps[i].zombie
	}) {
		t.Fatalf("grandchild %d still alive 10 s after SIGKILL", grandchild)
	}
	_ = syscall.Kill(child, syscall.SIGKILL)
	// Until it can be waited for, without collecting it: a thread-group
	// leader shows as a zombie in /proc before its last thread is gone,
	// and only then can wait reap it.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, child, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("waiting for child %d to be a zombie: %v", child, err)
	}
	if noChildren() {
		t.Errorf("noChildren with zombie child %d", child)
	}
	if d := descendants(self); slices.Contains(d, child) {
		t.Errorf("descendants = %v lists zombie %d", d, child)
	}
	err = cmd.Wait()
	waited = true
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(ee.String(), "killed") {
		t.Fatalf("Wait after noChildren = %v, want the helper's SIGKILL (the probe must not reap it)", err)
	}

	// Other tests may have left nothing running, or not: either way the
	// probe and the scan must agree.
	if got, want := noChildren(), len(directChildren(self)) == 0; got != want {
		t.Errorf("noChildren = %v, but the /proc scan finds children %v", got, directChildren(self))
	}
	if d := descendants(self); slices.Contains(d, child) || slices.Contains(d, grandchild) {
		t.Errorf("descendants = %v after both were killed and reaped", d)
	}
}
