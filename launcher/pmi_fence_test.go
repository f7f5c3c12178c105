package launcher

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// fenceNodes is hosts nodes h0, h1, ... of perHost ranks each.
func fenceNodes(hosts, perHost int) []plan.Node {
	var nodes []plan.Node
	for h := range hosts {
		nodes = append(nodes, plan.Node{Name: fmt.Sprintf("h%d", h), Ranks: perHost, FirstRank: h * perHost})
	}
	return nodes
}

// fenceBytes runs one PMI exchange over hosts × perHost ranks through the
// launcher's own parts: a supervisor.PMI per host (the real pmi servers,
// over socketpairs), pmiFences for gorun's side, and every command gorun
// sends encoded as it travels to a host agent. Each rank puts a business
// card, enters the barrier, and then gets the cards of the ranks with its
// local index on the next and the previous host (a program that talks to
// its peers on other hosts only, as a rail-aligned all-reduce does, with an
// MPI that connects on first use). It returns the bytes gorun sent to each
// host for that barrier: the release and the answers to the host's gets.
func fenceBytes(t *testing.T, hosts, perHost int) []int {
	t.Helper()
	size := hosts * perHost
	counts := make([]int, hosts)
	for i := range counts {
		counts[i] = perHost
	}
	plan := &Plan{PMI: true, JobID: "fence", WorldSize: size, Nodes: fenceNodes(hosts, perHost)}
	job, err := pmiJobFor(plan, PMIFD)
	if err != nil {
		t.Fatal(err)
	}
	sps := make([]*supervisor.PMI, hosts)
	for h := range hosts {
		var ranks []wire.SupervisorRank
		for r := h * perHost; r < (h+1)*perHost; r++ {
			ranks = append(ranks, wire.SupervisorRank{Rank: r})
		}
		if sps[h], err = supervisor.NewPMI(*job, ranks, zerolog.Nop()); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, sp := range sps {
			sp.Close()
		}
	}()

	// gorun's event loop, reduced to its PMI cases: every host's
	// requests become events; the commands are counted and applied.
	type hostEvent struct {
		host int
		ev   wire.Event
	}
	events := make(chan hostEvent)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	for h, sp := range sps {
		wg.Go(func() {
			for {
				select {
				case req, ok := <-sp.Requests():
					if !ok {
						return
					}
					select {
					case events <- hostEvent{h, sp.Event(req)}:
					case <-quit:
						return
					}
				case <-quit:
					return
				}
			}
		})
	}
	sent := make([]int, hosts)
	send := func(h int, c wire.Cmd) {
		b, err := json.Marshal(wire.Msg{T: "cmd", Cmd: &c})
		if err != nil {
			t.Error(err)
		}
		sent[h] += len(b) + 5 // the frame header
		switch c.Op {
		case "pmi-release":
			sps[h].Release(c, zerolog.Nop())
		case "pmi-value":
			sps[h].Answer(c, zerolog.Nop())
		}
	}
	fences := pmiFences{hosts: hosts}
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		for {
			select {
			case he := <-events:
				switch he.ev.Ev {
				case "pmi-fence":
					cmd, ok, err := fences.add(he.ev)
					if err != nil {
						t.Error(err)
					}
					if ok {
						for h := range hosts {
							send(h, cmd)
						}
					}
				case "pmi-get":
					send(he.host, fences.get(he.ev))
				}
			case <-quit:
				return
			}
		}
	}()

	var ranks sync.WaitGroup
	card := strings.Repeat("c", 96) // an MPICH business card is ~100 bytes
	for h, sp := range sps {
		for r := h * perHost; r < (h+1)*perHost; r++ {
			f, _ := sp.RankSetup(r, nil)
			c, err := net.FileConn(f)
			if err != nil {
				t.Fatal(err)
			}
			sp.Started(r)
			ranks.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				do := func(req string) string {
					if _, err := c.Write([]byte(req + "\n")); err != nil {
						t.Errorf("rank %d: %v", r, err)
						return ""
					}
					line, err := br.ReadString('\n')
					if err != nil {
						t.Errorf("rank %d: reply to %q: %v", r, req, err)
					}
					return strings.TrimSpace(line)
				}
				do("cmd=init pmi_version=1 pmi_subversion=1")
				do(fmt.Sprintf("cmd=put kvsname=%s key=card-%d value=%s-%d", job.KVSName, r, card, r))
				do("cmd=barrier_in")
				for _, peer := range []int{(r + perHost) % size, (r + size - perHost) % size} {
					got := do(fmt.Sprintf("cmd=get kvsname=%s key=card-%d", job.KVSName, peer))
					if want := fmt.Sprintf("value=%s-%d", card, peer); !strings.Contains(got, want) {
						t.Errorf("rank %d: get of rank %d's card: %q", r, peer, got)
					}
				}
				// A key nobody put is reported missing, not waited for.
				if got := do(fmt.Sprintf("cmd=get kvsname=%s key=nobody-%d", job.KVSName, r)); !strings.Contains(got, "rc=-1") {
					t.Errorf("rank %d: get of a key nobody put: %q", r, got)
				}
				do("cmd=finalize")
			})
		}
	}
	ranks.Wait()
	close(quit)
	<-loopDone
	wg.Wait()
	return sent
}

// TestPMIFenceBytesFollowRanksPerHost: what gorun sends a host for one
// PMI barrier grows with the ranks on that host (the keys they read), not
// with the job. Sending every host the union of all puts, 32 hosts of 4
// ranks would cost each host 8 times what 4 hosts of 4 do.
func TestPMIFenceBytesFollowRanksPerHost(t *testing.T) {
	most := func(b []int) int {
		m := 0
		for _, v := range b {
			m = max(m, v)
		}
		return m
	}
	small := most(fenceBytes(t, 4, 4))  // 16 ranks
	wide := most(fenceBytes(t, 32, 4))  // 128 ranks, same ranks per host
	dense := most(fenceBytes(t, 4, 16)) // 64 ranks, 4× the ranks per host
	t.Logf("bytes to the busiest host per barrier: 4×4 %d, 32×4 %d, 4×16 %d", small, wide, dense)
	if small == 0 {
		t.Fatal("no bytes counted")
	}
	// Answers come in batches (a host's puts of the barrier): a get in
	// flight when its batch arrives costs one more short answer, at most
	// one per rank of the host, whatever the job's size; hence the margin.
	if wide > small*3/2 {
		t.Errorf("32 hosts × 4 ranks: %d bytes per host per barrier, 4 hosts × 4: %d; it grew with the job (8× the ranks), not with the ranks per host", wide, small)
	}
	if dense < small*3 {
		t.Errorf("4 hosts × 16 ranks: %d bytes per host, 4 × 4: %d; 4× the ranks reading 4× the keys should cost about 4× as much", dense, small)
	}
}
