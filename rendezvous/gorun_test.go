package rendezvous

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildGorun builds cmd/gorun once per test binary run.
func buildGorun(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs gorun")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build gorun")
	}
	bin := filepath.Join(t.TempDir(), "gorun")
	cmd := exec.Command(goTool, "build", "-o", bin, "../cmd/gorun")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build gorun: %v\n%s", err, out)
	}
	return bin
}

// The real launcher: `gorun -np 8` of the test binary as the rank program
// forms one world, runs a barrier, and every rank exits 0.
func TestThroughGorun(t *testing.T) {
	gorun := buildGorun(t)
	const n = 8
	cmd := exec.Command(gorun, "-np", "8", "--timeout", "60s", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"=barrier")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gorun: %v\n%s", err, out)
	}
	t.Logf("gorun -np %d form + barrier + leave: %v", n, time.Since(start))
	worlds, barriers := 0, 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "world rank=") {
			worlds++
			if !strings.Contains(l, "size=8 epoch=1") {
				t.Errorf("line %q", l)
			}
		}
		if strings.Contains(l, "barrier ok") {
			barriers++
		}
	}
	if worlds != n || barriers != n {
		t.Fatalf("%d world lines, %d barriers; output:\n%s", worlds, barriers, out)
	}
}

// Through gorun, SIGKILL one rank: every other rank reports the loss, naming
// rank and host, and exits with an error; gorun reports the killed rank.
func TestThroughGorunKilledRank(t *testing.T) {
	gorun := buildGorun(t)
	const n, victim = 6, 4
	cmd := exec.Command(gorun, "-np", strconv.Itoa(n), "--grace", "20s", "--timeout", "90s", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"=wait-term")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := regexp.MustCompile(`ready rank=(\d+) pid=(\d+)`)
	failed := regexp.MustCompile(`failed at=\d+ err=(.*)`)
	sc := bufio.NewScanner(stdout)
	seen, reports := 0, 0
	var out strings.Builder
	for sc.Scan() {
		l := sc.Text()
		out.WriteString(l + "\n")
		if m := ready.FindStringSubmatch(l); m != nil {
			if seen++; seen == n {
				// Every rank is in the world; kill rank victim.
				for _, l := range strings.Split(out.String(), "\n") {
					if m := ready.FindStringSubmatch(l); m != nil && m[1] == strconv.Itoa(victim) {
						pid, _ := strconv.Atoi(m[2])
						if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		}
		if m := failed.FindStringSubmatch(l); m != nil {
			reports++
			if !strings.Contains(m[1], "rendezvous: rank 4 (host ") || !strings.Contains(m[1], ") lost") {
				t.Errorf("report %q", m[1])
			}
		}
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Errorf("gorun: %v, want a failure", err)
	}
	if reports != n-1 {
		t.Errorf("%d of %d survivors reported the loss; stdout:\n%s\nstderr:\n%s", reports, n-1, out.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), "rank 4") {
		t.Errorf("gorun did not name rank 4:\n%s", stderr.String())
	}
	t.Logf("gorun: %v; %s", err, strings.TrimSpace(stderr.String()))
}
