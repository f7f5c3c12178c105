package launcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/launcher/fault"
	"github.com/gorun-hpc/gorun/launcher/hostfile"
	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/rankenv"
)

// Restarts (--max-restarts, torchrun's semantics) and the record of
// injected faults. LaunchReport runs the job as a sequence of worlds: when
// a world fails because a rank or a host failed, the world has already
// been stopped whole (the job loop's failure rule: every rank and every
// descendant gone), and, while restarts are left, a new world is launched
// from scratch: a new job id and secret (so the rendezvous refuses any
// member of the old world, which knows only the old ones), new ports, and
// RestartCountEnv/TorchRestartCountEnv set to the restart number so the
// program can resume from its checkpoint.
//
// A world is not restarted after --timeout, a signal to gorun, a canceled
// context, or an error from before any rank started (a missing program, a
// bad host list): repeating those cannot help.

// The variables a restarted world's ranks find their restart number in.
const (
	// RestartCountEnv is gorun's name: 0 in the first world.
	RestartCountEnv = rankenv.RestartCount
	// TorchRestartCountEnv is torchrun's name for the same number, so that
	// torch programs written for torchrun resume under gorun unchanged.
	TorchRestartCountEnv = rankenv.TorchRestartCount
	// TorchMaxRestartsEnv is torchrun's name for --max-restarts.
	TorchMaxRestartsEnv = "TORCHELASTIC_MAX_RESTARTS"
)

// Report is what LaunchReport saw: every world, every injected fault and
// what the job did about it. Times are seconds from the start of the first
// world. It is gorun's --report FILE, as JSON.
type Report struct {
	// Start is when the first world's launch began: the zero of every
	// "_s" time below.
	Start       time.Time `json:"start"`
	MaxRestarts int       `json:"max_restarts"`
	// Restarts is how many worlds followed the first.
	Restarts int           `json:"restarts"`
	Worlds   []WorldReport `json:"worlds"`
	Faults   []FaultReport `json:"faults"`
	// RandomNotDue counts the kills a random: fault planned (a week
	// ahead) that were not due before the job ended: left out of Faults,
	// which lists the faults that happened or were due.
	RandomNotDue int    `json:"random_not_due,omitempty"`
	Outcome      string `json:"outcome"`
	ExitCode     int    `json:"exit_code"`
	// Cause is the last world's causal record when the job failed (the
	// culprit its final line names); each world keeps its own.
	Cause *CauseReport `json:"cause,omitempty"`
	// CheckpointSignals are the times gorun sent the ranks the checkpoint
	// signal on its own (Job.CheckpointBefore), and why ("before --timeout",
	// "before fault N").
	CheckpointSignals []CheckpointSignalReport `json:"checkpoint_signals,omitempty"`
	// LostHosts are the hosts an elastic job left out after losing them,
	// in the order they were lost (a host re-admitted later stays here;
	// Readmitted says when it came back).
	LostHosts []string `json:"lost_hosts,omitempty"`
	// Readmitted are the lost hosts that answered again at a later
	// restart and were taken back (elastic grow-back).
	Readmitted []ReadmitReport `json:"readmitted,omitempty"`
	// HostfileChanges are the changes found when the hostfile was read
	// again before a restart (Job.Hostfile), and reads that failed.
	HostfileChanges []HostfileChange `json:"hostfile_changes,omitempty"`
	// FaultTolerance is a --fault-tolerant job's failures, quorums and
	// heals (ft.go).
	FaultTolerance *FTReport `json:"fault_tolerance,omitempty"`
	// out are the hosts left out of the next world now; lostIn is the
	// restart whose world lost each.
	out        []string
	lostIn     map[string]int
	ckptSig    syscall.Signal // Job.CheckpointSignal, resolved
	ckptBefore time.Duration  // Job.CheckpointBefore
	inj        []injection    // the schedule; nil until the first plan
	faults     []fault.Fault  // as given
	horizon    time.Duration  // how far random faults are planned
	fired      map[int]bool   // injections already sent, by id
	byID       map[int]int    // injection id → index in Faults
	world      *WorldReport   // the world running now
	pending    map[int]string // injections of this world not yet answered
}

// ReadmitReport is a lost host taken back: at the start of world Restart,
// its agent answered again (At, seconds from the job's start).
type ReadmitReport struct {
	Host    string  `json:"host"`
	Restart int     `json:"restart"`
	At      float64 `json:"at_s"`
}

// HostfileChange is what one reading of the hostfile before world Restart
// changed: hosts added, hosts removed, hosts whose slots changed; or Error,
// when the file could not be read and the host list stayed as it was.
type HostfileChange struct {
	Restart int      `json:"restart"`
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	Resized []string `json:"resized,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// CheckpointSignalReport is one checkpoint signal gorun sent by itself.
type CheckpointSignalReport struct {
	At      float64 `json:"at_s"`
	Restart int     `json:"restart"`
	Why     string  `json:"why"`
}

// checkpointCue is one checkpoint signal a world owes its ranks.
type checkpointCue struct {
	at  time.Time
	why string
}

// checkpointCues returns, in time order, the checkpoint signals this world
// owes (Job.CheckpointBefore ahead of each): one before the world's
// timeout (timeout is what is left of --timeout for it; 0: none), one
// before each timed kill or kill-host not yet sent — a preemption notice,
// so that a job that checkpoints on the signal resumes from just before
// the fault. A cue whose time has passed when the world starts is dropped:
// a notice after the ranks had no time to act on it helps nobody, and one
// sent before the ranks run could kill them (SIGUSR1's default action).
// Faults fired on steps (after-steps) have no time to precede.
func (w *worldRun) checkpointCues(worldStart time.Time, timeout time.Duration) []checkpointCue {
	if w == nil || w.rep.ckptBefore <= 0 {
		return nil
	}
	before := w.rep.ckptBefore
	var out []checkpointCue
	if timeout > before {
		out = append(out, checkpointCue{worldStart.Add(timeout - before), "before --timeout"})
	}
	for _, in := range w.rep.inj {
		if w.rep.fired[in.id] || in.afterSteps > 0 || (in.kind != fault.Kill && in.kind != fault.KillHost) {
			continue
		}
		if at := w.rep.Start.Add(in.at - before); at.After(worldStart) {
			out = append(out, checkpointCue{at, fmt.Sprintf("before fault %d (%s)", in.id, w.rep.faults[in.fault].Spec)})
		}
	}
	slices.SortStableFunc(out, func(a, b checkpointCue) int { return a.at.Compare(b.at) })
	return out
}

// checkpointSignal is the signal that asks a rank to checkpoint
// (Job.CheckpointSignal).
func (w *worldRun) checkpointSignal() syscall.Signal { return w.rep.ckptSig }

// checkpointSent records a checkpoint signal sent at t.
func (w *worldRun) checkpointSent(c checkpointCue, t time.Time) {
	w.rep.CheckpointSignals = append(w.rep.CheckpointSignals, CheckpointSignalReport{At: w.rep.since(t), Restart: w.restart, Why: c.why})
}

// WorldReport is one world: one launch of every rank.
type WorldReport struct {
	Restart int    `json:"restart"`
	JobID   string `json:"job_id"`
	// NP and Hosts are the world's size and the hosts its ranks ran on.
	NP    int      `json:"np"`
	Hosts []string `json:"hosts,omitempty"`
	// StartedAt is when the world's launch began; RanksStartedAt when the
	// last of its ranks had started (a rank that could not start counts);
	// FirstStepAt when a rank first reported a finished step.
	StartedAt      float64  `json:"started_at_s"`
	RanksStartedAt *float64 `json:"ranks_started_at_s,omitempty"`
	FirstStepAt    *float64 `json:"first_step_at_s,omitempty"`
	EndedAt        float64  `json:"ended_at_s"`
	// Result is "succeeded" or the error that ended the world.
	Result string `json:"result"`
	// Cause is the causal record of a world that failed: the culprit and
	// the ranks that failed because of it, counted apart (cause.go).
	Cause *CauseReport `json:"cause,omitempty"`
}

// FaultReport is one injection.
type FaultReport struct {
	ID     int    `json:"id"`
	Spec   string `json:"spec"`
	Kind   string `json:"kind"`
	Signal string `json:"signal"`
	Ranks  []int  `json:"ranks"`
	Host   string `json:"host,omitempty"`
	// PlannedAt is when it was due; InjectedAt when the supervisor sent the
	// signal (in Restart's world); ContinuedAt when a stop with for= ended.
	PlannedAt float64 `json:"planned_at_s"`
	// AfterSteps is the step an after-steps fault waited for, and
	// InjectedAtStep the last step the target had reported when the
	// supervisor signaled it.
	AfterSteps     int64 `json:"after_steps,omitempty"`
	InjectedAtStep int64 `json:"injected_at_step,omitempty"`
	// SentAt is when gorun asked the supervisors to inject it.
	SentAt      *float64 `json:"sent_at_s,omitempty"`
	Restart     *int     `json:"restart,omitempty"`
	InjectedAt  *float64 `json:"injected_at_s,omitempty"`
	PIDs        []int    `json:"pids,omitempty"`
	ContinuedAt *float64 `json:"continued_at_s,omitempty"`
	// Missed says why nothing was signaled: the target had exited, or
	// the job ended first.
	Missed string `json:"missed,omitempty"`
	// DetectedAt is when gorun saw the first failure after the injection
	// in the same world, TimeToDetect the gap. DetectedBy names that
	// failure, or, when it was collateral (a rank that exited because it
	// lost a peer), the first failure of its own that followed in the
	// world: the victim's death can be reaped after a peer's reaction to
	// it, and the record names the cause as the verdict does.
	DetectedAt   *float64 `json:"detected_at_s,omitempty"`
	DetectedBy   string   `json:"detected_by,omitempty"`
	TimeToDetect *float64 `json:"time_to_detect_s,omitempty"`
	// detectedCollateral: DetectedBy names a collateral failure so far.
	detectedCollateral bool
	// Noticed is, for each rank whose runtime reported failing because
	// of a lost peer after the injection (in its world), when gorun had
	// its report (At) and how long after the injection (After), whom it
	// blamed and in its words; ranks gorun stopped before they noticed
	// are not listed (WorldReport.Cause counts them).
	Noticed []NoticeReport `json:"noticed,omitempty"`
	// WorldEndedAt is when the world it hit was gone; Action what the job
	// did then: "restarted", "job ended" or "job succeeded";
	// RecoveredAt is when every rank of the next world had started, and
	// ResumedAt when the first rank of the next world reported a step
	// (programs that report steps: gorun's runtime's ReportStep, the
	// trainer); TimeToRecover is ResumedAt less InjectedAt.
	WorldEndedAt  *float64 `json:"world_ended_at_s,omitempty"`
	Action        string   `json:"action,omitempty"`
	RecoveredAt   *float64 `json:"recovered_at_s,omitempty"`
	ResumedAt     *float64 `json:"resumed_at_s,omitempty"`
	TimeToRecover *float64 `json:"time_to_recover_s,omitempty"`
}

// NoticeReport is one rank that noticed an injected fault.
type NoticeReport struct {
	Rank  int     `json:"rank"`
	At    float64 `json:"at_s"`
	After float64 `json:"after_s"`
	Blame int     `json:"blame"`
	// Relay: the rank learned of the loss from Blame's abort, not by
	// seeing it itself.
	Relay bool   `json:"relay,omitempty"`
	Why   string `json:"why,omitempty"`
}

// worldRun is what one world's launch needs of the job around it; it rides
// in Config (unexported) from LaunchReport down to the job loop. Only the
// goroutine running the world touches rep while it runs.
type worldRun struct {
	rep     *Report
	restart int
	// seen is every failure the job loop saw, with when (cause.go).
	seen []seenFailure
	// cueNow carries checkpoint signals due at once, decided outside the
	// job loop (watchLostHosts, before a world is stopped to grow back);
	// the job loop sends them. Capacity 1; nil for a world nobody cues.
	cueNow chan checkpointCue
}

// cues returns the channel of checkpoint signals due at once (nil: none).
func (w *worldRun) cues() <-chan checkpointCue {
	if w == nil {
		return nil
	}
	return w.cueNow
}

// prepare is called with the world's plan before any rank starts: on the
// first world it checks the faults against the plan and schedules them,
// so that a fault naming a rank or host the job does not have is refused
// before launch.
func (w *worldRun) prepare(plan *Plan) error {
	if w == nil {
		return nil
	}
	rep := w.rep
	if rep.inj == nil && len(rep.faults) > 0 {
		inj, err := schedule(rep.faults, plan, rep.horizon)
		if err != nil {
			return err
		}
		rep.inj = inj
		for _, in := range inj {
			rep.byID[in.id] = len(rep.Faults)
			rep.Faults = append(rep.Faults, FaultReport{
				ID: in.id, Spec: rep.faults[in.fault].Spec, Kind: string(in.kind), Signal: injectionAction(in),
				Ranks: in.ranks, Host: in.host, PlannedAt: in.at.Seconds(), AfterSteps: in.afterSteps,
			})
		}
	}
	rep.world.JobID = plan.JobID
	rep.world.NP = plan.WorldSize
	rep.world.Hosts = nil
	for _, n := range plan.Nodes {
		rep.world.Hosts = append(rep.world.Hosts, n.Name)
	}
	return nil
}

// since is the report's clock.
func (rep *Report) since(t time.Time) float64 { return t.Sub(rep.Start).Seconds() }

func ptr[T any](v T) *T { return &v }

// next returns the first injection not yet sent, if any.
func (w *worldRun) next() (injection, bool) {
	if w == nil {
		return injection{}, false
	}
	for _, in := range w.rep.inj {
		if !w.rep.fired[in.id] {
			return in, true
		}
	}
	return injection{}, false
}

// due is how long until in is due (0 when it is late: a fault whose time
// passed during a restart fires at the start of the next world).
func (w *worldRun) due(in injection) time.Duration {
	return max(0, in.at-time.Since(w.rep.Start))
}

// sent records that the job loop asked the supervisors to inject in.
func (w *worldRun) sent(in injection) {
	w.rep.fired[in.id] = true
	f := &w.rep.Faults[w.rep.byID[in.id]]
	f.Restart = ptr(w.restart)
	f.SentAt = ptr(w.rep.since(time.Now()))
	f.Missed = "no supervisor answered (the world ended first)"
	if in.afterSteps > 0 {
		f.Missed = fmt.Sprintf("the world ended before the target reported step %d", in.afterSteps)
	}
	w.rep.pending[in.id] = ""
}

// injected records a supervisor's answer: the signal went to rank's pid at
// t, or (err set) could not.
func (w *worldRun) injected(ev wire.Event, t time.Time) *FaultReport {
	i, ok := w.rep.byID[ev.Fault]
	if !ok {
		return nil
	}
	f := &w.rep.Faults[i]
	if ev.Ev == "fault-cont" {
		f.ContinuedAt = ptr(w.rep.since(t))
		return f
	}
	if ev.Err != "" {
		if f.InjectedAt == nil {
			f.Missed = ev.Err
		}
		return f
	}
	f.Missed = ""
	if f.InjectedAt == nil {
		f.InjectedAt = ptr(w.rep.since(t))
		f.InjectedAtStep = ev.Step
	}
	f.PIDs = append(f.PIDs, ev.PID)
	return f
}

// answered records a supervisor's answer to an injection (ev, from a rank
// on host) and logs it (at warn, so that it shows by default: a fault in
// the output of a job must never be a mystery).
func (w *worldRun) answered(log zerolog.Logger, host string, ev wire.Event) {
	if w == nil {
		return
	}
	f := w.injected(ev, time.Now())
	if f == nil {
		return
	}
	l := log.Warn().Str("kind", f.Kind).Str("spec", f.Spec).Int("rank", ev.Rank).Str("host", host).
		Int("pid", ev.PID).Int("restart", w.restart).Float64("at_s", w.rep.since(time.Now()))
	if ev.Step > 0 {
		l = l.Int64("step", ev.Step)
	}
	switch {
	case ev.Ev == "fault-cont":
		l.Msg("injected stop ended: SIGCONT sent")
	case ev.Err != "":
		l.Str("why", ev.Err).Msg("fault not injected")
	default:
		l.Str("signal", f.Signal).Msg("fault injected")
	}
}

// failed records the first failure gorun saw after each injection of this
// world that has none yet, d being the detection of a batch that arrived
// at t; a fault detected by a collateral failure so far is named by d
// instead when d is a failure of its own.
func (w *worldRun) failed(d failure, t time.Time) {
	if w == nil {
		return
	}
	what := d.String()
	for id := range w.rep.pending {
		f := &w.rep.Faults[w.rep.byID[id]]
		if f.DetectedAt != nil {
			if f.detectedCollateral && !d.collateral {
				f.DetectedBy, f.detectedCollateral = what, false
			}
			continue
		}
		f.detectedCollateral = d.collateral
		from := f.InjectedAt
		if from == nil {
			// A killed host's agent may die before relaying the
			// supervisor's answer: count from the request.
			from = f.SentAt
		}
		at := w.rep.since(t)
		f.DetectedAt, f.DetectedBy, f.TimeToDetect = ptr(at), what, ptr(at-*from)
	}
}

// firstStep records a rank's first step report in this world: the world's
// first one is when the faults of the world before recovered for good.
func (w *worldRun) firstStep(rank int, step int64, t time.Time) {
	if w == nil || w.rep.world.FirstStepAt != nil {
		return
	}
	at := w.rep.since(t)
	w.rep.world.FirstStepAt = ptr(at)
	for i := range w.rep.Faults {
		f := &w.rep.Faults[i]
		if f.Action == "restarted" && f.ResumedAt == nil && f.Restart != nil && *f.Restart == w.restart-1 && f.InjectedAt != nil {
			f.ResumedAt, f.TimeToRecover = ptr(at), ptr(at-*f.InjectedAt)
		}
	}
}

// noticed records the ranks among fs whose runtime reported a lost peer,
// against each injection of this world that was injected.
func (w *worldRun) noticed(fs []failure, t time.Time) {
	if w == nil {
		return
	}
	at := w.rep.since(t)
	for id := range w.rep.pending {
		f := &w.rep.Faults[w.rep.byID[id]]
		if f.InjectedAt == nil {
			continue
		}
		for _, x := range fs {
			if x.collateral {
				why := x.why
				if len(why) > 300 {
					why = why[:300] + "..."
				}
				f.Noticed = append(f.Noticed, NoticeReport{Rank: x.rank, At: at, After: at - *f.InjectedAt, Blame: x.blame, Relay: x.relay, Why: why})
			}
		}
	}
}

// ranksStarted records that every rank of the world has started (or
// failed to).
func (w *worldRun) ranksStarted(t time.Time) {
	if w == nil || w.rep.world.RanksStartedAt != nil {
		return
	}
	at := w.rep.since(t)
	w.rep.world.RanksStartedAt = ptr(at)
	// The world before failed and this one runs: its faults' job
	// recovered now.
	for i := range w.rep.Faults {
		f := &w.rep.Faults[i]
		if f.Action == "restarted" && f.RecoveredAt == nil && f.Restart != nil && *f.Restart == w.restart-1 {
			f.RecoveredAt = ptr(at)
		}
	}
}

// validateRestarts checks what says how the job survives a failure
// (--max-restarts, the elastic bounds, --fault-tolerant and its budget and
// groups, the checkpoint signal's lead).
func (job Job) validateRestarts() error {
	if job.MaxRestarts < 0 {
		return fmt.Errorf("launcher: max restarts must not be negative, got %d", job.MaxRestarts)
	}
	if job.MinNP < 0 || job.MaxNP < 0 || (job.MaxNP > 0 && job.MinNP > job.MaxNP) {
		return fmt.Errorf("launcher: --min-np %d / --max-np %d: both must be positive and min ≤ max", job.MinNP, job.MaxNP)
	}
	if (job.MinNP > 0 || job.MaxNP > 0) && len(job.Hosts) == 0 {
		return errors.New("launcher: --min-np/--max-np need a host list (-H or -hostfile): an elastic job replaces and drops hosts")
	}
	if job.FaultTolerant {
		switch {
		case job.MaxRestarts > 0 || job.MinNP > 0 || job.MaxNP > 0:
			return errors.New("launcher: --fault-tolerant replaces failed ranks in place; it does not combine with --max-restarts or --min-np/--max-np")
		case job.MaxFailures < 0:
			return fmt.Errorf("launcher: --max-failures must not be negative, got %d", job.MaxFailures)
		case job.FTGroupSize < 0 || job.FTGroupSize > 1 && job.NP%job.FTGroupSize != 0:
			return fmt.Errorf("launcher: --fault-tolerant-group %d must divide -np %d", job.FTGroupSize, job.NP)
		}
	}
	if job.CheckpointBefore < 0 {
		return fmt.Errorf("launcher: checkpoint signal lead must not be negative, got %s", job.CheckpointBefore)
	}
	return nil
}

// launchWorlds runs the job's worlds in turn (LaunchReport): each a new
// plan over the hosts not lost, until one succeeds, a failure is not
// restartable, or the restarts allowed are spent.
func launchWorlds(ctx context.Context, cfg Config, job Job, rep *Report) error {
	if err := checkJob(cfg, job, rep); err != nil {
		return err
	}
	if cfg.Timeout > 0 {
		rep.horizon = cfg.Timeout
	}
	id := DetectLocal()
	rep.Start = time.Now()
	el := newElastic(job)
	if job.ReadmitEvery < 0 || (job.ReadmitEvery > 0 && el == nil) {
		return fmt.Errorf("launcher: --readmit-every %s: must not be negative, and needs an elastic job (--min-np/--max-np)", job.ReadmitEvery)
	}
	var prev error // the last world's error
	grown := 0     // restarts made to grow back, not counted against MaxRestarts
	for restart := 0; ; restart++ {
		j, err := nextWorldJob(ctx, cfg, job, el, rep, restart)
		if err != nil {
			var ee *ElasticError
			if errors.As(err, &ee) {
				ee.Last = prev
			}
			return err
		}
		c, w := beginWorld(cfg, rep, restart)
		// A world without some lost host asks for them while it runs
		// (ReadmitEvery); when one answers, wctx ends with errGrow.
		wctx, stopAsking := watchLostHosts(ctx, cfg, job, w)
		if needsHostAgents(c, j.Hosts, id) {
			err = launchOnHosts(wctx, c, j, id)
		} else {
			err = launchLocal(wctx, c, j)
		}
		answered := stopAsking()
		growing := len(answered) > 0 && ctx.Err() == nil && err != nil
		if growing {
			err = &GrowError{Hosts: answered, Err: err}
		}
		var te *outcome.TimeoutError
		if errors.As(err, &te) {
			te.After = cfg.Timeout // the job's, not what was left of it
		}
		ended := rep.since(time.Now())
		endWorld(rep, w, el, err, ended)
		again := err != nil && (restartable(err) || (el != nil && el.lostHost(err) != "")) && restart-grown < job.MaxRestarts && ctx.Err() == nil
		action := "job ended"
		switch {
		case growing:
			again, action = true, "restarted to grow"
			grown++
			readmit(ctx, cfg, rep, restart+1, answered)
		case again:
			action = "restarted"
		case err == nil:
			action = "job succeeded"
		}
		settleFaults(rep, ended, action, again)
		if !again {
			return err
		}
		prev = err
		rep.Restarts++
		if growing {
			cfg.Logger.Warn().Int("restart", restart+1).Strs("hosts", answered).Msg("lost hosts answer again; restarting the world to grow back")
			continue
		}
		cfg.Logger.Warn().Int("restart", restart+1).Int("max_restarts", job.MaxRestarts).Err(err).
			Msg("the world failed; restarting it")
	}
}

// checkJob refuses a job launchWorlds cannot run: a Config that does not
// validate, no program, restart settings that contradict each other, or a
// checkpoint signal no program can catch.
func checkJob(cfg Config, job Job, rep *Report) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if len(job.Argv) == 0 {
		return errors.New("launcher: no program given")
	}
	if err := job.validateRestarts(); err != nil {
		return err
	}
	if s := rep.ckptSig; s == syscall.SIGKILL || s == syscall.SIGSTOP || s < 0 || s > 64 {
		return fmt.Errorf("launcher: checkpoint signal %s cannot be caught by a program; use e.g. SIGUSR1", unixSignalName(s))
	}
	return nil
}

// nextWorldJob is job as world restart runs it: for an elastic job (el
// not nil), over the hosts not lost, after a restart rereading the
// hostfile and taking back the lost hosts that answer again; and with the
// environment that tells every rank which restart this is, how many are
// allowed, its checkpoint signal and the data-plane faults armed in it.
func nextWorldJob(ctx context.Context, cfg Config, job Job, el *elastic, rep *Report, restart int) (Job, error) {
	j := job
	if el != nil {
		if restart > 0 && job.Hostfile != "" {
			reloadHosts(cfg, el, job.Hostfile, rep, restart)
		}
		if restart > 0 {
			readmit(ctx, cfg, rep, restart, nil)
		}
		var err error
		if j.Hosts, j.NP, err = el.world(rep.out); err != nil {
			return Job{}, err
		}
	}
	n := strconv.Itoa(restart)
	// Last, so that they win over a -x of the same name.
	j.Export = append(slices.Clone(job.Export),
		RestartCountEnv+"="+n, TorchRestartCountEnv+"="+n,
		TorchMaxRestartsEnv+"="+strconv.Itoa(job.MaxRestarts),
		rankenv.CheckpointSignal+"="+unixSignalName(rep.ckptSig))
	// Data-plane faults are armed in the ranks (inject_chaos.go).
	j.Export = append(j.Export, netFaultEnv(job.Faults, rep.Start, time.Since(rep.Start), restart)...)
	return j, nil
}

// beginWorld opens world restart's entry in rep and returns the Config it
// runs under: its worldRun attached, and after a restart the part of
// --timeout the job has left.
func beginWorld(cfg Config, rep *Report, restart int) (Config, *worldRun) {
	c := cfg
	w := &worldRun{rep: rep, restart: restart, cueNow: make(chan checkpointCue, 1)}
	c.world = w
	rep.Worlds = append(rep.Worlds, WorldReport{Restart: restart, StartedAt: rep.since(time.Now())})
	rep.world = &rep.Worlds[len(rep.Worlds)-1]
	rep.pending = map[int]string{}
	if cfg.Timeout > 0 && restart > 0 {
		// --timeout bounds the whole job, restarts included.
		c.Timeout = cfg.Timeout - time.Since(rep.Start)
		if c.Timeout <= 0 {
			c.Timeout = time.Nanosecond
		}
	}
	return c, w
}

// endWorld records how world w ended (err, at ended seconds into the
// job) and, for an elastic job, the host whose loss ended it, which the
// next worlds leave out.
func endWorld(rep *Report, w *worldRun, el *elastic, err error, ended float64) {
	rep.world.EndedAt = ended
	rep.world.Result = "succeeded"
	if err != nil {
		rep.world.Result = err.Error()
		rep.world.Cause = w.cause(err)
	}
	if el == nil {
		return
	}
	if h := el.lostHost(err); h != "" && !slices.Contains(rep.out, h) {
		rep.out = append(rep.out, h)
		rep.lostIn[h] = w.restart
		if !slices.Contains(rep.LostHosts, h) {
			rep.LostHosts = append(rep.LostHosts, h)
		}
	}
}

// settleFaults closes the world's faults still pending: one injected gets
// the world's end and what the job did next (action); one not injected yet
// and keyed to the program's step is armed again when the job restarts
// (again).
func settleFaults(rep *Report, ended float64, action string, again bool) {
	for id := range rep.pending {
		f := &rep.Faults[rep.byID[id]]
		if f.InjectedAt != nil {
			f.WorldEndedAt, f.Action = ptr(ended), action
		} else if again && f.AfterSteps > 0 {
			// Keyed to the program's step, which a resuming
			// program carries into the next world: armed again
			// there, rather than lost with a world that ended
			// before the target got that far.
			rep.fired[id] = false
		}
	}
}

// readmitAfter is how many restarts a lost host stays out before gorun
// asks it again: the world right after its loss runs without it (a host
// that just fell over is not retried at once: its agent would most often
// fail again, costing the restart), later worlds ask.
const readmitAfter = 2

// readmitWait bounds one restart's questions to lost hosts: an agent
// start over ssh takes 0.3-3 s on the test hosts under load; a host that
// does not answer in this time stays out.
const readmitWait = 10 * time.Second

// readmit asks each host left out for readmitAfter restarts or more
// whether it answers again (an agent starts there and authenticates, as
// gorun doctor checks) and takes back those that do, so that the world
// grows back toward --max-np at a restart boundary, as torchrun's elastic
// agent re-forms its rendezvous with a node that comes back.
//
// answered, when not nil, are hosts that answered already (while the last
// world ran: watchLostHosts); they are taken back without asking again.
func readmit(ctx context.Context, cfg Config, rep *Report, restart int, answered []string) {
	if answered == nil {
		var ask []string
		for _, h := range rep.out {
			if restart-rep.lostIn[h] >= readmitAfter {
				ask = append(ask, h)
			}
		}
		answered = askHosts(ctx, cfg, ask)
	}
	for _, h := range answered {
		rep.out = slices.DeleteFunc(rep.out, func(o string) bool { return o == h })
		delete(rep.lostIn, h)
		rep.Readmitted = append(rep.Readmitted, ReadmitReport{Host: h, Restart: restart, At: rep.since(time.Now())})
		cfg.Logger.Warn().Str("host", h).Int("restart", restart).Msg("lost host answers again; taken back into the world")
	}
}

// askHosts returns the hosts among ask whose agent starts and
// authenticates within readmitWait (gorun doctor's start-up).
func askHosts(ctx context.Context, cfg Config, ask []string) []string {
	if len(ask) == 0 {
		return nil
	}
	hosts := make([]Host, len(ask))
	for i, h := range ask {
		hosts[i] = Host{Name: h, Slots: 1}
	}
	qctx, cancel := context.WithTimeout(ctx, readmitWait)
	defer cancel()
	dcfg := cfg
	dcfg.Stdout, dcfg.Stderr = io.Discard, io.Discard
	d, err := Doctor(qctx, dcfg, hosts)
	if d == nil {
		cfg.Logger.Warn().Err(err).Msg("could not ask the lost hosts whether they answer again")
		return nil
	}
	var ok []string
	for _, c := range d.Hosts {
		if c.OK() {
			ok = append(ok, c.Host)
		} else {
			cfg.Logger.Info().Str("host", c.Host).Strs("problems", c.Problems).Msg("lost host still does not answer; left out")
		}
	}
	return ok
}

// errGrow ends a world whose lost hosts answer again (watchLostHosts).
var errGrow = errors.New("lost hosts answer again: the world restarts to grow back")

// watchLostHosts returns the context world w runs under and a function
// that ends the watch and returns the hosts that answered. With
// Job.ReadmitEvery set and hosts left out of this world, a goroutine asks
// them every ReadmitEvery (the first time one interval into the world: a
// host lost at the restart just made is not asked at once, see
// readmitAfter); when any answers, the world's context ends with errGrow,
// which stops the world as a canceled job is stopped. With
// Job.CheckpointBefore set, the ranks first get the checkpoint signal
// (through w's cues) and that long to act on it, so that the grown world
// resumes from a checkpoint taken just before the stop rather than from
// the last periodic one: the same notice a timed kill gets.
func watchLostHosts(ctx context.Context, cfg Config, job Job, w *worldRun) (context.Context, func() []string) {
	rep, restart := w.rep, w.restart
	if job.ReadmitEvery <= 0 || len(rep.out) == 0 {
		return ctx, func() []string { return nil }
	}
	wctx, cancel := context.WithCancelCause(ctx)
	ask := slices.Clone(rep.out)
	var answered []string
	done := make(chan struct{})
	go func() { // owned: the returned function waits for it
		defer close(done)
		t := time.NewTicker(job.ReadmitEvery)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			if ok := askHosts(wctx, cfg, ask); len(ok) > 0 && wctx.Err() == nil {
				answered = ok
				if lead := rep.ckptBefore; lead > 0 {
					w.cueNow <- checkpointCue{at: time.Now(), why: "before growing back (" + strings.Join(ok, ", ") + " answered again)"}
					t := time.NewTimer(lead)
					select {
					case <-t.C:
					case <-wctx.Done():
						// The world ended on its own meanwhile: its
						// error decides, and the hosts are taken
						// back at the restart all the same.
					}
					t.Stop()
				}
				cfg.Logger.Warn().Strs("hosts", ok).Int("restart", restart).Msg("lost hosts answer again; stopping the world to grow back")
				cancel(errGrow)
				return
			}
		}
	}()
	return wctx, func() []string {
		cancel(nil)
		<-done
		return answered
	}
}

// GrowError ends a world that gorun stopped because lost hosts answered
// again: the next world grows back with them. It is never a job's error.
type GrowError struct {
	Hosts []string
	// Err is how the stopped world ended.
	Err error
}

func (e *GrowError) Error() string {
	return fmt.Sprintf("launcher: stopped to grow back: host %s answered again (%v)", strings.Join(e.Hosts, ", "), e.Err)
}

func (e *GrowError) Unwrap() error { return e.Err }

// reloadHosts reads the hostfile again before world restart and applies it
// to el (elastic.reload); hosts removed from it are dropped from the lost
// hosts too: nobody asks them back. A failure keeps the list and is
// reported, not fatal: a file being edited may be caught half-written, and
// the job has a working host list.
func reloadHosts(cfg Config, el *elastic, path string, rep *Report, restart int) {
	hosts, err := hostfile.Parse(path)
	if err != nil {
		rep.HostfileChanges = append(rep.HostfileChanges, HostfileChange{Restart: restart, Error: err.Error()})
		cfg.Logger.Warn().Err(err).Str("hostfile", path).Msg("could not read the hostfile again; the next world uses the hosts it had")
		return
	}
	ch := el.reload(hosts)
	if len(ch.Added)+len(ch.Removed)+len(ch.Resized) == 0 {
		return
	}
	ch.Restart = restart
	rep.HostfileChanges = append(rep.HostfileChanges, ch)
	for _, h := range ch.Removed {
		rep.out = slices.DeleteFunc(rep.out, func(o string) bool { return o == h })
		delete(rep.lostIn, h)
	}
	cfg.Logger.Warn().Strs("added", ch.Added).Strs("removed", ch.Removed).Strs("resized", ch.Resized).Int("restart", restart).
		Msg("the hostfile changed; the next world uses it")
}

// elastic is the host policy of a job with --min-np/--max-np.
//
// Hosts are taken in the order given, each with its slots, until the
// world's size is reached; the rest are spares. When a world ends with a
// host lost (its agent's connection dropped, or, at a restart, its agent
// could not be started), that host is left out of the next world, as
// torchrun's elastic agent drops a node whose agent stopped answering.
// The next world then takes its slots from the spares, or, when there are
// not enough, runs on fewer ranks, down to MinNP. At each later restart
// gorun asks the hosts left out whether they answer again (readmit) and
// takes back those that do: the world grows back toward MaxNP. Every world is a new
// rendezvous with a new job id and secret (and GORUN_RESTART_COUNT as its
// generation, rendezvous.Config.Generation), so no member of an older world
// can join it.
type elastic struct {
	hosts    []Host
	min, max int
	// everySlot: neither --max-np nor -np was given, so the maximum is
	// every slot of the host list, and follows it when it changes.
	everySlot bool
}

// newElastic returns the policy, or nil when the job is not elastic.
func newElastic(job Job) *elastic {
	if job.MinNP <= 0 && job.MaxNP <= 0 {
		return nil
	}
	e := &elastic{hosts: job.Hosts, min: max(job.MinNP, 1), max: cmp.Or(job.MaxNP, job.NP)}
	if e.max == 0 {
		e.everySlot = true
		e.max = slotsOf(job.Hosts)
	}
	return e
}

func slotsOf(hosts []Host) int {
	n := 0
	for _, h := range hosts {
		n += h.Slots
	}
	return n
}

// reload replaces the host list with hosts (the hostfile read again) and
// says what changed. The order of hosts is the file's: hosts earlier in it
// are taken first, the rest are spares, as at the start.
func (e *elastic) reload(hosts []Host) HostfileChange {
	var ch HostfileChange
	old := make(map[string]Host, len(e.hosts))
	for _, h := range e.hosts {
		old[h.Name] = h
	}
	for _, h := range hosts {
		o, had := old[h.Name]
		switch {
		case !had:
			ch.Added = append(ch.Added, h.Name)
		case o.Slots != h.Slots || o.MaxSlots != h.MaxSlots:
			ch.Resized = append(ch.Resized, h.Name)
		}
		delete(old, h.Name)
	}
	for _, h := range e.hosts {
		if _, gone := old[h.Name]; gone {
			ch.Removed = append(ch.Removed, h.Name)
		}
	}
	e.hosts = hosts
	if e.everySlot {
		e.max = slotsOf(hosts)
	}
	return ch
}

// world returns the hosts and size of the next world, leaving out lost.
func (e *elastic) world(lost []string) ([]Host, int, error) {
	var hosts []Host
	slots := 0
	for _, h := range e.hosts {
		if slices.Contains(lost, h.Name) {
			continue
		}
		hosts = append(hosts, h)
		slots += h.Slots
	}
	np := min(e.max, slots)
	if np < e.min {
		return nil, 0, &ElasticError{MinNP: e.min, Available: slots, Lost: slices.Clone(lost)}
	}
	return hosts, np, nil
}

// lostHost names the host whose loss ended a world ("" for any other end).
func (e *elastic) lostHost(err error) string {
	var hl *outcome.HostLostError
	if errors.As(err, &hl) {
		return hl.Host
	}
	var he *outcome.HostError
	if errors.As(err, &he) {
		return he.Host
	}
	return ""
}

// ElasticError is an elastic job that lost so many hosts that fewer than
// MinNP ranks can be placed on the rest.
type ElasticError struct {
	MinNP, Available int
	Lost             []string
	// Last is the error that ended the last world.
	Last error
}

func (e *ElasticError) Error() string {
	s := fmt.Sprintf("launcher: elastic job: %d slots left on the hosts not lost, --min-np is %d (lost: %s)",
		e.Available, e.MinNP, strings.Join(e.Lost, ", "))
	if e.Last != nil {
		s += "; the last world ended with: " + e.Last.Error()
	}
	return s
}

// Unwrap is the last world's error.
func (e *ElasticError) Unwrap() error { return e.Last }

// ExitCode is the last world's, else 1.
func (e *ElasticError) ExitCode() int {
	if e.Last != nil {
		return exitCodeOf(e.Last)
	}
	return 1
}

// restartable reports whether err is a failure of the job's ranks or
// hosts, which a new world may survive, rather than a decision (timeout,
// signal) or a failure to launch at all.
func restartable(err error) bool {
	var (
		re *outcome.RankExitError
		se *outcome.StartError
		hl *outcome.HostLostError
		me *outcome.MPIError
		ce *outcome.CollateralError
		fe *outcome.FrozenError
	)
	return errors.As(err, &re) || errors.As(err, &se) || errors.As(err, &hl) || errors.As(err, &me) || errors.As(err, &ce) || errors.As(err, &fe)
}

// exitCodeOf is the exit code gorun gives err (1 when it carries none).
func exitCodeOf(err error) int {
	var coder interface{ ExitCode() int }
	if errors.As(err, &coder) {
		return coder.ExitCode()
	}
	return 1
}

// ParseSignal reads a signal as gorun's flags write it: KILL, SIGKILL,
// kill or a number.
func ParseSignal(v string) (syscall.Signal, error) { return fault.ParseSignal(v) }

// unixSignalName is "SIGKILL" for syscall.SIGKILL.
func unixSignalName(s syscall.Signal) string {
	if n := unix.SignalName(s); n != "" {
		return n
	}
	return "signal " + strconv.Itoa(int(s))
}
