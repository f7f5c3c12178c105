package wire

import (
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/rs/zerolog"
)

// SupervisorSpec is the first message from gorun: what to start.
type SupervisorSpec struct {
	// Grace is how long strays get between SIGTERM and SIGKILL once every
	// rank has exited.
	Grace time.Duration `json:"grace"`
	// LogLevel is the zerolog level for the supervisor's own log on stderr.
	LogLevel zerolog.Level `json:"log_level"`
	// Ranks are started in order.
	Ranks []SupervisorRank `json:"ranks"`
	// KeepOnSignal makes the supervisor survive SIGTERM, SIGINT and SIGHUP
	// instead of killing the job: under srun, SLURM signals every process
	// of the step, and the grace period is gorun's to apply.
	KeepOnSignal bool `json:"keep_on_signal,omitempty"`
	// PMI, when set, makes the supervisor serve MPI's PMI to its ranks
	// (launcher/pmi.go).
	PMI *PMIJob `json:"pmi,omitempty"`
	// RemoveDir, when set, is removed when the supervisor ends after gorun
	// died: the job's temporary flight-record directory, which must not
	// outlive a gorun that was SIGKILLed.
	RemoveDir string `json:"remove_dir,omitempty"`
	// ClientLease, when set, is how long the supervisor tolerates
	// silence on its command pipe before it kills the job as if its
	// client had died: a host agent that is stopped (SIGSTOP) keeps the
	// pipe open, so EOF alone would let its ranks run on. The client
	// sends a "ping" every quarter of it. Only host agents set it: a
	// local gorun stopped with Ctrl-Z must not lose its job.
	ClientLease time.Duration `json:"client_lease,omitempty"`
	// Cgroup, when set, is the job cgroup the client made and moved this
	// supervisor into (launcher/supervisor/cgroup_linux.go). The client removes
	// it once the supervisor exited; a supervisor whose client died removes it
	// on its way out, after killing every descendant.
	Cgroup string `json:"cgroup,omitempty"`
	// Respawn keeps every rank's spec and pipes so that gorun
	// --fault-tolerant can start a rank again ("respawn";
	// launcher/supervisor/ft.go).
	Respawn bool `json:"respawn,omitempty"`
}

// SupervisorRank is one process to start. Descriptor numbers refer to the
// supervisor's inherited descriptors; -1 means /dev/null.
type SupervisorRank struct {
	Rank   int      `json:"rank"`
	Path   string   `json:"path"`
	Argv   []string `json:"argv"`
	Env    []string `json:"env"`
	Dir    string   `json:"dir,omitempty"`
	Stdin  int      `json:"stdin"`
	Stdout int      `json:"stdout"`
	Stderr int      `json:"stderr"`
	// GPU is the index gorun assigned the rank among the GPUs the host
	// shows (its CUDA_VISIBLE_DEVICES says the index), nil for none; the
	// supervisor turns it into the device the index stands for
	// (visibleDevice).
	GPU *int `json:"gpu,omitempty"`
}

// Cmd is a later message from gorun.
type Cmd struct {
	// Op is "signal" (send Signal to the process groups of Ranks, all
	// running ranks when empty), "kill" (SIGKILL everything, now) or
	// "bye" (gorun is about to close the pipe alive and cleans up after
	// the job itself; see SupervisorSpec.RemoveDir). A host agent answers
	// "flight" (send the flight records written since the last SIGUSR2 or
	// "flight-signal") and "flight-signal" (SIGUSR2 to the ranks that dump
	// on it) itself; its supervisor never sees them (launcher/hostagent).
	Op     string `json:"op"`
	Signal int    `json:"signal,omitempty"`
	Ranks  []int  `json:"ranks,omitempty"`
	// Epoch and KVS belong to "pmi-release": PMI barrier Epoch is over
	// (KVS, kept for older hosts' sake, is no longer filled: values go
	// out on demand). Key, Value and Found are "pmi-value", the answer to
	// a "pmi-get" (launcher/pmi.go), with the batch that came with it in KVS;
	// Batched says the value is in a batch sent to this host before, and
	// so not repeated.
	Epoch   int               `json:"epoch,omitempty"`
	KVS     map[string]string `json:"kvs,omitempty"`
	Key     string            `json:"key,omitempty"`
	Value   string            `json:"value,omitempty"`
	Found   bool              `json:"found,omitempty"`
	Batched bool              `json:"batched,omitempty"`
	// "inject" (launcher/inject.go) sends Signal to the process group of each
	// of Ranks that this supervisor runs, answering an "injected" event per
	// rank, and after For (when set) SIGCONT, answered by "fault-cont". Fault
	// is the injection's id, echoed in the events. KillHost marks a kill-host
	// injection: the supervisor echoes it in its "injected" events, and a host
	// agent relaying one kills itself, so that the host is gone whole: ranks,
	// agent, and with the agent's connection, the host as gorun sees it.
	For      time.Duration `json:"for,omitempty"`
	Fault    int           `json:"fault,omitempty"`
	KillHost bool          `json:"kill_host,omitempty"`
	// Period set makes an "inject" a slow (launcher/supervisor/slow.go): the
	// rank is stopped for Duty of every Period, for For (0: until it exits).
	Duty   float64       `json:"duty,omitempty"`
	Period time.Duration `json:"period,omitempty"`
	// AfterSteps, when positive, makes "inject" wait: the supervisor
	// keeps the fault and fires it on the first of Ranks (of its own) to
	// report finishing this step (collateral.Step lines).
	AfterSteps int64 `json:"after_steps,omitempty"`
	// DumpFirst on a "signal" is for a host agent: it first has its
	// ranks write their flight records (SIGUSR2 to those that dump on
	// it, then up to flight.BeforeStop for them to finish), and only then
	// relays the signal. gorun sets it on the teardown of a failed
	// multi-host job, as it waits itself for a local job's ranks.
	DumpFirst bool `json:"dump_first,omitempty"`
	// Incarnation is "respawn"'s: the number of the rank's next process
	// (launcher/supervisor/ft.go). "release" drops what the supervisor kept of
	// Ranks to start them again.
	Incarnation int `json:"incarnation,omitempty"`
}

// Event is a message from the supervisor.
type Event struct {
	// Ev is "started", "failed" (could not start; Err says why), "exited"
	// (Code or Signal set), "frozen" (stopped past its lease: Frozen is
	// the state letter, Err says for how long; launcher/supervisor/freeze.go),
	// "step" (the rank's first step report, Step its number) or "done" (every
	// rank and stray is gone; last).
	Ev     string `json:"ev"`
	Rank   int    `json:"rank"`
	PID    int    `json:"pid,omitempty"`
	Code   int    `json:"code,omitempty"`
	Signal int    `json:"signal,omitempty"`
	Err    string `json:"err,omitempty"`
	// Strays counts processes left behind by ranks that the supervisor stopped
	// (on "done").
	Strays int `json:"strays,omitempty"`
	// PMI events (launcher/pmi.go): "pmi-fence" (every rank of this supervisor
	// entered PMI barrier Epoch; KVS holds its puts), "pmi-get" (a rank
	// asked for Key, which this host does not hold) and "pmi-abort" (Rank
	// called PMI_Abort with Code; Err holds its message). Unfinalized marks
	// an "exited" rank that had started PMI but not finalized it.
	Epoch       int               `json:"epoch,omitempty"`
	KVS         map[string]string `json:"kvs,omitempty"`
	Key         string            `json:"key,omitempty"`
	Unfinalized bool              `json:"unfinalized,omitempty"`
	// Collateral marks an "exited" rank whose runtime reported, before
	// it exited, that it failed because another rank was lost or
	// aborted (internal/collateral): its exit is a consequence, not a
	// cause. Blame is the world rank it held responsible (-1: unknown)
	// and Err the runtime's words.
	Collateral bool `json:"collateral,omitempty"`
	Blame      int  `json:"blame,omitempty"`
	// Frozen marks an "exited" rank that was stopped (SIGSTOP, a
	// debugger: /proc state "T" or "t", the letter given) when the
	// teardown reached it: frozen, not dead, which its peers cannot tell
	// apart (their lease only says it fell silent).
	Frozen string `json:"frozen,omitempty"`
	// Relay marks a collateral report whose rank learned of the loss from
	// Blame's abort, not by seeing it (collateral.Report.Relay).
	Relay bool `json:"relay,omitempty"`
	// Desync marks a collateral report of a desync (collateral.Report.Desync).
	Desync bool `json:"desync,omitempty"`
	// At is when an "exited" rank was reaped (Unix ns, this host's clock):
	// the supervisor reaps at each SIGCHLD, so it is the exit time to
	// within the supervisor's wake-up. Every exit of one reap pass gets
	// the pass's time: their order within it is not known
	// (launcher/jobloop.go's earlier).
	At int64 `json:"at,omitempty"`
	// Fault is the injection an "injected" or "fault-cont" event answers;
	// Err is set on "injected" when the rank was not running.
	Fault    int  `json:"fault,omitempty"`
	KillHost bool `json:"kill_host,omitempty"`
	// Step is, on "injected", the last step the target had reported
	// (0: none).
	Step int64 `json:"step,omitempty"`
	// Flight, on a host agent's "flight" event, is a flight record dump
	// one of its ranks wrote; FlightEnd marks the agent's last "flight"
	// event answering a "flight" command (launcher/hostagent).
	Flight    *comm.FlightDump `json:"flight,omitempty"`
	FlightEnd bool             `json:"flight_end,omitempty"`
	// Node is the plan node whose host agent relayed the event (multi-host
	// jobs); set by gorun, never sent. A "lost" event, made by gorun, says
	// that node's host agent is gone (Err says how).
	Node int `json:"-"`
}

// PMIJob is what a supervisor needs to serve PMI: sent in SupervisorSpec (and,
// for other hosts, in the "spec" wire message).
type PMIJob struct {
	KVSName string `json:"kvs"`
	Size    int    `json:"size"`
	Mapping string `json:"mapping"`
	// Port selects the PMI_PORT mode instead of PMI_FD.
	Port bool `json:"port,omitempty"`
}
