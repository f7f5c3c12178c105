package security

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// Shared by the tests: the second user, the binaries it can execute, and
// two namespace hosts.
var (
	attacker string // the second user's name; "" when not created
	binDir   string // 0755: gorun and a copy of this test binary
	gorunBin string
	selfBin  string
	setupErr error
	hosts    *testhosts.Netns
	hostsErr error
)

func TestMain(m *testing.M) {
	maybeHelper()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if testing.Short() || os.Geteuid() != 0 {
		return m.Run() // every test skips
	}
	dir, err := os.MkdirTemp("", "gorun-security-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	setupErr = setUp(dir)
	if attacker != "" {
		defer func() {
			if out, err := exec.Command("userdel", attacker).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "userdel %s: %v %s\n", attacker, err, out)
			}
		}()
	}
	hosts, hostsErr = testhosts.StartNetns(context.Background(), 2)
	if hosts != nil {
		defer hosts.Close()
	}
	return m.Run()
}

// setUp builds gorun, copies this binary where the second user can run it,
// and creates that user (a system account without a home or a login).
func setUp(dir string) error {
	binDir = filepath.Join(dir, "bin")
	if err := os.Mkdir(binDir, 0o755); err != nil {
		return err
	}
	for _, d := range []string{dir, binDir} {
		if err := os.Chmod(d, 0o755); err != nil {
			return err
		}
	}
	gorunBin = filepath.Join(binDir, "gorun")
	if err := launchertest.GoBuild(binDir, "cmd/gorun"); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	selfBin = filepath.Join(binDir, "security.test")
	if err := copyFile(self, selfBin); err != nil {
		return err
	}
	name := fmt.Sprintf("gorunsec%d", os.Getpid()%100000)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
		"--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		return fmt.Errorf("useradd %s: %v %s", name, err, out)
	}
	attacker = name
	return nil
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// requireSetUp skips without root and fails when the set-up failed.
func requireSetUp(t *testing.T) {
	t.Helper()
	switch {
	case testing.Short():
		t.Skip("skipping: the attacks need a second user and seconds (-short)")
	case os.Geteuid() != 0:
		t.Skip("skipping: creating the second user needs root")
	case setupErr != nil:
		t.Fatal(setupErr)
	}
}

func requireHosts(t *testing.T) *testhosts.Netns {
	t.Helper()
	requireSetUp(t)
	if hostsErr != nil {
		var ue *testhosts.UnsupportedError
		if errors.As(hostsErr, &ue) {
			t.Skipf("skipping: %v", hostsErr)
		}
		t.Fatal(hostsErr)
	}
	return hosts
}

// attack starts the attacker as the second user, inside netns when it is
// not "", and returns a function that waits for it and returns its output.
func attack(t *testing.T, netns string, args ...string) func() string {
	t.Helper()
	argv := append([]string{"runuser", "-u", attacker, "--", "env", modeEnv + "=attack", selfBin}, args...)
	if netns != "" {
		argv = append([]string{"ip", "netns", "exec", netns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	wait := func() string {
		once.Do(func() {
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(90 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
		return out.String()
	}
	t.Cleanup(func() { wait() })
	return wait
}

// job is one gorun run whose ranks are this binary's rank helper.
type job struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	goFile         string
	done           chan struct{}
	err            error
}

func startJob(t *testing.T, args ...string) *job {
	t.Helper()
	j := &job{t: t, goFile: filepath.Join(t.TempDir(), "go"), done: make(chan struct{})}
	a := append([]string{"--grace", "3s", "-x", modeEnv + "=rank", "-x", goFileEnv + "=" + j.goFile,
		"-x", "GORACE=atexit_sleep_ms=0"}, args...)
	a = append(a, selfBin)
	j.cmd = exec.Command(gorunBin, a...)
	j.cmd.Stdout, j.cmd.Stderr = &j.stdout, &j.stderr
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { j.err = j.cmd.Wait(); close(j.done) }()
	t.Cleanup(func() {
		select {
		case <-j.done:
		default:
			_ = j.cmd.Process.Kill()
			<-j.done
		}
	})
	return j
}

// ready waits until n ranks reported their data port, and returns each
// rank's address and pid, by rank.
func (j *job) ready(n int) (addrs []string, pids []int) {
	j.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		addrs, pids = make([]string, n), make([]int, n)
		got := 0
		for _, line := range strings.Split(j.stdout.String(), "\n") {
			f := strings.Fields(line)
			if len(f) == 4 && f[0] == "DATA" {
				r, _ := strconv.Atoi(f[1])
				pid, _ := strconv.Atoi(f[3])
				if r >= 0 && r < n && addrs[r] == "" {
					addrs[r], pids[r] = f[2], pid
					got++
				}
			}
		}
		if got == n {
			return addrs, pids
		}
		select {
		case <-j.done:
			j.t.Fatalf("gorun ended before the ranks were ready: %v\nstdout:\n%s\nstderr:\n%s", j.err, j.stdout.String(), j.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	j.t.Fatalf("not all of %d ranks ready after 60 s\nstdout:\n%s\nstderr:\n%s", n, j.stdout.String(), j.stderr.String())
	return nil, nil
}

// finish releases the ranks and checks that every one reports the right
// all-reduce result and gorun exits 0.
func (j *job) finish(n int) {
	j.t.Helper()
	if err := os.WriteFile(j.goFile, nil, 0o644); err != nil {
		j.t.Fatal(err)
	}
	select {
	case <-j.done:
	case <-time.After(90 * time.Second):
		j.t.Fatalf("job did not end within 90 s\nstderr:\n%s", j.stderr.String())
	}
	want := float64(n * (n + 1) / 2)
	if got := strings.Count(j.stdout.String(), fmt.Sprintf(" ok %v\n", want)); j.err != nil || got != n {
		j.t.Fatalf("gorun: %v, %d of %d ranks report the right sum %v\nstdout:\n%s\nstderr:\n%s", j.err, got, n, want, j.stdout.String(), j.stderr.String())
	}
}

// fds is how many descriptors pid holds.
func fds(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// rssKiB is pid's resident set.
func rssKiB(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// syncBuffer is shared with the other process tests.
type syncBuffer = launchertest.SyncBuffer
