package multihost

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous"
)

// rdzvHelperEnv makes the test binary a rank that forms its world from the
// environment (gorun's variables, or SLURM's under a direct srun), passes a
// barrier and prints "barrier RANK/SIZE on HOST".
const rdzvHelperEnv = "GORUN_MULTIHOST_RDZV"

// maybeRdzvRank runs the rendezvous rank when asked to; called first thing
// in TestMain.
func maybeRdzvRank() {
	if os.Getenv(rdzvHelperEnv) == "" {
		return
	}
	os.Exit(rdzvRank())
}

func rdzvRank() int {
	cfg, err := rendezvous.ConfigFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rank:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w, err := rendezvous.Join(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rank: join:", err)
		return 3
	}
	defer w.Close()
	if err := w.Barrier(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "rank: barrier:", err)
		return 4
	}
	host, _ := os.Hostname()
	fmt.Printf("barrier %d/%d on %s\n", w.Rank(), w.Size(), host)
	return 0
}

// Ranks launched by gorun across the namespace hosts form one world over
// the addresses gorun chose (GORUN_RDZV_ENDPOINT on rank 0's host) and
// pass a barrier.
func TestRendezvousAcrossHosts(t *testing.T) {
	h := requireHosts(t)
	// rdzvHelperEnv takes over before any launchertest mode is looked at.
	j := newJob(t, h, 2, "none", nil, "-x", rdzvHelperEnv+"=1")
	if code := j.run(); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, j.stdout.String(), j.stderr.String())
	}
	for r := range 8 {
		if want := fmt.Sprintf("barrier %d/8 on %s\n", r, h.Hosts[r/2]); !strings.Contains(j.stdout.String(), want) {
			t.Errorf("missing %q\nstdout:\n%s\nstderr:\n%s", want, j.stdout.String(), j.stderr.String())
		}
	}
	j.noSurvivors()
}

// Hosts of unequal size (2, 1, 1, 2 slots) form one world: the hosts of
// one rank gossip without host leaders of their own and must still learn
// the ranks attached to the others' leaders (they never did: the job sat
// in formation until its timeout).
func TestRendezvousUnevenHosts(t *testing.T) {
	h := requireHosts(t)
	slots := []int{2, 1, 1, 2}
	var b strings.Builder
	var hostOf []string
	for i, host := range h.Hosts {
		fmt.Fprintf(&b, "%s slots=%d\n", host, slots[i])
		for range slots[i] {
			hostOf = append(hostOf, host)
		}
	}
	hf := filepath.Join(t.TempDir(), "hostfile")
	if err := os.WriteFile(hf, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	j := newJobOn(t, h, hf, "none", nil, "-x", rdzvHelperEnv+"=1")
	if code := j.run(); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, j.stdout.String(), j.stderr.String())
	}
	for r, host := range hostOf {
		if want := fmt.Sprintf("barrier %d/%d on %s\n", r, len(hostOf), host); !strings.Contains(j.stdout.String(), want) {
			t.Errorf("missing %q\nstdout:\n%s\nstderr:\n%s", want, j.stdout.String(), j.stderr.String())
		}
	}
	j.noSurvivors()
}

// A direct `srun -n 4` of a rank program, without gorun: the ranks form
// their world from SLURM's variables and pass a barrier.
func TestDirectSrunFormsWorld(t *testing.T) {
	s := requireSlurm(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := s.Command(ctx, "srun", "-n", "4", exe)
	cmd.Env = append(cmd.Env, rdzvHelperEnv+"=1", "GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("srun -n 4: %v\n%s", err, out)
	}
	for r := range 4 {
		if want := fmt.Sprintf("barrier %d/4 on ", r); !strings.Contains(string(out), want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}
