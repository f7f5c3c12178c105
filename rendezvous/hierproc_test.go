package rendezvous

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/rankenv"
	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

// hierEnv is what gorun gives rank r of n with per ranks on each host
// "host<r/per>": host leaders are on (GORUN_LOCAL_WORLD_SIZE > 1).
func hierEnv(job, seed string, r, n, per int) []string {
	env := rankEnv(job, seed, hexSecret, r, n)
	return append(env,
		rankenv.GorunLocalRank+"="+strconv.Itoa(r%per), rankenv.GorunLocalSize+"="+strconv.Itoa(per),
		rankenv.GorunHost+"=host"+strconv.Itoa(r/per))
}

// uniqueJob keeps the abstract attach sockets of concurrent test runs apart.
func uniqueJob(name string) string {
	return fmt.Sprintf("%s-%d-%d", name, pid, time.Now().UnixNano())
}

// Host leaders with real processes and Unix sockets: two "hosts" of four
// ranks form, barrier, and leave without anyone reporting a loss.
func TestProcessesHierAttachDetach(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const n, per = 8, 4
	seed := rendezvoustest.FreeSeed(t)
	job := uniqueJob("hier")
	procs := make([]*proc, n)
	for r := range procs {
		procs[r] = startRank(t, "barrier", hierEnv(job, seed, r, n, per))
	}
	for r, p := range procs {
		line := p.waitLine(t, "world ")
		if !strings.Contains(line, "size=8 epoch=1 hosts=host0,host0,host0,host0,host1,host1,host1,host1") {
			t.Errorf("rank %d printed %q", r, line)
		}
		p.waitLine(t, "barrier ok")
	}
	for r, p := range procs {
		if code := p.wait(t); code != 0 {
			t.Errorf("rank %d exit %d:\n%s", r, code, p.output())
		}
		if out := p.output(); strings.Contains(out, "lost") {
			t.Errorf("rank %d reported a loss at a normal exit:\n%s", r, out)
		}
	}
}

// killHier starts hosts of per "wait" ranks, SIGKILLs victim and checks
// that every survivor reports want (a rank and its host) and exits 3.
func killHier(t *testing.T, n, per, victim int, want string) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	seed := rendezvoustest.FreeSeed(t)
	job := uniqueJob("hierkill")
	procs := make([]*proc, n)
	for r := range procs {
		procs[r] = startRank(t, "wait", hierEnv(job, seed, r, n, per))
	}
	worst := killRank(t, procs, victim, want)
	t.Logf("slowest report of SIGKILLed rank %d: %v", victim, worst)
}

// SIGKILL an attached rank: its socket closes at once, its leader reports
// it to everyone, every survivor names it.
func TestProcessesHierAttachedKilled(t *testing.T) {
	killHier(t, 6, 3, 4, "rendezvous: rank 4 (host host1) lost")
}

// SIGKILL a leader: the ranks of its host fail naming it (their socket
// closed), the other hosts find it dead by gossip and name it too.
func TestProcessesHierLeaderKilled(t *testing.T) {
	killHier(t, 6, 3, 3, "rendezvous: rank 3 (host host1) lost")
}

// SIGKILL an attached rank of a host whose leader exits the moment it
// learns of the loss, without closing its World (as a C rank returning
// from main on the error does): the host's other attached ranks must
// still name the killed rank, not their leader. The leader's news of the
// loss is written to their streams before the loss is visible to the
// leader's own program (World.publishLocked); without that, the leader's
// exit often closed the stream before its writer ran, and rank 1 named
// rank 0 (seen in CI as libgorun's TestABIFromC/killed-rank). Several
// rounds, since each is a race the fix must win every time.
func TestProcessesHierLeaderExitsOnLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const n, victim, rounds = 4, 3, 5
	for round := range rounds {
		seed := rendezvoustest.FreeSeed(t)
		job := uniqueJob("hierexit")
		procs := make([]*proc, n)
		for r := range procs {
			procs[r] = startRank(t, "wait-exit", hierEnv(job, seed, r, n, n))
		}
		killRank(t, procs, victim, fmt.Sprintf("rendezvous: rank %d (host host0) lost", victim))
		if t.Failed() {
			t.Fatalf("round %d of %d: a survivor did not name the killed rank", round+1, rounds)
		}
	}
}

// freezeHier starts one host of n "wait" ranks (the hard case: every
// rank on one host, so no gossip member watches the others), SIGSTOPs
// victim and checks that every survivor names it as frozen within the
// attach lease (2 s here) plus a generous margin for a shared machine.
func freezeHier(t *testing.T, n, victim int) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const lease = 2 * time.Second
	seed := rendezvoustest.FreeSeed(t)
	job := uniqueJob("hierfreeze")
	procs := make([]*proc, n)
	for r := range procs {
		procs[r] = startRank(t, "wait", append(hierEnv(job, seed, r, n, n), EnvRdzvLease+"="+lease.String()))
	}
	want := fmt.Sprintf("rendezvous: rank %d (host host0) lost: frozen or unresponsive", victim)
	worst := signalRank(t, procs, victim, syscall.SIGSTOP, want)
	t.Logf("slowest report of SIGSTOPped rank %d: %v (lease %v)", victim, worst, lease)
	if worst < lease/2 {
		t.Errorf("a survivor named the frozen rank after %v, before half the %v lease: not the lease that found it", worst, lease)
	}
	if worst > 5*lease {
		t.Errorf("slowest survivor named the frozen rank after %v, lease %v", worst, lease)
	}
}

// SIGSTOP an attached rank: its socket stays open; its leader finds it
// silent past the lease and every other rank names it.
func TestProcessesHierAttachedFrozen(t *testing.T) { freezeHier(t, 4, 2) }

// SIGSTOP the host leader of a one-host job: no gossip member is left to
// notice, each attached rank finds it silent past the lease.
func TestProcessesHierLeaderFrozen(t *testing.T) { freezeHier(t, 4, 0) }
