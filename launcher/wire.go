package launcher

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gorun-hpc/gorun/internal/handshake"
)

// The connection between gorun and a host agent.
//
// A host agent (see hostagent.go) dials gorun's listener and both sides
// prove that they hold the job secret before anything else is exchanged:
//
//	agent → gorun   GORUN-AGENT/<proto> <job> <host> <nonceA>\n
//	gorun → agent   OK <nonceB> <mac("gorun/<proto>")>\n   (or NO <reason>\n)
//	agent → gorun   <mac("agent/<proto>")>\n
//
// where mac(role) is HMAC-SHA256 keyed with the secret over role, job, host
// and both nonces, each NUL-terminated (internal/handshake), so neither side can be replayed or impersonated without
// the secret, and <proto> is the protocol the agent claims. gorun acts on
// that claim only after the agent's MAC checked out: a stranger's hello
// that claims another protocol is dropped like any other stranger. The secret itself never crosses the connection. Then frames
// flow both ways: a type byte, a 4-byte big-endian length and a payload.
// Messages are JSON (frameMsg), rank output is raw bytes (frameOutput), and
// pings (framePing) keep the lease alive on both sides: a side that hears
// nothing for the lease period treats the other as gone. The payload is not
// encrypted; the job secret protects the job from strangers, not the
// output from someone who can read the network.

// wireProtocol is bumped on any incompatible change to the connection
// after the handshake (2: the claimed protocol is bound into the
// handshake's MACs, so protocol-1 agents fail to authenticate).
const wireProtocol = "2"

const (
	frameMsg    byte = 'M'
	frameOutput byte = 'O'
	framePing   byte = 'P'
	frameData   byte = 'D' // preloaded file contents (preload.go)
	frameStdin  byte = 'I' // rank 0's stdin; an empty payload is EOF
)

// maxFrame bounds a frame a peer may announce; output is sent in pieces of
// at most 64 KiB (hostagent.go: pumpOutput).
const maxFrame = 8 << 20

// wireMsg is every JSON message; T says which fields are set.
type wireMsg struct {
	// T is "job" (gorun: what the agent must check), "hello" (agent: what
	// it found), "spec" (gorun: the ranks to start), "cmd" (gorun: an
	// supervisorCmd), "event" (agent: a supervisorEvent),
	// "supervisor-lost" (agent, Err: how its job supervisor died, just
	// before it hangs up).
	T     string           `json:"t"`
	Job   *remoteJob       `json:"job,omitempty"`
	Hello *remoteHello     `json:"hello,omitempty"`
	Ranks []remoteRank     `json:"ranks,omitempty"`
	Cmd   *supervisorCmd   `json:"cmd,omitempty"`
	Event *supervisorEvent `json:"event,omitempty"`
	// Peers (gorun, "probe") lists the hosts to probe; Probed (agent,
	// "probed") maps each to "" when reached or why not. Doctor runs only.
	Peers  []peerAddr        `json:"peers,omitempty"`
	Probed map[string]string `json:"probed,omitempty"`
	// Child (agent, "child-exit") reports a child launch that ended.
	Child *childExit `json:"child,omitempty"`
	// File (gorun, "file") announces a preloaded file's data frames; Err
	// (agent, "file-bad") says why a file was refused.
	File *fileHeader `json:"file,omitempty"`
	Err  string      `json:"err,omitempty"`
	// PMI (gorun, "spec") is the job's PMI description when its ranks
	// are served PMI (pmi.go).
	PMI *pmiJob `json:"pmi,omitempty"`
}

// childExit is a child launcher that exited before setup was over.
type childExit struct {
	Host string `json:"host"`
	Code int    `json:"code"`
	Tail string `json:"tail"`
}

// remoteJob is what a host agent learns right after authenticating.
type remoteJob struct {
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
	Dir      string        `json:"dir"`
	Grace    time.Duration `json:"grace"`
	Lease    time.Duration `json:"lease"`
	LogLevel int8          `json:"log_level"`
	// Iface is the user's --iface, "" for the route-based choice.
	Iface string `json:"iface,omitempty"`
	// Doctor asks for pre-flight checks instead of a job (doctor.go).
	Doctor bool `json:"doctor,omitempty"`
	// Launch lists the agents this agent starts in turn (tree fan-out):
	// each child's host and full command. The agent reports a child whose
	// command exits ("child-exit") until gorun says "setup-over".
	Launch []childLaunch `json:"launch,omitempty"`
	// Preload lists files gorun offers (preload.go); the agent asks for
	// those it lacks in hello.Need.
	Preload []preloadFile `json:"preload,omitempty"`
	// Stdin says gorun forwards its stdin to rank 0 (stdin frames);
	// otherwise every rank reads /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// NoPMI says the ranks are not served PMI (--pmi none), so an Open
	// MPI program is not refused (mpilib.go).
	NoPMI bool `json:"no_pmi,omitempty"`
	// Flight asks the agent to give its ranks a flight-record directory
	// and send gorun what they write there (flight.go).
	Flight bool `json:"flight,omitempty"`
	// Ranks is how many ranks the plan puts on this host (placement is
	// known before any hello), so the host refuses a count it cannot
	// serve before anything starts; 0 for doctor.
	Ranks int `json:"ranks,omitempty"`
	// Respawn: a --fault-tolerant job; the supervisor keeps what it
	// needs to start a rank again (ftsupervisor.go).
	Respawn bool `json:"respawn,omitempty"`
}

// childLaunch is one agent that a host agent starts for gorun.
type childLaunch struct {
	Host string   `json:"host"`
	Argv []string `json:"argv"`
	// FastKex asks the parent agent to put curve25519 first in its ssh
	// client's key exchange list when that client defaults to the slower
	// hybrid (sshkex.go); the parent's ssh, not gorun's, decides.
	FastKex bool `json:"fast_kex,omitempty"`
}

// remoteHello is a host agent's report before any rank starts.
type remoteHello struct {
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

// peerAddr names a host and where it answers probes (doctor runs).
type peerAddr struct {
	Host string `json:"host"`
	Addr string `json:"addr"`
}

// remoteRank is one rank to start: its number and the variables gorun
// sets; the agent adds its own environment underneath.
type remoteRank struct {
	Rank int      `json:"rank"`
	Env  []string `json:"env"`
	// GPU is the index gorun assigned the rank among the GPUs its host
	// shows, nil for none (supervisorRank.GPU).
	GPU *int `json:"gpu,omitempty"`
}

// wireConn frames messages over one connection. Writes are safe for
// concurrent use (wmu); reads belong to one goroutine.
type wireConn struct {
	c  net.Conn
	br *bufio.Reader

	// writeTimeout bounds each frame write, so that a writer stuck on a
	// dead link gives up; 0 means no bound (set before concurrent use).
	writeTimeout time.Duration

	wmu sync.Mutex
	bw  *bufio.Writer
}

func newWireConn(c net.Conn, br *bufio.Reader) *wireConn {
	if br == nil {
		br = bufio.NewReaderSize(c, 64<<10)
	}
	return &wireConn{c: c, br: br, bw: bufio.NewWriterSize(c, 64<<10)}
}

// writeFrame sends one frame made of parts; it blocks until the kernel
// took the bytes or the write deadline passed.
func (w *wireConn) writeFrame(typ byte, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(n))
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if w.writeTimeout > 0 {
		_ = w.c.SetWriteDeadline(time.Now().Add(w.writeTimeout))
	}
	_, _ = w.bw.Write(hdr[:])
	for _, p := range parts {
		_, _ = w.bw.Write(p)
	}
	return w.bw.Flush()
}

func (w *wireConn) send(m wireMsg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return w.writeFrame(frameMsg, b)
}

// sendOutput sends a piece of a rank's stream (1 stdout, 2 stderr).
func (w *wireConn) sendOutput(rank int, stream byte, data []byte) error {
	var hdr [5]byte
	binary.BigEndian.PutUint32(hdr[:4], uint32(rank))
	hdr[4] = stream
	return w.writeFrame(frameOutput, hdr[:], data)
}

// readFrame returns the next frame. The payload is valid until the next
// call.
func (w *wireConn) readFrame(buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(w.br, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds the limit", n)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(w.br, buf); err != nil {
		return 0, nil, err
	}
	return hdr[0], buf, nil
}

// readMsg reads frames until a message arrives, skipping pings; used
// during setup, when no output flows yet.
func (w *wireConn) readMsg() (wireMsg, error) {
	for {
		typ, p, err := w.readFrame(nil)
		if err != nil {
			return wireMsg{}, err
		}
		switch typ {
		case framePing:
			continue
		case frameMsg:
			var m wireMsg
			if err := json.Unmarshal(p, &m); err != nil {
				return wireMsg{}, fmt.Errorf("bad message: %w", err)
			}
			return m, nil
		default:
			return wireMsg{}, fmt.Errorf("unexpected frame %q during setup", typ)
		}
	}
}

// errAuth is a failed proof of the job secret.
var errAuth = errors.New("launcher: agent connection: authentication failed (wrong job secret)")

// proofFields are what one side's proof of the job secret binds (see
// the handshake above): the claiming side's role with the protocol
// ("gorun/2", "agent/2"), the job, the host and both nonces. With the
// protocol bound, neither side's claim can be altered in flight; with the
// role, one side's proof can never be replayed as the other's.
func proofFields(role, proto, job, host, nonceA, nonceB string) []string {
	return []string{role + "/" + proto, job, host, nonceA, nonceB}
}

// dialAuth is the agent side of the handshake.
func dialAuth(c net.Conn, secret []byte, job, host string) (*wireConn, error) {
	return dialAuthAs(c, secret, job, host, wireProtocol)
}

// dialAuthAs is dialAuth claiming protocol proto (tests pose as agents of
// other versions with it).
func dialAuthAs(c net.Conn, secret []byte, job, host, proto string) (*wireConn, error) {
	br := bufio.NewReader(c)
	nonceA := handshake.Nonce()
	if _, err := fmt.Fprintf(c, "GORUN-AGENT/%s %s %s %s\n", proto, job, host, nonceA); err != nil {
		return nil, err
	}
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("handshake: %w", err)
	}
	f := strings.Fields(line)
	if len(f) >= 1 && f[0] == "NO" {
		return nil, fmt.Errorf("gorun refused this agent: %s", strings.TrimSpace(strings.TrimPrefix(line, "NO")))
	}
	if len(f) != 3 || f[0] != "OK" {
		return nil, fmt.Errorf("handshake: unexpected reply %q", strings.TrimSpace(line))
	}
	nonceB := f[1]
	if !handshake.Verify(secret, f[2], proofFields("gorun", proto, job, host, nonceA, nonceB)...) {
		return nil, errAuth
	}
	proof, err := handshake.MAC(secret, proofFields("agent", proto, job, host, nonceA, nonceB)...)
	if err != nil {
		return nil, fmt.Errorf("handshake: %w", err)
	}
	if _, err := fmt.Fprintf(c, "%s\n", proof); err != nil {
		return nil, err
	}
	return newWireConn(c, br), nil
}

// Handshake is frozen across protocol versions: every gorun, whatever its
// wireProtocol, opens with the same three lines, so an agent of another
// version can still prove it holds the secret and only then be told (and
// reported) that it speaks another protocol. The protocol number each side
// claims is bound into both MACs, so it cannot be altered in flight.

// HandshakeError is a connection to the host-agent port that did not prove
// it holds the job secret. gorun logs and drops it; it is never a host's
// failure, since anyone who can reach the port can cause one. Claim is
// what the peer said about itself (unverified), kept for the error message
// of a host that later fails on its own.
type HandshakeError struct {
	// Remote is the peer's address.
	Remote string
	// Claim is the unverified first line's host and protocol, if it had
	// the right shape ("" otherwise).
	ClaimHost, ClaimProtocol string
	Err                      error
}

func (e *HandshakeError) Error() string {
	s := "launcher: unauthenticated connection to the host-agent port from " + e.Remote
	if e.ClaimHost != "" {
		s += fmt.Sprintf(" (claimed host %q, protocol %s)", e.ClaimHost, e.ClaimProtocol)
	}
	return s + ": " + e.Err.Error()
}

func (e *HandshakeError) Unwrap() error { return e.Err }

// acceptAuth is gorun's side: it returns the host the agent is once the
// agent proved it holds the secret. Nothing the peer says is acted on
// before that: a stranger, a wrong secret or a garbled line is a
// *HandshakeError (log it, drop it); an authenticated agent of another
// protocol is a *VersionError for its host.
func acceptAuth(c net.Conn, secret []byte, job string, known func(host string) bool) (*wireConn, string, error) {
	herr := &HandshakeError{Remote: remoteOf(c)}
	br := bufio.NewReader(io.LimitReader(c, 4096))
	line, err := br.ReadString('\n')
	if err != nil {
		herr.Err = fmt.Errorf("no greeting: %w", err)
		return nil, "", herr
	}
	f := strings.Fields(line)
	if len(f) != 4 || !strings.HasPrefix(f[0], "GORUN-AGENT/") {
		fmt.Fprintf(c, "NO not a gorun agent\n")
		herr.Err = fmt.Errorf("not a gorun agent: %.60q", line)
		return nil, "", herr
	}
	proto, claimJob, host, nonceA := strings.TrimPrefix(f[0], "GORUN-AGENT/"), f[1], f[2], f[3]
	herr.ClaimHost, herr.ClaimProtocol = host, proto
	if claimJob != job || !known(host) {
		fmt.Fprintf(c, "NO unknown job or host\n")
		herr.Err = fmt.Errorf("agent for job %q host %q is not part of this job", claimJob, host)
		return nil, "", herr
	}
	nonceB := handshake.Nonce()
	proof, err := handshake.MAC(secret, proofFields("gorun", proto, job, host, nonceA, nonceB)...)
	if err != nil {
		fmt.Fprintf(c, "NO malformed greeting\n")
		herr.Err = err
		return nil, "", herr
	}
	if _, err := fmt.Fprintf(c, "OK %s %s\n", nonceB, proof); err != nil {
		herr.Err = err
		return nil, "", herr
	}
	line, err = br.ReadString('\n')
	if err != nil {
		herr.Err = fmt.Errorf("no proof: %w", err)
		return nil, "", herr
	}
	if !handshake.Verify(secret, strings.TrimSpace(line), proofFields("agent", proto, job, host, nonceA, nonceB)...) {
		herr.Err = errAuth
		return nil, "", herr
	}
	// Authenticated: from here the peer's words count.
	if proto != wireProtocol {
		fmt.Fprintf(c, "NO agent protocol %s, gorun speaks %s (install the same gorun version on every host)\n", proto, wireProtocol)
		return nil, host, &VersionError{Host: host, Remote: "protocol " + proto, Local: "protocol " + wireProtocol}
	}
	// The limited reader is done with; nothing was read past the line
	// because the agent waits for OK before it sends more.
	return newWireConn(c, nil), host, nil
}

func remoteOf(c net.Conn) string {
	if a := c.RemoteAddr(); a != nil {
		return a.String()
	}
	return "?"
}
