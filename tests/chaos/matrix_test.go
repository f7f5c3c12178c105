package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/gorun-hpc/gorun/internal/netfault"
	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// row is one scenario of the matrix.
type row struct {
	mode   string // "gorun": under gorun on this host; "direct": torch-style, no gorun
	fault  string // the column: kill, stop, slow, drop, delay, corrupt, partition
	phase  string // rank_test.go's phases, or "loop" for faults injected by time
	np     int
	victim int // the rank that suffers the fault (-1: none in particular)
	// inject are gorun --inject specs (gorun mode); netfault the
	// GORUN_NETFAULT of a direct launch.
	inject   []string
	netfault string
	// args are more gorun arguments (e.g. --min-np).
	args []string
	// prog, when set, is the program gorun runs in place of the chaos
	// rank (gorun mode); "GORUN" in it is gorun's binary.
	prog     []string
	restarts int
	run      time.Duration // the rank loop's length (GORUN_CHAOS_RUN)
	env      []string      // more environment for every rank
	// complete: the job must end with exit 0 and every rank's checked
	// result; otherwise it must fail, naming the culprit.
	complete bool
	// lost is how many ranks a completing row's fault takes out for good
	// (a lost host's, in a fault-tolerant job): they report no result.
	lost int
	// cause: what gorun's one-line message must say besides the culprit
	// rank (gorun mode); names: what every survivor's error must name.
	cause []string
	names string
	// alsoBlame lists ranks gorun may name first besides victim (the
	// other end of a dropped link).
	alsoBlame []int
	// bound is the row's time limit: past it the row is a hang.
	bound time.Duration
	// ci marks the covering subset that make test runs.
	ci bool
	// owner names whose fix a row waits for, when it is known to fail
	// today; it is run and reported, never skipped.
	owner string
	// during runs alongside a "hosts" row (a partition made with
	// iptables): it waits for ready (every rank finished its first
	// iteration, so the fault hits a formed world, whatever the load),
	// makes the fault and returns when it is undone, with when the fault
	// began and ended.
	during func(h *testhosts.Netns, ready <-chan struct{}) (cutSpan, error)
	// namedInCut: the job must fail while the fault is in place (named
	// within the lease, not when the cut heals nor at TCP's timeout).
	namedInCut bool
	// code, when nonzero, is gorun's exit status the row wants.
	code int
	// extra checks the output further (e.g. the stall diagnosis naming a
	// slowed rank); it returns violations.
	extra func(out string) []string
}

// heldUp checks that rank 0's longest iteration lasted at least d: the
// fault of a row that completes had its effect (why says what it means
// if not).
func heldUp(d time.Duration, why string) func(out string) []string {
	return func(out string) []string {
		m := regexp.MustCompile(`(?m)^chaos-result rank 0 .* longest (\d+) ms$`).FindStringSubmatch(out)
		if m == nil {
			return []string{"rank 0 reported no result"}
		}
		if ms, _ := strconv.Atoi(m[1]); time.Duration(ms)*time.Millisecond < d {
			return []string{fmt.Sprintf("rank 0's longest iteration was %d ms (want at least %v): %s", ms, d, why)}
		}
		return nil
	}
}

func (r row) name() string {
	s := fmt.Sprintf("%s/%s/%s", r.mode, r.fault, r.phase)
	if r.restarts > 0 {
		s += "/restart"
	}
	for _, e := range r.env {
		if strings.HasPrefix(e, "GORUN_RDZV_FLAT=") {
			s += "/flat"
		}
	}
	if r.victim == 0 {
		s += "/leader"
	}
	return s
}

// outcome is what a row did and which invariants it broke.
type outcome struct {
	took       time.Duration
	end        time.Time     // when gorun exited
	detect     time.Duration // a during fault's start to gorun's exit (0: none)
	exit       string
	culprit    string
	violations []string
}

const defaultBound = 40 * time.Second

// matrix is the chaos matrix: every fault at every phase it applies to.
//
// long: a table, built in loops where rows share a shape; each row's
// comment says why it differs from its neighbours, so it reads best as
// one list.
func matrix() []row {
	killed := []string{"rank 1", "killed by signal 9"}
	var rows []row
	// kill: every phase, under gorun and without it.
	for _, ph := range []string{"launch", "formation", "small", "large", "barrier", "bucket", "shutdown"} {
		rows = append(rows, row{mode: "gorun", fault: "kill", phase: ph, np: 3, victim: 1, cause: killed, names: "rank 1",
			ci: ph == "formation" || ph == "large"})
		if ph != "launch" && ph != "shutdown" {
			d := row{mode: "direct", fault: "kill", phase: ph, np: 3, victim: 1, names: "rank 1", ci: ph == "barrier"}
			if ph == "formation" {
				// A rank that dies before it joined is, to the others,
				// one that has not come yet: without a launcher that saw
				// it die, only the formation timeout ends the wait (as
				// torch's store timeout does), and its error names the
				// rank that never came. Shortened from 120 s.
				d.env = []string{"GORUN_RDZV_TIMEOUT=4s"}
				d.names = "missing 1"
			}
			rows = append(rows, d)
		}
	}
	// kill under --fault-tolerant: the victim is replaced in place and
	// heals, the others never stop, and every replica ends with the same
	// committed results (ftrank_test.go).
	for _, ph := range []string{"small", "large"} {
		rows = append(rows, row{mode: "gorun", fault: "kill", phase: "ft-" + ph, np: 3, victim: 1, args: []string{"--fault-tolerant"},
			run: time.Second, complete: true, extra: healedOnce, ci: ph == "large"})
	}
	// The same across namespace hosts, one rank per host: the quorum
	// service listens beside the agents' listener, and the replacement
	// starts on the dead rank's host.
	rows = append(rows, row{mode: "hosts", fault: "kill", phase: "ft-large", np: 3, victim: 2, args: []string{"--fault-tolerant"},
		run: time.Second, complete: true, extra: healedOnce})
	// A lost host takes only its rank out of a fault-tolerant job: the
	// others go on without it to the end, equal, and nothing is left on
	// any host.
	rows = append(rows, row{mode: "hosts", fault: "kill-host", phase: "ft-large", np: 3, victim: 2, args: []string{"--fault-tolerant"},
		run: 2 * time.Second, inject: []string{"kill-host:host=HOST2:after-steps=2"}, complete: true, lost: 1, extra: survivedLostHost, ci: true})
	// kill with a restart left: the job completes with the right result.
	for _, ph := range []string{"large", "bucket", "formation"} {
		rows = append(rows, row{mode: "gorun", fault: "kill", phase: ph, np: 3, victim: 1, restarts: 1, complete: true, ci: ph == "bucket"})
	}
	// stop (a frozen rank, for good): detected and named within 10 s. In
	// host-leader mode (the default) the attach lease (4 s) finds it;
	// with flat gossip the gossip lease does (also 4 s: silence is judged
	// by the lease, rendezvous/doubt.go).
	frozen := []string{"rank 2", "frozen"}
	for _, ph := range []string{"small", "barrier", "large"} {
		rows = append(rows, row{mode: "gorun", fault: "stop", phase: ph, np: 3, victim: 2, cause: frozen, names: "rank 2", bound: 25 * time.Second,
			ci: ph == "small"})
	}
	// desync (the victim calls a barrier where the others all-reduce):
	// gorun's line says desync and quotes both calls, which name the
	// victim; it never blames one of the others.
	rows = append(rows, row{mode: "gorun", fault: "desync", phase: "small", np: 3, victim: 2, cause: []string{"desync", "Barrier", "AllReduce"},
		names: "desync", bound: 25 * time.Second, ci: true})
	rows = append(rows,
		row{mode: "gorun", fault: "stop", phase: "small", np: 3, victim: 0, cause: []string{"rank 0", "frozen"}, names: "rank 0", bound: 25 * time.Second},
		row{mode: "gorun", fault: "stop", phase: "small", np: 3, victim: 2, cause: frozen, names: "rank 2", bound: 25 * time.Second,
			env: []string{"GORUN_RDZV_FLAT=1"}},
		row{mode: "gorun", fault: "stop", phase: "barrier", np: 3, victim: 2, restarts: 1, complete: true, bound: 25 * time.Second},
		row{mode: "direct", fault: "stop", phase: "small", np: 3, victim: 2, names: "rank 2", bound: 25 * time.Second},
	)
	// stop before the world formed: named within the lease,
	// or restarted, not left to the formation timeout (120 s).
	//   - attached: the victim froze once attached to its host leader,
	//     while rank 1 holds formation back; the attach lease finds it
	//     and the survivors name it ("lost to its peers": the runtime's
	//     verdict, at the lease, not the supervisor's backstop);
	//   - launch: the victim froze before Init, so no peer ever saw it;
	//     its supervisor finds it stopped (state T) past its lease.
	rows = append(rows,
		row{mode: "gorun", fault: "stop", phase: "attached", np: 3, victim: 2, cause: []string{"rank 2", "frozen", "lost to its peers"}, names: "rank 2",
			bound: 25 * time.Second, ci: true},
		row{mode: "gorun", fault: "stop", phase: "attached", np: 3, victim: 0, cause: []string{"rank 0", "frozen", "lost to its peers"}, names: "rank 0",
			bound: 25 * time.Second},
		row{mode: "gorun", fault: "stop", phase: "attached", np: 3, victim: 2, restarts: 1, complete: true, bound: 25 * time.Second},
		row{mode: "gorun", fault: "stop", phase: "launch", np: 3, victim: 2, cause: []string{"rank 2", "frozen", "past its lease"}, bound: 25 * time.Second},
		row{mode: "gorun", fault: "stop", phase: "launch", np: 3, victim: 2, restarts: 1, complete: true, bound: 25 * time.Second, ci: true},
	)
	// hang before Init, running (not stopped): nothing tells it from a
	// rank slow to start, so only the formation timeout (--rdzv-timeout,
	// here 3 s; 2 minutes by default) ends the wait; then gorun names the
	// rank that never joined, not the ranks that gave up waiting (it
	// once named rank 0, "exited with code 6").
	rows = append(rows,
		row{mode: "gorun", fault: "hang", phase: "launch", np: 3, victim: 2, args: []string{"--rdzv-timeout", "3s"},
			cause: []string{"rank 2", "missing 2"}, names: "missing 2", bound: 25 * time.Second, ci: true},
		row{mode: "gorun", fault: "hang", phase: "launch", np: 3, victim: 2, args: []string{"--rdzv-timeout", "3s"}, restarts: 1,
			complete: true, bound: 25 * time.Second},
	)
	// slow: the job completes, no death verdict, the stall diagnosis names
	// the slowed rank.
	rows = append(rows, row{mode: "gorun", fault: "slow", phase: "steps", np: 3, victim: 1, run: 4 * time.Second, complete: true, ci: true,
		// Stopped 2.7 s of every 3 s: long enough for the stall
		// diagnosis (after 1 s, then a status query that the stopped rank
		// cannot answer), short of any death verdict. Keyed to a step: at
		// a fixed time (300 ms) a loaded CI run stopped rank 1 before the
		// ranks had started iterating, and no iteration waited for it.
		inject: []string{"slow:rank=1:after-steps=1:for=3s:duty=0.9:period=3s"},
		// Visible: the other ranks waited for it (an iteration of rank
		// 0 lasted at least 1.5 s). The stall diagnosis usually names it
		// too ("rank 1 does not answer"), but its status query races the
		// slice on a loaded machine, so the row does not require it.
		extra: heldUp(1500*time.Millisecond, "the slowed rank 1 held nobody up")})
	// data-plane faults inside gorun's transport.
	for _, mode := range []string{"gorun", "direct"} {
		ci := mode == "gorun"
		rows = append(rows,
			row{mode: mode, fault: "corrupt", phase: "loop", np: 3, victim: 1, run: 4 * time.Second, ci: ci,
				inject: []string{"corrupt:rank=1:at=800ms"}, cause: []string{"corrupted on the link 1->"}, names: "corrupted on the link 1->"},
			row{mode: mode, fault: "drop", phase: "loop", np: 3, victim: 1, run: 4 * time.Second, ci: !ci,
				inject: []string{"drop:rank=1:peer=2:at=800ms"}, cause: []string{"dropped"}, names: "rank ", alsoBlame: []int{2}},
			row{mode: mode, fault: "partition", phase: "loop", np: 3, victim: -1, run: 6 * time.Second, ci: ci,
				inject: []string{"partition:ranks=0:at=800ms:lease=1500ms"}, cause: []string{"lease"}, names: "rank "},
			row{mode: mode, fault: "partition", phase: "heal", np: 3, victim: -1, run: 3 * time.Second, complete: true,
				inject: []string{"partition:ranks=0:at=800ms:for=1s"}},
			row{mode: mode, fault: "delay", phase: "loop", np: 3, victim: 1, run: 2 * time.Second, complete: true,
				inject: []string{"delay:rank=1:ms=30:at=500ms:for=1s"}},
		)
	}
	rows = append(rows, row{mode: "gorun", fault: "corrupt", phase: "loop", np: 3, victim: 1, run: 4 * time.Second, restarts: 1, complete: true,
		inject: []string{"corrupt:rank=1:at=800ms"}})
	// The same faults keyed to a step (after-steps=N: the fault starts in
	// each rank it acts in once that rank reported step N; the chaos rank
	// reports one step per iteration), under gorun and without it.
	rows = append(rows,
		row{mode: "gorun", fault: "corrupt", phase: "steps", np: 3, victim: 1, run: 4 * time.Second, ci: true,
			inject: []string{"corrupt:rank=1:after-steps=3"}, cause: []string{"corrupted on the link 1->"}, names: "corrupted on the link 1->"},
		row{mode: "direct", fault: "drop", phase: "steps", np: 3, victim: 1, run: 4 * time.Second,
			inject: []string{"drop:rank=1:peer=2:after-steps=3"}, names: "rank "},
		row{mode: "gorun", fault: "delay", phase: "steps", np: 3, victim: 1, run: 2 * time.Second, complete: true,
			inject: []string{"delay:rank=1:ms=300:after-steps=2:for=1s"}, extra: heldUp(280*time.Millisecond, "the delay held no frame")},
		row{mode: "gorun", fault: "partition", phase: "heal-steps", np: 3, victim: -1, run: 3 * time.Second, complete: true,
			inject: []string{"partition:ranks=0:after-steps=3:for=1s"}, extra: heldUp(700*time.Millisecond, "the partition held no frame")},
		row{mode: "direct", fault: "partition", phase: "steps", np: 3, victim: -1, run: 6 * time.Second,
			inject: []string{"partition:ranks=0:after-steps=3:lease=1500ms"}, names: "rank "},
	)
	// Across namespace hosts, one rank per host: host faults, a real
	// partition with iptables, and the transport's faults.
	rows = append(rows,
		row{mode: "hosts", fault: "kill", phase: "large", np: 3, victim: 1, cause: killed, names: "rank 1", ci: true},
		row{mode: "hosts", fault: "kill-host", phase: "loop", np: 3, victim: 2, run: 5 * time.Second, cause: []string{"rank 2", "lost"}, names: "rank 2",
			inject: []string{"kill-host:host=HOST2:at=1s"}},
		row{mode: "hosts", fault: "kill-host", phase: "loop", np: 3, victim: 2, run: 3 * time.Second, restarts: 1, complete: true,
			inject: []string{"kill-host:host=HOST2:at=1s"}},
		// One rank per host: every rank is its host's leader, and gossip
		// sees the freeze.
		row{mode: "hosts", fault: "stop", phase: "small", np: 3, victim: 2, cause: frozen, names: "rank 2", bound: 25 * time.Second},
		// Elastic grow-back (--min-np 2): host 3 is killed whole once
		// its rank finished iteration 2, world 1 runs 2 ranks; its rank 1
		// is killed at its iteration 6, and at that restart gorun asks
		// host 3 again: it answers, and world 2 completes on 3 ranks
		// (rank 2's checked result exists only if it ran).
		row{mode: "hosts", fault: "kill-host", phase: "regrow", np: 3, victim: 2, run: 2 * time.Second, restarts: 2, complete: true,
			args: []string{"--min-np", "2"}, inject: []string{"kill-host:host=HOST2:after-steps=2", "kill:rank=1:after-steps=6"}},
		// Frozen before Init on another host: its host's supervisor
		// reports it through the agent.
		row{mode: "hosts", fault: "stop", phase: "launch", np: 3, victim: 2, cause: []string{"rank 2", "frozen", "past its lease"}, bound: 25 * time.Second},
		row{mode: "hosts", fault: "corrupt", phase: "loop", np: 3, victim: 1, run: 4 * time.Second,
			inject: []string{"corrupt:rank=1:at=800ms"}, cause: []string{"corrupted on the link 1->"}, names: "corrupted on the link 1->"},
		// A partition of a host from the others inside the transport,
		// from a step: named at its lease as the network around it.
		row{mode: "hosts", fault: "partition", phase: "hosts-steps", np: 3, victim: -1, run: 8 * time.Second,
			inject: []string{"partition:hosts=HOST0:after-steps=3:lease=1500ms"},
			cause:  []string{"the network between host", "HOST0", "lease"}, names: "rank ", code: 255},
		// Gossip's packets (UDP) between host 1 and the others dropped
		// for 6 s, its TCP and the data plane untouched: the job goes
		// on. memberlist's TCP fallback probe keeps host 1 alive while
		// it lands within the probe interval; when one misses under
		// load, the suspicion cannot be refuted over UDP, and the
		// World's push-pulls over TCP within the lease carry the
		// refutation instead (rendezvous/doubt.go). Before them, host
		// 1 declared host 2 dead 3.8 s into the cut in 1 run of 2.
		row{mode: "hosts", fault: "gossip", phase: "udp-cut", np: 3, victim: -1, run: 9 * time.Second, complete: true,
			during: iptablesCut(0, []int{1, 2}, "udp", 6*time.Second)},
		// host 1 (rank 0) cut from everything, gorun included, for 8 s:
		// named within the lease.
		row{mode: "hosts", fault: "iptables", phase: "isolate", np: 3, victim: 0, run: 12 * time.Second, cause: []string{"rank 0"}, names: "rank 0",
			during: iptablesPartition(0, nil, 8*time.Second), namedInCut: true, code: 255},
		// host 1 (rank 0) cut from both other hosts but not from gorun:
		// named at the lease (gossip's or the links', both 4 s) as the
		// network around host 1.
		row{mode: "hosts", fault: "iptables", phase: "cut", np: 3, victim: 0, run: 12 * time.Second,
			cause: []string{"the network between host", "HOST0", "rank 0"}, names: "rank ",
			during: iptablesPartition(0, []int{1, 2}, 8*time.Second), namedInCut: true, code: 255},
		// the same for 500 ms, 1 s and 2.5 s: shorter than the 4 s
		// lease, the job goes on. With an 800 ms suspicion gossip
		// declared the host dead 1.2 s into a 1 s cut; now memberlist
		// suspects for 2 s and the World doubts its verdict until the
		// lease (rendezvous/doubt.go).
		row{mode: "hosts", fault: "iptables", phase: "heal", np: 3, victim: -1, run: 4 * time.Second, complete: true,
			during: iptablesPartition(0, []int{1, 2}, 500*time.Millisecond)},
		row{mode: "hosts", fault: "iptables", phase: "heal-1s", np: 3, victim: -1, run: 4 * time.Second, complete: true,
			during: iptablesPartition(0, []int{1, 2}, 1*time.Second)},
		row{mode: "hosts", fault: "iptables", phase: "heal-2.5s", np: 3, victim: -1, run: 6 * time.Second, complete: true,
			during: iptablesPartition(0, []int{1, 2}, 2500*time.Millisecond)},
		// One link cut for 2 s, half the lease: gossip sees nothing, the
		// link's lease tolerates it, the job goes on.
		row{mode: "hosts", fault: "iptables", phase: "one-link-heal", np: 3, victim: -1, run: 5 * time.Second, complete: true,
			during: iptablesPartition(0, []int{2}, 2*time.Second)},
		// One link cut (hosts 1 and 3) while both still reach host 2:
		// gossip's indirect probes keep both alive, so only the data
		// plane's own lease on the link (comm's linkwatch.go) names it.
		// Another user on every host keeps 1100 connections open to each
		// TCP port of the other hosts' ranks (gossip, data plane) from the
		// moment the job starts, redialing every one closed: more than
		// a source's share on every port. The job forms and completes;
		// with refusing gates it waited for the flood to end.
		row{mode: "hosts", fault: "outsider", phase: "flood", np: 3, victim: -1, run: 3 * time.Second, complete: true,
			during: outsiderFlood(1100, 40*time.Second), bound: 30 * time.Second},
		row{mode: "hosts", fault: "iptables", phase: "one-link", np: 3, victim: -1, run: 12 * time.Second, ci: true,
			cause: []string{"the network between host", "HOST0", "HOST2", "link cut"}, names: "rank ",
			during: iptablesPartition(0, []int{2}, 8*time.Second), namedInCut: true, code: 255},
	)
	rows = append(rows, programRows()...)
	for i := range rows {
		if rows[i].bound == 0 {
			rows[i].bound = defaultBound
		}
		if rows[i].mode == "direct" && len(rows[i].inject) > 0 {
			rows[i].netfault, rows[i].inject = strings.Join(rows[i].inject, ";"), nil
		}
	}
	return rows
}

// TestChaosMatrix runs the matrix (the covering subset unless
// GORUN_CHAOS=full) and prints it as a table.
func TestChaosMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes; skipped in -short")
	}
	full := os.Getenv("GORUN_CHAOS") == "full"
	var rows []row
	for _, r := range matrix() {
		if full || r.ci {
			rows = append(rows, r)
		}
	}
	results := make([]outcome, len(rows))
	ran := make([]bool, len(rows))
	for i, r := range rows {
		t.Run(r.name(), func(t *testing.T) {
			o := runRow(t, r)
			results[i], ran[i] = o, true
			for _, v := range o.violations {
				if r.owner != "" {
					t.Errorf("%s (known gap, waits for %s)", v, r.owner)
				} else {
					t.Error(v)
				}
			}
		})
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tnp\twant\tresult\texit\ttime\tdetect\tculprit / first violation")
	for i, r := range rows {
		if !ran[i] {
			continue // left out by -run
		}
		o := results[i]
		want, res := "fail, named", "ok"
		if r.complete {
			want = "complete"
		}
		detail := o.culprit
		if len(o.violations) > 0 {
			res, detail = "FAIL", o.violations[0]
			if r.owner != "" {
				res = "FAIL (waits for " + strings.SplitN(r.owner, ":", 2)[0] + ")"
			}
		}
		if len(detail) > 110 {
			detail = detail[:110] + "..."
		}
		detect := ""
		if o.detect > 0 {
			detect = fmt.Sprintf("%.2fs", o.detect.Seconds())
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%.2fs\t%s\t%s\n", r.name(), r.np, want, res, o.exit, o.took.Seconds(), detect, detail)
	}
	tw.Flush()
	t.Logf("chaos matrix (%d rows):\n%s", len(rows), b.String())
	if p := os.Getenv("GORUN_CHAOS_TABLE"); p != "" {
		// go test shows a passing package's output only with -v: make
		// test-chaos prints the table from this file.
		if err := os.WriteFile(p, fmt.Appendf(nil, "chaos matrix (%d rows):\n%s", len(rows), b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// runRow runs one row and checks every invariant.
func runRow(t *testing.T, r row) outcome {
	token := launchertest.NewToken(t.Name())
	tmp := t.TempDir()
	shmBefore := shmEntries()
	env := append(os.Environ(), rankEnv+"=1", launchertest.TokenEnv+"="+token, "TMPDIR="+tmp,
		chaosVictim+"="+strconv.Itoa(r.victim), chaosFault+"="+r.fault, chaosPhase+"="+r.phase, chaosRun+"="+r.run.String())
	env = append(env, r.env...)
	var o outcome
	var out string
	var failed bool // the job (or some rank) ended in failure
	start := time.Now()
	switch r.mode {
	case "gorun":
		out, failed, o = runGorun(t, r, env)
	case "direct":
		out, failed, o = runDirect(t, r, env)
	case "hosts":
		if hosts == nil {
			// Not silently: the row fails, saying why it could not run.
			o.violations = append(o.violations, fmt.Sprintf("cannot run: %v", hostsErr))
			return o
		}
		out, failed, o = runHosts(t, r, env)
	}
	if o.took == 0 {
		o.took = time.Since(start)
	}
	bad := func(format string, a ...any) { o.violations = append(o.violations, fmt.Sprintf(format, a...)) }
	if o.took >= r.bound {
		bad("hang: still running after %v; killed", r.bound)
	}
	// No process of the row is left, on this host (the only one here).
	if !launchertest.WaitFor(3*time.Second, func() bool { return len(launchertest.Survivors(token)) == 0 }) {
		left := launchertest.Survivors(token)
		bad("processes left after the job: %v", left)
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// No shared-memory segment or temp file left.
	if leaked := newEntries(shmBefore, shmEntries()); len(leaked) > 0 {
		bad("shared-memory segments left in /dev/shm: %v", leaked)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) > 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		bad("temp files left in TMPDIR: %v", names)
	}
	// Nothing wrong, ever.
	if strings.Contains(out, "WRONG RESULT") {
		bad("a rank computed a wrong result: %s", firstLine(out, "WRONG RESULT"))
	}
	results := regexp.MustCompile(`(?m)^chaos-result rank (\d+) `).FindAllStringSubmatch(out, -1)
	if r.complete {
		if failed {
			bad("the job failed; want it to complete (%s)", o.exit)
		}
		got := map[string]bool{}
		for _, m := range results {
			got[m[1]] = true
		}
		if len(got) != r.np-r.lost {
			bad("%d of %d ranks reported a checked result", len(got), r.np-r.lost)
		}
	} else {
		if !failed {
			bad("the job completed (%s); want the fault detected", o.exit)
		}
		// Every survivor that reported an error names the culprit.
		for _, line := range regexp.MustCompile(`(?m)^chaos-error rank (\d+): .*$`).FindAllString(out, -1) {
			if r.names != "" && !regexp.MustCompile(regexp.QuoteMeta(r.names)+`\b`).MatchString(line) {
				bad("a survivor's error does not name %q: %s", r.names, line)
			}
		}
	}
	if r.extra != nil {
		for _, v := range r.extra(out) {
			bad("%s", v)
		}
	}
	if len(o.violations) > 0 {
		t.Logf("output:\n%s", out)
	}
	return o
}

// runGorun runs the row under gorun; the one-line message must name the
// culprit.
func runGorun(t *testing.T, r row, env []string) (string, bool, outcome) {
	return runGorunArgs(t, r, env, nil, nil)
}

// runGorunArgs runs gorun with pre before the row's own arguments; gorun's
// standard output also goes to also, when not nil, as it comes.
func runGorunArgs(t *testing.T, r row, env []string, pre []string, also io.Writer) (string, bool, outcome) {
	var o outcome
	args := append(slices.Clone(pre), "-np", strconv.Itoa(r.np))
	for _, s := range r.inject {
		args = append(args, "--inject", s)
	}
	if r.restarts > 0 {
		args = append(args, "--max-restarts", strconv.Itoa(r.restarts))
	}
	args = append(args, r.args...)
	if len(r.prog) == 0 {
		args = append(args, selfBin)
	}
	for _, a := range r.prog {
		if a == "GORUN" {
			a = gorunBin
		}
		args = append(args, a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, gorunBin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if also != nil {
		cmd.Stdout = io.MultiWriter(&stdout, also)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	t0 := time.Now()
	err := cmd.Run()
	o.end = time.Now()
	o.took = o.end.Sub(t0) // gorun's own time (a hosts row's partition may outlast it)
	code := cmd.ProcessState.ExitCode()
	o.exit = "exit " + strconv.Itoa(code)
	if r.code != 0 && !r.complete && code != r.code {
		o.violations = append(o.violations, fmt.Sprintf("gorun exited %d, want %d", code, r.code))
	}
	out := stdout.String() + stderr.String()
	// The one-line message: gorun's line about the first cause.
	msg := ""
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(l, "gorun: rank ") || strings.HasPrefix(l, "gorun: host ") || strings.HasPrefix(l, "gorun: lost host ") ||
			strings.HasPrefix(l, "gorun: the network between ") || strings.HasPrefix(l, "gorun: desync: ") {
			msg = l
			break
		}
	}
	o.culprit = strings.TrimPrefix(msg, "gorun: ")
	failed := err != nil
	if !r.complete && failed {
		if msg == "" {
			o.violations = append(o.violations, "gorun printed no line naming the culprit")
		}
		for _, c := range r.cause {
			if !strings.Contains(msg, c) {
				o.violations = append(o.violations, fmt.Sprintf("gorun's message does not say %q: %s", c, msg))
			}
		}
		if r.victim >= 0 && !strings.Contains(msg, "rank "+strconv.Itoa(r.victim)) && !strings.Contains(msg, "world rank "+strconv.Itoa(r.victim)) {
			o.violations = append(o.violations, fmt.Sprintf("gorun's message does not name rank %d: %s", r.victim, msg))
		}
		// A line about one rank ("rank N (host ...) ...") must be about
		// the culprit, not a bystander the fault made fail.
		if m := regexp.MustCompile(`^gorun: rank (\d+) \(host `).FindStringSubmatch(msg); m != nil && r.victim >= 0 {
			if n, _ := strconv.Atoi(m[1]); n != r.victim && !slices.Contains(r.alsoBlame, n) {
				o.violations = append(o.violations, fmt.Sprintf("gorun blames rank %d, not the culprit rank %d: %s", n, r.victim, msg))
			}
		}
	}
	return out, failed, o
}

// runHosts runs the row under gorun across the namespace hosts, one rank
// per host (ssh launch agent); r.during runs alongside.
func runHosts(t *testing.T, r row, env []string) (string, bool, outcome) {
	hf, err := hosts.WriteHostfile(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	// The ranks get the chaos variables through -x: the agents start them
	// with a fresh environment.
	var x []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "GORUN_CHAOS") || k == rankEnv || k == launchertest.TokenEnv || k == "TMPDIR" || k == "GORUN_RDZV_FLAT" || k == "GORUN_RDZV_TIMEOUT" {
			x = append(x, "-x", kv)
		}
	}
	x = append(x, "-x", "GORACE=atexit_sleep_ms=0")
	// HOSTn in a spec or an expected cause is namespace host n's name.
	named := func(v string) string {
		for i, h := range hosts.Hosts {
			v = strings.ReplaceAll(v, "HOST"+strconv.Itoa(i), h)
		}
		return v
	}
	r.inject, r.cause = slices.Clone(r.inject), slices.Clone(r.cause)
	for i := range r.inject {
		r.inject[i] = named(r.inject[i])
	}
	for i := range r.cause {
		r.cause[i] = named(r.cause[i])
	}
	pre := append([]string{"--launch-agent", strings.Join(hosts.SSHArgs(), " "), "-hostfile", hf, "--grace", "3s"}, x...)
	var wg sync.WaitGroup
	var duringErr error
	var span cutSpan
	var also io.Writer // a nil *progress would be a non-nil Writer
	prog := newProgress(r.np)
	if r.during != nil {
		also = prog
		wg.Go(func() { span, duringErr = r.during(hosts, prog.ready) })
	}
	out, failed, o := runGorunArgs(t, r, env, pre, also)
	prog.stop() // a job that never got going: the fault gives up waiting
	wg.Wait()
	if duringErr != nil {
		o.violations = append(o.violations, fmt.Sprintf("the fault could not be made: %v", duringErr))
	}
	if r.during != nil && span.start.IsZero() {
		o.violations = append(o.violations, "the fault was never made: the job ended before every rank finished an iteration")
	}
	if !span.start.IsZero() && failed {
		o.detect = o.end.Sub(span.start)
		if r.namedInCut && !span.end.IsZero() && o.end.After(span.end) {
			o.violations = append(o.violations, fmt.Sprintf("the job failed %.2fs after the cut began, only after it healed (%.2fs): not named within the lease",
				o.detect.Seconds(), span.end.Sub(span.start).Seconds()))
		}
	}
	// Nothing but sshd on any host.
	if !launchertest.WaitFor(10*time.Second, func() bool {
		for _, h := range hosts.Hosts {
			if s, err := hosts.StrayPids(h); err != nil || len(s) > 0 {
				return false
			}
		}
		return true
	}) {
		for _, h := range hosts.Hosts {
			if s, _ := hosts.StrayPids(h); len(s) > 0 {
				o.violations = append(o.violations, fmt.Sprintf("host %s still runs %v", h, s))
			}
		}
	}
	return out, failed, o
}

// cutSpan is when a during fault was in place.
type cutSpan struct{ start, end time.Time }

// iptablesPartition cuts host a from each host of bs (both directions, in
// a's namespace) once the job is ready, for d, then heals it. bs nil cuts
// a from everything but its loopback: gorun and its agent connection
// included.
func iptablesPartition(a int, bs []int, d time.Duration) func(h *testhosts.Netns, ready <-chan struct{}) (cutSpan, error) {
	return iptablesCut(a, bs, "", d)
}

// iptablesCut is iptablesPartition for the packets of one protocol (proto
// "udp": gossip's probes and messages, not its TCP streams nor the data
// plane; "": every packet).
func iptablesCut(a int, bs []int, proto string, d time.Duration) func(h *testhosts.Netns, ready <-chan struct{}) (cutSpan, error) {
	return func(h *testhosts.Netns, ready <-chan struct{}) (cutSpan, error) {
		var span cutSpan
		var rules [][]string
		for _, b := range bs {
			rules = append(rules, []string{"INPUT", "-s", h.Addrs[b]}, []string{"OUTPUT", "-d", h.Addrs[b]})
		}
		if bs == nil {
			rules = [][]string{{"INPUT", "!", "-i", "lo"}, {"OUTPUT", "!", "-o", "lo"}}
		}
		if proto != "" {
			for i := range rules {
				rules[i] = append(rules[i], "-p", proto)
			}
		}
		ipt := func(op string, rule []string) error {
			args := append([]string{"netns", "exec", h.Hosts[a], "iptables", op}, rule...)
			args = append(args, "-j", "DROP")
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
			return nil
		}
		if _, ok := <-ready; !ok {
			return span, nil // the job ended before every rank got going
		}
		span.start = time.Now()
		for _, rule := range rules {
			if err := ipt("-A", rule); err != nil {
				return span, err
			}
		}
		time.Sleep(d)
		var first error
		for _, rule := range rules {
			if err := ipt("-D", rule); err != nil && first == nil {
				first = err
			}
		}
		span.end = time.Now()
		return span, first
	}
}

// progress watches gorun's output for every rank's "chaos-progress" line
// (printed after its first iteration) and then sends on ready; stop
// closes ready instead if that never happened.
type progress struct {
	mu    sync.Mutex
	np    int
	seen  map[string]bool
	line  []byte
	sent  bool
	ready chan struct{}
}

func newProgress(np int) *progress {
	return &progress{np: np, seen: map[string]bool{}, ready: make(chan struct{}, 1)}
}

var progressLine = regexp.MustCompile(`^chaos-progress rank (\d+) `)

func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range b {
		if c != '\n' {
			p.line = append(p.line, c)
			continue
		}
		if m := progressLine.FindSubmatch(p.line); m != nil {
			p.seen[string(m[1])] = true
		}
		p.line = p.line[:0]
		if !p.sent && len(p.seen) == p.np {
			p.sent = true
			p.ready <- struct{}{}
		}
	}
	return len(b), nil
}

func (p *progress) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.sent {
		p.sent = true
		close(p.ready)
	}
}

// runDirect starts the ranks itself, as torchrun or srun would, with
// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT and nothing supervising
// them: the runtime alone must end every survivor, naming the culprit.
// Once every survivor has exited, the harness kills what is left (the
// victim of a stop), as the outer launcher would.
func runDirect(t *testing.T, r row, env []string) (string, bool, outcome) {
	var o outcome
	port := rendezvoustest.FreePort(t)
	if r.netfault != "" {
		env = append(env, netfault.Env+"="+r.netfault, netfault.EpochEnv+"="+strconv.FormatInt(time.Now().UnixNano(), 10))
	}
	type proc struct {
		cmd *exec.Cmd
		out bytes.Buffer
	}
	procs := make([]*proc, r.np)
	for i := range procs {
		p := &proc{cmd: exec.Command(selfBin)}
		p.cmd.Env = append(slices.Clone(env), "RANK="+strconv.Itoa(i), "WORLD_SIZE="+strconv.Itoa(r.np),
			"LOCAL_RANK="+strconv.Itoa(i), "LOCAL_WORLD_SIZE="+strconv.Itoa(r.np),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = p
	}
	var wg sync.WaitGroup
	exited := make([]chan struct{}, r.np)
	for i, p := range procs {
		exited[i] = make(chan struct{})
		wg.Go(func() { _ = p.cmd.Wait(); close(exited[i]) })
	}
	deadline := time.After(r.bound)
	hung := false
	for i := range procs {
		if i == r.victim && r.fault == "stop" {
			continue // frozen for good: the survivors must not wait for it
		}
		select {
		case <-exited[i]:
		case <-deadline:
			hung = true
		}
		if hung {
			break
		}
	}
	for _, p := range procs {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	wg.Wait()
	if hung {
		o.violations = append(o.violations, fmt.Sprintf("hang: survivors still running after %v", r.bound))
	}
	var out strings.Builder
	failed := false
	var codes []string
	for i, p := range procs {
		out.WriteString(p.out.String())
		st := p.cmd.ProcessState
		code := st.ExitCode()
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			codes = append(codes, fmt.Sprintf("%d:%s", i, ws.Signal()))
			if !(i == r.victim && r.fault == "stop") {
				failed = true
			}
			continue
		}
		codes = append(codes, fmt.Sprintf("%d:%d", i, code))
		if code != 0 {
			failed = true
		}
		// Without a supervisor, each survivor's own error is the message:
		// every survivor of a failed job must have one.
		if !r.complete && i != r.victim && code == 0 {
			o.violations = append(o.violations, fmt.Sprintf("rank %d exited 0 in a job that lost a rank", i))
		}
		if !r.complete && i != r.victim && code != 0 && !strings.Contains(p.out.String(), "chaos-error rank") {
			o.violations = append(o.violations, fmt.Sprintf("rank %d failed without saying why: %q", i, lastLines(p.out.String(), 3)))
		}
	}
	o.exit = strings.Join(codes, " ")
	if line := firstLine(out.String(), "chaos-error"); line != "" {
		o.culprit = line
	}
	return out.String(), failed, o
}

// shmEntries lists gorun's shared-memory segments in /dev/shm.
func shmEntries() map[string]bool {
	m := map[string]bool{}
	ents, _ := os.ReadDir("/dev/shm")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "gorun") {
			m[e.Name()] = true
		}
	}
	return m
}

// newEntries returns the segments in after and not in before whose
// creator (the pid in the name, gorun-PID.NS-... with NS its PID
// namespace's inode, or gorun-PID-...) is gone: the machine is shared, and
// a segment whose creator still runs belongs to a live job (this row's
// processes are all gone by now; other test packages run beside this one),
// which unlinks it itself. A creator in another PID namespace is not ours
// to judge.
func newEntries(before, after map[string]bool) []string {
	var out []string
	for n := range after {
		if before[n] {
			continue
		}
		head := strings.SplitN(strings.TrimPrefix(n, "gorun-"), "-", 2)[0]
		p, ns, dotted := strings.Cut(head, ".")
		if dotted && ns != pidNamespace() {
			continue
		}
		pid, err := strconv.Atoi(p)
		if err == nil && syscall.Kill(pid, 0) == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join("/dev/shm", n)); err == nil {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func firstLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(ls[max(0, len(ls)-n):], "\n")
}

// pidNamespace is the inode of this process's PID namespace, as segment
// names record it ("" if unreadable).
func pidNamespace() string {
	l, err := os.Readlink("/proc/self/ns/pid") // pid:[4026531836]
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(strings.TrimPrefix(l, "pid:["), "]")
}
