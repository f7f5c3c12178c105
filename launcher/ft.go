package launcher

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/ft"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// Fault-tolerant jobs (gorun --fault-tolerant): a rank's failure does not
// stop the job. gorun runs the job's quorum service (package ft: the
// per-step quorum, the commit decision, the record of heals), tells it of
// every death as soon as the supervisor reaps the rank, and has the
// supervisor start the rank's next incarnation (same rank id, same output
// streams, ft.IncarnationEnv one higher), which heals from the live ranks
// through package ft and joins at the next step. The other ranks keep
// running. The job ends when every rank has exited 0; it fails when a
// failure finds the budget (--max-failures) spent, and then ends as any
// failed job does (the other ranks are stopped), the error naming the
// budget.
//
// The quorum service listens on loopback for a job on this machine, and
// beside the host agents' listener (the interface that routes to the
// hosts) for a multi-host job; the respawn and release commands go to the
// rank's host alone. The job's one world keeps its job id, secret and
// ports: a replacement is the same rank of the same job, and does not
// join the gossip world (package ft's doc says why). With replica groups
// (--fault-tolerant-group S, HSDP) a rank's failure replaces its whole
// group: gorun kills the others of it, waits for their exits (counted
// with the failure, not as failures of their own) and starts all S
// again.

// FTReport is the fault-tolerant part of the report (Report.FaultTolerance).
type FTReport struct {
	MaxFailures int `json:"max_failures"`
	// Failures lists every rank failure gorun saw, in order.
	Failures []FTFailure `json:"failures"`
	// Quorum is the quorum service's record: every membership change,
	// loss, heal and uncommitted step. Its times are seconds from
	// QuorumStart.
	Quorum      ft.Record `json:"quorum"`
	QuorumStart float64   `json:"quorum_start_s"`
	// UncommittedSteps is how many steps the survivors computed and threw
	// away (a participant died in them): the steps lost to failures.
	UncommittedSteps int `json:"uncommitted_steps"`
	// Exhausted says why a failure ended the job: the budget was spent,
	// or a replacement would be pointless (a deterministic failure, or no
	// live rank left to heal from).
	Exhausted string `json:"exhausted,omitempty"`
	// LostHosts lists every host lost while the job ran (its agent gone
	// or its link silent past the lease), in order.
	LostHosts []FTHostLoss `json:"lost_hosts,omitempty"`
	// LostSpares lists every spare host lost while it waited, unused, in
	// order: no longer offered, the job went on.
	LostSpares []FTSpareLoss `json:"lost_spares,omitempty"`
}

// FTSpareLoss is one spare host lost while idle (its agent gone or its
// link silent past the lease). Times are seconds from the job's start.
type FTSpareLoss struct {
	Host string  `json:"host"`
	At   float64 `json:"at_s"`
	Why  string  `json:"why"`
	// SparesLeft are the spare hosts still offered after it.
	SparesLeft []string `json:"spares_left"`
}

// FTHostLoss is one host lost in a fault-tolerant job and what came of
// it. Times are seconds from the job's start.
type FTHostLoss struct {
	Host string  `json:"host"`
	At   float64 `json:"at_s"`
	Why  string  `json:"why"`
	// Ranks are the host's ranks that were running when it was lost;
	// Retired every rank taken out of the job with it: those, and the
	// other ranks of their replica groups (--fault-tolerant-group),
	// killed on their own hosts. A retired rank is not started again.
	Ranks   []int `json:"ranks"`
	Retired []int `json:"retired"`
	// Step is the job's last committed step when the host was lost: the
	// survivors go on from it, rolling nothing back.
	Step int64 `json:"step"`
	// Participants is the first quorum formed after the loss (the
	// survivors' membership change); empty when none formed (the job
	// ended, or the survivors had finished).
	Participants []int `json:"participants_after,omitempty"`
	// Uncommitted counts the steps the survivors computed in the quorum
	// before that one (the host's ranks were in it) and threw away: the
	// steps the loss cost them. Committed steps are never rolled back.
	Uncommitted int `json:"uncommitted_steps"`
	// Spare is the spare host its ranks were started on, if any.
	Spare string `json:"spare,omitempty"`
	// Action is "survivors continue" (its groups retired), "replaced on
	// spare host S" or "job ended".
	Action string `json:"action"`
}

// FTFailure is one rank failure and what came of it. Times are seconds
// from the job's start.
type FTFailure struct {
	Rank        int     `json:"rank"`
	Incarnation int     `json:"incarnation"`
	PID         int     `json:"pid"`
	Code        int     `json:"code,omitempty"`
	Signal      string  `json:"signal,omitempty"`
	At          float64 `json:"at_s"`
	// Action is "replaced", "replaced with its replica group (ranks
	// A-B)" or "job ended".
	Action string `json:"action"`
	// Group lists the other ranks of its replica group, replaced with it
	// (--fault-tolerant-group).
	Group []int `json:"group,omitempty"`
	// ReplacedAt is when the replacement process started; HealedAt when
	// it had healed (its state copied from the live ranks), and
	// TimeToHeal HealedAt - At. JoinedAfterStart is from its process
	// start to the end of its heal.
	ReplacedAt       *float64 `json:"replaced_at_s,omitempty"`
	ReplacementPID   int      `json:"replacement_pid,omitempty"`
	HealedAt         *float64 `json:"healed_at_s,omitempty"`
	TimeToHeal       *float64 `json:"time_to_heal_s,omitempty"`
	JoinedAfterStart *float64 `json:"healed_after_start_s,omitempty"`
	// FoundFinished says the replacement came after every holder of the
	// job's last step had finished: it was told so (ErrFinished) and had
	// nothing to heal into.
	FoundFinished bool `json:"found_finished,omitempty"`
	// Host is set for a rank lost with its host (FTReport.LostHosts):
	// the host's name.
	Host string `json:"host,omitempty"`
	// own is the failure's own code (ownFailure).
	own int
}

// ftRun is gorun's side of one fault-tolerant job; nil when the job is
// not fault-tolerant (every method is then a no-op). The job loop's
// goroutine owns it, except srv, which is safe for concurrent use.
type ftRun struct {
	srv         *ft.Server
	maxFailures int
	start       time.Time // the job's start (Report.Start)
	srvStart    time.Time
	inc         map[int]int // each rank's current incarnation
	failures    []FTFailure
	exhausted   string
	// group is the replica group size (--fault-tolerant-group; 1: none);
	// dying holds the ranks gorun killed because their group lost a rank,
	// awaited before the group starts again whole.
	group int
	dying map[int]bool
	// retired holds the ranks taken out for good with a lost host (and
	// the others of their replica groups): never started again; hosts
	// are those losses, in order.
	retired   map[int]bool
	hosts     []FTHostLoss
	lostNodes map[int]bool
	// takeSpare moves a lost node's ranks to a spare host and starts
	// them there (hostsRun.takeSpare); dropSpare drops the spare of a
	// node found lost while idle (hostsRun.dropSpare). Both nil when the
	// job has no hosts.
	takeSpare func(node int) (string, bool)
	dropSpare func(node int)
	// spares are the spare hosts lost while idle, in order.
	spares []FTSpareLoss
}

// startFT starts the quorum service of a job with the given identity.
func startFT(job Job, jobID, secretHex, addr string, cfg Config) (*ftRun, error) {
	var start time.Time
	if cfg.world != nil {
		start = cfg.world.rep.Start
	}
	secret, err := hex.DecodeString(secretHex)
	if err != nil {
		return nil, fmt.Errorf("launcher: job secret: %w", err)
	}
	f := &ftRun{maxFailures: job.MaxFailures, start: start, inc: map[int]int{}, srvStart: time.Now(), failures: []FTFailure{},
		group: max(job.FTGroupSize, 1), dying: map[int]bool{}, retired: map[int]bool{}}
	if f.start.IsZero() {
		f.start = f.srvStart
	}
	np := job.NP
	if np == 0 {
		np = localRanks(job)
	}
	srv, err := ft.NewServer(ft.ServerConfig{
		Addr: addr, JobID: jobID, Secret: secret, Replicas: np, GroupSize: f.group,
		Logger: cfg.Logger.With().Str("role", "quorum").Logger(),
	})
	if err != nil {
		return nil, err
	}
	f.srv = srv
	return f, nil
}

func (f *ftRun) since(t time.Time) float64 { return t.Sub(f.start).Seconds() }

// env is what every rank gets in a fault-tolerant job.
func (f *ftRun) env() []string {
	return []string{ft.AddrEnv + "=" + f.srv.Addr(), ft.IncarnationEnv + "=0", ft.GroupSizeEnv + "=" + strconv.Itoa(f.group)}
}

// started notes a rank's (re)start.
func (f *ftRun) started(ev wire.Event) {
	if f == nil || f.inc[ev.Rank] == 0 {
		return
	}
	for i := len(f.failures) - 1; i >= 0; i-- {
		if x := &f.failures[i]; x.Rank == ev.Rank && x.Incarnation == f.inc[ev.Rank]-1 && x.ReplacedAt == nil {
			x.ReplacedAt, x.ReplacementPID = ptr(f.since(time.Now())), ev.PID
			return
		}
	}
}

// exited decides a rank's exit in a fault-tolerant job. It returns true
// when it handled it (a failure answered by a replacement); false leaves
// the exit to the usual rules: a success, a failure during the teardown,
// or a failure past the budget (then exhausted says so).
func (f *ftRun) exited(j *liveJob, ev wire.Event) bool {
	if f == nil {
		return false
	}
	inc := f.inc[ev.Rank]
	node := j.plan.Ranks[ev.Rank].NodeRank
	if f.dying[ev.Rank] {
		// Killed with its replica group: the group starts again once
		// every one of its ranks is gone.
		delete(f.dying, ev.Rank)
		f.srv.Lost(ev.Rank, inc, "its replica group lost a rank")
		f.respawnGroupIfGone(j, ev.Rank)
		return true
	}
	if ev.Code == 0 && ev.Signal == 0 {
		f.srv.Left(ev.Rank, inc)
		j.home.commandNode(node, wire.Cmd{Op: "release", Ranks: []int{ev.Rank}})
		return false
	}
	if j.reason != notStopping {
		return false
	}
	why := fmt.Sprintf("exited with code %d", ev.Code)
	rec := FTFailure{Rank: ev.Rank, Incarnation: inc, PID: ev.PID, Code: ev.Code, At: f.since(time.Now()), own: ownFailure(ev)}
	if ev.Signal != 0 {
		rec.Signal = unixSignalName(syscall.Signal(ev.Signal))
		why = "killed by " + rec.Signal
	}
	f.srv.Lost(ev.Rank, inc, why)
	end := f.pointless(ev.Rank, inc, ownFailure(ev), why)
	if end == "" && f.used() >= f.maxFailures {
		end = fmt.Sprintf("rank %d %s, failure %d of a budget of %d (--max-failures)", ev.Rank, why, f.used()+1, f.maxFailures)
	}
	if end != "" {
		rec.Action = "job ended"
		f.failures = append(f.failures, rec)
		f.exhausted = end
		j.log.Warn().Int("rank", ev.Rank).Str("why", end).Msg("fault-tolerant: ending the job")
		return false
	}
	rec.Action = "replaced"
	if f.group > 1 {
		// The whole replica group goes and comes back: the others of it
		// are killed now (their exits are awaited, not counted).
		lo := ev.Rank / f.group * f.group
		for q := lo; q < lo+f.group; q++ {
			if q == ev.Rank {
				continue
			}
			rec.Group = append(rec.Group, q)
			if !j.ranks[q].exited {
				f.dying[q] = true
				j.home.commandNode(j.plan.Ranks[q].NodeRank, wire.Cmd{Op: "signal", Signal: int(syscall.SIGKILL), Ranks: []int{q}})
			}
		}
		rec.Action = fmt.Sprintf("replaced with its replica group (ranks %d-%d)", lo, lo+f.group-1)
	}
	f.failures = append(f.failures, rec)
	j.log.Warn().Int("rank", ev.Rank).Str("why", why).Int("incarnation", inc+1).Msg("fault-tolerant: rank failed; starting its replacement")
	f.respawnGroupIfGone(j, ev.Rank)
	return true
}

// ownFailure is how a failed rank ended by its own doing: its exit code,
// or 128+signal for a signal the program raises on itself (a crash:
// SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS); 0 for a
// signal from outside (SIGKILL from the OOM killer, an operator, --inject
// or gorun's kill of a frozen rank; SIGTERM, SIGINT, ...).
func ownFailure(ev wire.Event) int {
	switch syscall.Signal(ev.Signal) {
	case 0:
		return ev.Code
	case syscall.SIGSEGV, syscall.SIGABRT, syscall.SIGBUS, syscall.SIGILL, syscall.SIGFPE, syscall.SIGTRAP, syscall.SIGSYS:
		return 128 + ev.Signal
	}
	return 0
}

// pointless says why replacing rank r's failed incarnation inc would be
// pointless, or "" when a replacement has a purpose; code is the
// failure's own code (ownFailure: 0 for a signal from outside). Two
// cases:
//
//   - a deterministic failure: the process failed by its own doing (an
//     exit code or a crash, not a signal from outside) before it ever
//     held the job's state, and either it was
//     the rank's first process (a start-up error: bad arguments, a batch
//     that does not divide, a missing module) or the process it replaced
//     exited with the same code before it too held the state. A
//     replacement runs the same program with the same arguments and
//     would fail the same way, burning the whole --max-failures budget
//     one replacement at a time while the job can never progress.
//   - nothing to heal from: no live rank holds the job's last committed
//     step (every holder died). A replacement would start from nothing,
//     and a job that loses its state is a failed job, not a healed one.
//
// A failure by a signal from outside, or after the process held the
// state, is replaced as usual: those are the failures fault tolerance is
// for.
func (f *ftRun) pointless(r, inc, code int, why string) string {
	if !f.srv.StateLive() {
		return fmt.Sprintf("rank %d %s and no live rank holds the job's state: a replacement would have nothing to heal from", r, why)
	}
	if code == 0 || f.srv.HeldState(r, inc) {
		return ""
	}
	if inc == 0 {
		return fmt.Sprintf("rank %d %s before it took part in a committed step: a start-up failure, which a replacement would repeat", r, why)
	}
	for i := len(f.failures) - 1; i >= 0; i-- {
		if p := f.failures[i]; p.Rank == r {
			if p.Incarnation == inc-1 && p.own == code && !f.srv.HeldState(r, inc-1) {
				return fmt.Sprintf("rank %d %s before it healed, as the process it replaced did: a deterministic failure, which a further replacement would repeat", r, why)
			}
			break
		}
	}
	return ""
}

// respawnGroupIfGone starts the next incarnation of rank r's replica group
// (rank r alone without groups) once none of its ranks is still dying. A
// group retired with a lost host is not started again: its ranks' kept
// pipes are released instead, so that their supervisors can finish.
func (f *ftRun) respawnGroupIfGone(j *liveJob, r int) {
	lo := r / f.group * f.group
	for q := lo; q < lo+f.group; q++ {
		if f.dying[q] {
			return
		}
	}
	if f.retired[r] {
		for q := lo; q < lo+f.group; q++ {
			if j.ranks[q].exited && !f.lostHere(j, q) {
				j.home.commandNode(j.plan.Ranks[q].NodeRank, wire.Cmd{Op: "release", Ranks: []int{q}})
			}
		}
		return
	}
	inc := 0
	for q := lo; q < lo+f.group; q++ {
		if j.ranks[q].exited {
			// Not a rank already started on a spare host with its
			// group's next incarnation (ftspare.go).
			inc = max(inc, f.inc[q]+1)
		}
	}
	for q := lo; q < lo+f.group; q++ {
		if !j.ranks[q].exited {
			continue // still running (a group member that was not killed: it cannot be)
		}
		f.inc[q] = inc
		j.ranks[q].exited = false
		j.home.commandNode(j.plan.Ranks[q].NodeRank, wire.Cmd{Op: "respawn", Ranks: []int{q}, Incarnation: inc})
	}
}

// frozen handles a rank stopped past its lease in a fault-tolerant job:
// the others wait for it at their next quorum, so it is killed (its
// process group), and its exit is then a failure like any other: it is
// replaced. It returns false when the job is not fault-tolerant.
func (f *ftRun) frozen(j *liveJob, ev wire.Event) bool {
	if f == nil {
		return false
	}
	j.log.Warn().Int("rank", ev.Rank).Str("why", ev.Err).Msg("fault-tolerant: rank frozen; killing it so that it is replaced")
	j.home.commandNode(j.plan.Ranks[ev.Rank].NodeRank, wire.Cmd{Op: "signal", Signal: int(syscall.SIGKILL), Ranks: []int{ev.Rank}})
	return true
}

// quorumAfterLoss returns the index in quorums (times off seconds after
// the job's start) of the first quorum formed after host loss h, or -1.
// The survivors often form it before gorun counts the host lost: their
// collective with the dead ranks fails at once, while the agent's
// connection may close later. So it is the quorum after the last one
// formed by h.At that held one of the lost ranks; without such a quorum
// (the ranks had not joined yet), the first formed at or after h.At.
func quorumAfterLoss(quorums []ft.QuorumRecord, off float64, h *FTHostLoss) int {
	lost := append(slices.Clone(h.Ranks), h.Retired...)
	last := -1
	for i, q := range quorums {
		if off+q.At > h.At {
			break
		}
		if slices.ContainsFunc(q.Participants, func(p int) bool { return slices.Contains(lost, p) }) {
			last = i
		}
	}
	if last >= 0 {
		if last+1 < len(quorums) {
			return last + 1
		}
		return -1
	}
	return slices.IndexFunc(quorums, func(q ft.QuorumRecord) bool { return off+q.At >= h.At })
}

// finish stops the quorum service, fills rep's fault-tolerant section and
// names a spent budget in err.
func (f *ftRun) finish(rep *Report, err error) error {
	if f == nil {
		return err
	}
	_ = f.srv.Close()
	rec := f.srv.Record()
	off := f.since(f.srvStart)
	for i := range f.failures {
		x := &f.failures[i]
		for _, h := range rec.Heals {
			if h.Replica == x.Rank && h.Incarnation == x.Incarnation+1 {
				at := off + h.At
				x.HealedAt, x.TimeToHeal = ptr(at), ptr(at-x.At)
				if x.ReplacedAt != nil {
					x.JoinedAfterStart = ptr(at - *x.ReplacedAt)
				}
			}
		}
		for _, fin := range rec.Finished {
			x.FoundFinished = x.FoundFinished || fin.Replica == x.Rank && fin.Incarnation == x.Incarnation+1
		}
	}
	for i := range f.hosts {
		h := &f.hosts[i]
		if k := quorumAfterLoss(rec.Quorums, off, h); k >= 0 && h.Action != "job ended" {
			h.Participants = rec.Quorums[k].Participants
			if k > 0 {
				for _, u := range rec.Uncommitted {
					h.Uncommitted += btoi(u.Quorum == rec.Quorums[k-1].ID)
				}
			}
		}
	}
	if rep != nil {
		rep.FaultTolerance = &FTReport{
			MaxFailures: f.maxFailures, Failures: f.failures, Quorum: rec, QuorumStart: off,
			UncommittedSteps: len(rec.Uncommitted), Exhausted: f.exhausted, LostHosts: f.hosts, LostSpares: f.spares,
		}
	}
	if err != nil && f.exhausted != "" {
		return &FTStopError{Why: f.exhausted, Err: err}
	}
	return err
}

// FTStopError ends a fault-tolerant job that a failure stopped: Why names
// the failure and why it was not replaced (the budget was spent, or a
// replacement would be pointless); Err is the job's failure as usual (it
// carries the exit code).
type FTStopError struct {
	Why string
	Err error
}

func (e *FTStopError) Error() string {
	return "launcher: --fault-tolerant: " + e.Why + "; the job was stopped: " + e.Err.Error()
}

func (e *FTStopError) Unwrap() error { return e.Err }
