package wire

import (
	"os"
	"time"
)

// Msg is every JSON message; T says which fields are set.
type Msg struct {
	// T is "job" (gorun: what the agent must check), "hello" (agent: what
	// it found), "spec" (gorun: the ranks to start), "cmd" (gorun: a
	// Cmd), "event" (agent: an Event),
	// "supervisor-lost" (agent, Err: how its job supervisor died, just
	// before it hangs up), "spare" (gorun: this rankless agent is a spare
	// host; both sides ping and keep a lease from now on: idle.go).
	T     string     `json:"t"`
	Job   *Job       `json:"job,omitempty"`
	Hello *Hello     `json:"hello,omitempty"`
	Ranks []HostRank `json:"ranks,omitempty"`
	Cmd   *Cmd       `json:"cmd,omitempty"`
	Event *Event     `json:"event,omitempty"`
	// Peers (gorun, "probe") lists the hosts to probe; Probed (agent,
	// "probed") maps each to "" when reached or why not. Doctor runs only.
	Peers  []PeerAddr        `json:"peers,omitempty"`
	Probed map[string]string `json:"probed,omitempty"`
	// Child (agent, "child-exit") reports a child launch that ended.
	Child *ChildExit `json:"child,omitempty"`
	// File (gorun, "file") announces a preloaded file's data frames; Err
	// (agent, "file-bad") says why a file was refused.
	File *FileHeader `json:"file,omitempty"`
	Err  string      `json:"err,omitempty"`
	// PMI (gorun, "spec") is the job's PMI description when its ranks
	// are served PMI (launcher/pmi.go).
	PMI *PMIJob `json:"pmi,omitempty"`
}

// ChildExit is a child launcher that exited before setup was over.
type ChildExit struct {
	Host string `json:"host"`
	Code int    `json:"code"`
	Tail string `json:"tail"`
}

// Job is what a host agent learns right after authenticating.
type Job struct {
	// Version is gorun's version; the agent reports its own in hello and
	// gorun refuses a mismatch.
	Version string `json:"version"`
	// Program is the executable every rank runs, as resolved on gorun's
	// host (an absolute path) or as the user wrote a bare name (looked up
	// in the host's PATH).
	Program string   `json:"program"`
	Argv    []string `json:"argv"`
	// Dir is the ranks' working directory; a host where it does not exist
	// uses the home directory, as mpirun does.
	Dir   string        `json:"dir"`
	Grace time.Duration `json:"grace"`
	// Lease is how long each end of the connection tolerates silence
	// from the other (launcher's Config.Lease); gorun always sets it, and
	// an agent refuses a job without one.
	Lease    time.Duration `json:"lease"`
	LogLevel int8          `json:"log_level"`
	// Iface is the user's --iface, "" for the route-based choice.
	Iface string `json:"iface,omitempty"`
	// Doctor asks for pre-flight checks instead of a job (launcher's
	// doctor.go; the agent's side is launcher/hostagent's doctor.go).
	Doctor bool `json:"doctor,omitempty"`
	// Launch lists the agents this agent starts in turn (tree fan-out):
	// each child's host and full command. The agent reports a child whose
	// command exits ("child-exit") until gorun says "setup-over".
	Launch []ChildLaunch `json:"launch,omitempty"`
	// Preload lists files gorun offers (launcher/preload); the agent asks for
	// those it lacks in hello.Need.
	Preload []PreloadFile `json:"preload,omitempty"`
	// Stdin says gorun forwards its stdin to rank 0 (stdin frames);
	// otherwise every rank reads /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// NoPMI says the ranks are not served PMI (--pmi none), so an Open
	// MPI program is not refused (launcher/program).
	NoPMI bool `json:"no_pmi,omitempty"`
	// Flight asks the agent to give its ranks a flight-record directory
	// and send gorun what they write there (launcher/flight,
	// launcher/hostagent).
	Flight bool `json:"flight,omitempty"`
	// Ranks is how many ranks the plan puts on this host (placement is
	// known before any hello), so the host refuses a count it cannot
	// serve before anything starts; 0 for doctor.
	Ranks int `json:"ranks,omitempty"`
	// Respawn: a --fault-tolerant job; the supervisor keeps what it
	// needs to start a rank again (launcher/supervisor/ft.go).
	Respawn bool `json:"respawn,omitempty"`
}

// ChildLaunch is one agent that a host agent starts for gorun.
type ChildLaunch struct {
	Host string   `json:"host"`
	Argv []string `json:"argv"`
	// FastKex asks the parent agent to put curve25519 first in its ssh
	// client's key exchange list when that client defaults to the slower
	// hybrid (launcher/sshkex); the parent's ssh, not gorun's, decides.
	FastKex bool `json:"fast_kex,omitempty"`
}

// Hello is a host agent's report before any rank starts.
type Hello struct {
	Version  string `json:"version"`
	Hostname string `json:"hostname"`
	PID      int    `json:"pid"`
	// Iface and Addr are the interface and address peers reach this host
	// through.
	Iface string `json:"iface"`
	Addr  string `json:"addr"`
	Why   string `json:"why"`
	// MasterPort and RdzvPort are free on Addr and held until the spec
	// arrives; gorun uses those of the host that runs rank 0.
	MasterPort int `json:"master_port"`
	RdzvPort   int `json:"rdzv_port"`
	// Program is the executable the ranks will run here.
	Program string `json:"program"`
	// Err, when set, is why this host cannot run the job (ErrKind says
	// what failed: "program", "iface", "ports").
	Err     string `json:"err,omitempty"`
	ErrKind string `json:"err_kind,omitempty"`

	// Doctor runs only: the port this host answers peer probes on (TCP
	// and UDP, on Addr) and the GPUs it sees.
	ProbePort int `json:"probe_port,omitempty"`
	GPUs      int `json:"gpus,omitempty"`
	// Cgroup (doctor only) says whether jobs on the host get a job
	// cgroup, and where, or why not (cgroupStatus).
	Cgroup string `json:"cgroup,omitempty"`
	// Need lists the SHA-256s of offered files this host lacks.
	Need []string `json:"need,omitempty"`
}

// PeerAddr names a host and where it answers probes (doctor runs).
type PeerAddr struct {
	Host string `json:"host"`
	Addr string `json:"addr"`
}

// HostRank is one rank to start: its number and the variables gorun
// sets; the agent adds its own environment underneath.
type HostRank struct {
	Rank int      `json:"rank"`
	Env  []string `json:"env"`
	// GPU is the index gorun assigned the rank among the GPUs its host
	// shows, nil for none (SupervisorRank.GPU).
	GPU *int `json:"gpu,omitempty"`
}

// PreloadFile describes one file gorun offers.
type PreloadFile struct {
	Name    string      `json:"name"` // base name
	Size    int64       `json:"size"`
	SHA256  string      `json:"sha256"`
	Mode    os.FileMode `json:"mode"`
	Program bool        `json:"program,omitempty"`
}

// FileHeader announces Compressed bytes of data frames for one file.
type FileHeader struct {
	SHA256     string `json:"sha256"`
	Compressed int    `json:"compressed"`
}
