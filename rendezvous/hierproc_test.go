package rendezvous

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/rankenv"
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
	seed := fmt.Sprintf("127.0.0.1:%d", freePort(t))
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
	seed := fmt.Sprintf("127.0.0.1:%d", freePort(t))
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
