package supervisor

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// The reaper on its own, with stand-ins: a "supervisor" (a sleep in the
// job cgroup, with a child in a session of its own) and this test as the
// client. Closing the reaper's pipe with the cgroup still there and the
// supervisor gone (both watchers dead) must kill every member and remove
// the cgroup; with the supervisor still alive it must wait for it; after
// the client released the cgroup it must exit at once, killing nothing.
func TestReaper(t *testing.T) {
	if _, err := CgroupSupport(); err != nil {
		t.Skipf("no writable cgroup hierarchy here (%v): no job cgroups, no reaper", err)
	}
	start := startReaperStandIn
	gone := func(dir string) bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	}
	reaperExited := func(r *reaperClient) chan struct{} {
		c := make(chan struct{})
		go func() { r.done(); close(c) }()
		return c
	}

	t.Run("both watchers dead", func(t *testing.T) {
		g, sup, r, child := start(t)
		_ = sup.Process.Kill()
		_ = sup.Wait() // the client reaps it, then "dies": its pipe ends
		select {
		case <-reaperExited(r):
		case <-time.After(10 * time.Second):
			t.Fatal("reaper still running 10s after both watchers were gone")
		}
		if launchertest.Alive([]int{child}) != nil {
			t.Errorf("the supervisor's setsid child %d survives", child)
		}
		if !gone(g.dir) {
			t.Errorf("cgroup %s left behind", g.dir)
		}
	})
	t.Run("supervisor still ending the job", func(t *testing.T) {
		g, sup, r, child := start(t)
		done := reaperExited(r)
		select {
		case <-done:
			t.Fatal("reaper ended while the supervisor was alive")
		case <-time.After(300 * time.Millisecond):
		}
		if launchertest.Alive([]int{child}) == nil {
			t.Fatal("reaper killed the job under a live supervisor")
		}
		_ = sup.Process.Kill()
		_ = sup.Wait()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("reaper still running 10s after the supervisor died")
		}
		if launchertest.Alive([]int{child}) != nil || !gone(g.dir) {
			t.Errorf("after the supervisor died: child alive %v, cgroup gone %v", launchertest.Alive([]int{child}) != nil, gone(g.dir))
		}
	})
	t.Run("supervisor stopped, client dead", func(t *testing.T) {
		// A stopped supervisor can end nothing, and with its client gone
		// nobody will continue it: the reaper must not wait for it.
		g, sup, r, child := start(t)
		if err := sup.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if !launchertest.WaitFor(5*time.Second, func() bool { return procState(sup.Process.Pid) == 'T' }) {
			t.Fatal("the stand-in supervisor never showed as stopped")
		}
		select {
		case <-reaperExited(r):
		case <-time.After(10 * time.Second):
			_ = sup.Process.Signal(syscall.SIGCONT)
			t.Fatal("reaper still waiting 10s after its client was gone, for a stopped supervisor")
		}
		if launchertest.Alive([]int{child}) != nil {
			t.Errorf("the supervisor's setsid child %d survives", child)
		}
		if !gone(g.dir) {
			t.Errorf("cgroup %s left behind", g.dir)
		}
		// The stopped supervisor goes too (it was in the cgroup).
		if err := sup.Wait(); err == nil {
			t.Error("the stopped supervisor exited 0; want it killed")
		}
	})
	t.Run("released by the client", func(t *testing.T) {
		g, sup, r, child := start(t)
		// The client's own release: kill and remove, then tell the reaper.
		if _, err := g.remove(); err != nil {
			t.Fatal(err)
		}
		_ = sup.Wait()
		t0 := time.Now()
		r.done()
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("reaper took %v to exit after the release", d)
		}
		if launchertest.Alive([]int{child}) != nil {
			t.Errorf("child %d survives the release", child)
		}
	})
}

// startReaperStandIn starts a stand-in supervisor (a shell moved into a new
// job cgroup before it forks, whose child leaves its session) and its
// reaper; it returns them and the child's pid, all removed at cleanup.
func startReaperStandIn(t *testing.T) (*jobCgroup, *exec.Cmd, *reaperClient, int) {
	g, err := newJobCgroup("reapertest")
	if err != nil {
		t.Fatal(err)
	}
	// The stand-in supervisor: a shell in the cgroup (moved there
	// before it forks) whose child leaves its session.
	sup := exec.Command("/bin/sh", "-c", "read x; setsid sleep 3600 & echo $!; exec sleep 3600")
	in, err := sup.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := sup.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.add(sup.Process.Pid); err != nil {
		t.Fatal(err)
	}
	in.Write([]byte("go\n"))
	var b [32]byte
	n, _ := out.Read(b[:])
	var child int
	for _, c := range b[:n] {
		if c >= '0' && c <= '9' {
			child = child*10 + int(c-'0')
		}
	}
	r, err := startReaper("", g, sup.Process.Pid, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(child, syscall.SIGKILL)
		_ = sup.Process.Kill()
		_ = sup.Wait()
		r.done()
		_, _ = g.remove()
	})
	return g, sup, r, child
}
