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
	g := startFenceGorun(t, sps)
	runFenceRanks(t, sps, job.KVSName, perHost)
	return g.stop()
}

// fenceGorun is gorun's event loop reduced to its PMI cases: every host's
// requests become events; the commands are counted (sent, per host) and
// applied.
type fenceGorun struct {
	quit     chan struct{}
	relays   sync.WaitGroup
	loopDone chan struct{}
	sent     []int
}

// startFenceGorun starts one relay per host and the loop; stop ends them.
func startFenceGorun(t *testing.T, sps []*supervisor.PMI) *fenceGorun {
	type hostEvent struct {
		host int
		ev   wire.Event
	}
	hosts := len(sps)
	g := &fenceGorun{quit: make(chan struct{}), loopDone: make(chan struct{}), sent: make([]int, hosts)}
	events := make(chan hostEvent)
	for h, sp := range sps {
		g.relays.Go(func() {
			for {
				select {
				case req, ok := <-sp.Requests():
					if !ok {
						return
					}
					select {
					case events <- hostEvent{h, sp.Event(req)}:
					case <-g.quit:
						return
					}
				case <-g.quit:
					return
				}
			}
		})
	}
	send := func(h int, c wire.Cmd) {
		b, err := json.Marshal(wire.Msg{T: "cmd", Cmd: &c})
		if err != nil {
			t.Error(err)
		}
		g.sent[h] += len(b) + 5 // the frame header
		switch c.Op {
		case "pmi-release":
			sps[h].Release(c, zerolog.Nop())
		case "pmi-value":
			sps[h].Answer(c, zerolog.Nop())
		}
	}
	fences := pmiFences{hosts: hosts}
	go func() {
		defer close(g.loopDone)
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
			case <-g.quit:
				return
			}
		}
	}()
	return g
}

// stop ends the loop and the relays and returns the bytes sent per host.
func (g *fenceGorun) stop() []int {
	close(g.quit)
	<-g.loopDone
	g.relays.Wait()
	return g.sent
}

// runFenceRanks plays every rank of the PMI servers sps, perHost ranks a
// host, over its socket: put a card, enter the barrier, get the cards of
// the same local rank on the next and the previous host and a key nobody
// put, finalize. It returns when every rank is done.
func runFenceRanks(t *testing.T, sps []*supervisor.PMI, kvs string, perHost int) {
	size := len(sps) * perHost
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
				do(fmt.Sprintf("cmd=put kvsname=%s key=card-%d value=%s-%d", kvs, r, card, r))
				do("cmd=barrier_in")
				for _, peer := range []int{(r + perHost) % size, (r + size - perHost) % size} {
					got := do(fmt.Sprintf("cmd=get kvsname=%s key=card-%d", kvs, peer))
					if want := fmt.Sprintf("value=%s-%d", card, peer); !strings.Contains(got, want) {
						t.Errorf("rank %d: get of rank %d's card: %q", r, peer, got)
					}
				}
				// A key nobody put is reported missing, not waited for.
				if got := do(fmt.Sprintf("cmd=get kvsname=%s key=nobody-%d", kvs, r)); !strings.Contains(got, "rc=-1") {
					t.Errorf("rank %d: get of a key nobody put: %q", r, got)
				}
				do("cmd=finalize")
			})
		}
	}
	ranks.Wait()
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
	// Answers come in batches (a host's puts of the barrier): a get in
	// flight when its batch arrives costs one more answer, at most one per
	// rank of the host, whatever the job's size. How many do depends on
	// timing (4×4 costs 1,317 bytes on a quiet machine, 1,744 under load
	// and -race: four more answers), so each shape runs three times and its
	// least is compared.
	least := func(hosts, perHost int) int {
		m := 0
		for i := range 3 {
			if b := most(fenceBytes(t, hosts, perHost)); i == 0 || b < m {
				m = b
			}
		}
		return m
	}
	small := least(4, 4)  // 16 ranks
	wide := least(32, 4)  // 128 ranks, same ranks per host
	dense := least(4, 16) // 64 ranks, 4× the ranks per host
	t.Logf("bytes to the busiest host per barrier: 4×4 %d, 32×4 %d, 4×16 %d", small, wide, dense)
	if small == 0 {
		t.Fatal("no bytes counted")
	}
	// Races that every run of a shape still met are what the margins are
	// for: at worst one shape pays all its extra answers and the other
	// none (4×4 at 1,744 against 4×16 at 4,723 is 2.7×).
	if wide > small*3/2 {
		t.Errorf("32 hosts × 4 ranks: %d bytes per host per barrier, 4 hosts × 4: %d; it grew with the job (8× the ranks), not with the ranks per host", wide, small)
	}
	if dense < small*5/2 {
		t.Errorf("4 hosts × 16 ranks: %d bytes per host, 4 × 4: %d; 4× the ranks reading 4× the keys should cost about 4× as much", dense, small)
	}
}
