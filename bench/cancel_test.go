package bench

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// sweep is a `gorun -np 2 gorun bench` job whose sweep would run for hours
// (one size, a billion calls), with a grace period long enough that a rank
// that ignores its SIGTERM shows.
type sweep struct {
	cmd            *exec.Cmd
	stdout, stderr launchertest.SyncBuffer
	done           chan struct{}
	err            error
	ranks          []int
}

func startSweep(t *testing.T) *sweep {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds and launches gorun")
	}
	bin, err := gorunBinary()
	if err != nil {
		t.Fatal(err)
	}
	s := &sweep{done: make(chan struct{})}
	s.cmd = exec.Command(bin, "-np", "2", "--grace", "30s", bin, "bench", "allreduce",
		"-b", "8", "-e", "8", "-w", "0", "-n", "1000000000")
	s.cmd.Stdout, s.cmd.Stderr = &s.stdout, &s.stderr
	s.cmd.WaitDelay = 5 * time.Second
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		for _, pid := range s.ranks {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		select {
		case <-s.done:
		default:
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
	// The ranks are the processes running `bin bench ...` (gorun's own
	// command line has "-np" second); wait until both run and rank 0
	// printed its table header, so the sweep is under way.
	deadline := time.Now().Add(60 * time.Second)
	for len(s.ranks) < 2 || !strings.Contains(s.stdout.String(), "redop") {
		if time.Now().After(deadline) {
			t.Fatalf("ranks not running after 60 s (found %v)\nstdout:\n%s\nstderr:\n%s", s.ranks, &s.stdout, &s.stderr)
		}
		select {
		case <-s.done:
			t.Fatalf("gorun ended before the sweep: %v\nstderr:\n%s", s.err, &s.stderr)
		case <-time.After(50 * time.Millisecond):
		}
		s.ranks = benchRanks(bin)
	}
	time.Sleep(500 * time.Millisecond) // well into the timed loop
	return s
}

// waitEnd waits up to limit for gorun to end and returns how long it took
// from since.
func (s *sweep) waitEnd(t *testing.T, since time.Time, limit time.Duration) time.Duration {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(limit - time.Since(since)):
		t.Fatalf("gorun still runs %v after the fault\nstderr:\n%s", limit, &s.stderr)
	}
	if s.cmd.ProcessState.ExitCode() == 0 {
		t.Errorf("gorun exited 0 after a rank failed mid-sweep\nstderr:\n%s", &s.stderr)
	}
	return time.Since(since)
}

// A healthy bench rank that gets SIGTERM stops at once, even mid-sweep with
// every peer healthy: the collectives of a healthy world complete without
// looking at the context, so the iteration loop itself must. The rank's
// peer then loses it and the job ends within seconds, not at the end of a
// billion iterations.
func TestEndToEndSIGTERMStopsARank(t *testing.T) {
	s := startSweep(t)
	rank := s.ranks[len(s.ranks)-1]
	sent := time.Now()
	if err := syscall.Kill(rank, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for alive(rank) {
		if time.Since(sent) > 5*time.Second {
			t.Fatalf("the SIGTERMed rank (pid %d) still runs its sweep %v later\nstderr:\n%s", rank, time.Since(sent), &s.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopped := time.Since(sent)
	t.Logf("SIGTERMed rank stopped in %v, job ended in %v", stopped, s.waitEnd(t, sent, 20*time.Second))
}

// A frozen (SIGSTOPped) bench rank is named after the lease and its healthy
// peer, terminated, stops at once: the job ends in about the lease (4 s),
// not after the 30 s grace that a peer ignoring its SIGTERM would cost.
func TestEndToEndFrozenRankEndsSweep(t *testing.T) {
	s := startSweep(t)
	rank := s.ranks[len(s.ranks)-1]
	sent := time.Now()
	if err := syscall.Kill(rank, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	took := s.waitEnd(t, sent, 20*time.Second)
	t.Logf("job with a frozen rank ended in %v", took)
	if !strings.Contains(s.stderr.String(), "frozen") {
		t.Errorf("gorun's stderr does not name the frozen rank:\n%s", &s.stderr)
	}
}

// alive reports whether pid exists and has not exited.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !bytes.Contains(b, []byte(") Z "))
}

// benchRanks returns the pids of processes running `bin bench ...`.
func benchRanks(bin string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		a := strings.Split(string(b), "\x00")
		if len(a) > 2 && a[0] == bin && a[1] == "bench" {
			out = append(out, pid)
		}
	}
	return out
}
