package rendezvous

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
