package launcher

import (
	"bufio"
	"cmp"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/consolelog"
	"github.com/gorun-hpc/gorun/internal/liveness"
	"github.com/gorun-hpc/gorun/internal/tailbuf"
	"github.com/gorun-hpc/gorun/launcher/limits"
	"github.com/gorun-hpc/gorun/launcher/ports"
	"github.com/gorun-hpc/gorun/launcher/preload"
	"github.com/gorun-hpc/gorun/launcher/program"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/netif"
	"github.com/gorun-hpc/gorun/rankenv"
)

// The host agent: `gorun agent --connect ADDR ...`, started on every host
// of a multi-host job by ssh, srun or a plain exec (the launching host).
//
// It is a relay around the same per-job supervisor a single-host job uses
// (package launcher/supervisor): it dials gorun, proves it holds the job
// secret, reports the interface and ports peers reach this host through, then
// starts the supervisor with one pipe per rank stream and forwards output,
// events and commands over the one connection. The supervisor keeps its
// guarantees — subreaper, process groups, no orphans — and ends everything when
// its command pipe closes, which is how the relay ends the job on its host:
// when the connection drops, when gorun is silent for the lease period (a cut
// link delivers no FIN), or when the relay itself dies (the kernel closes the
// pipe). gorun, symmetrically, counts the host's ranks as failed when the
// connection drops or falls silent.

// hostAgentSecretEnv carries the job secret to agents started by srun (which
// exports gorun's environment to every task); ssh-started agents read it
// from the first line of stdin instead, so it never appears in a command
// line that other users of the host can see in ps.
const hostAgentSecretEnv = "GORUN_INTERNAL_AGENT_SECRET"

// HostAgentOptions configure HostAgentMain; cmd/gorun fills them from the
// command line of `gorun agent`.
type HostAgentOptions struct {
	// Connect is gorun's host:port.
	Connect string
	// Host is the name gorun knows this host by; "" takes SLURMD_NODENAME
	// (set by srun on every node) or the short hostname.
	Host string
	// Job is the job id.
	Job string
	// Version is this gorun's version, compared with the launching one.
	Version string
}

// ParseHostAgentArgs parses the arguments of `gorun agent`.
func ParseHostAgentArgs(args []string, stderr io.Writer) (HostAgentOptions, error) {
	var o HostAgentOptions
	fs := flag.NewFlagSet("gorun agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Connect, "connect", "", "gorun's `host:port`")
	fs.StringVar(&o.Host, "host", "", "this host's name in the job (default: $SLURMD_NODENAME or the short hostname)")
	fs.StringVar(&o.Job, "job", "", "job id")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gorun agent --connect HOST:PORT --job ID [--host NAME]\n\n"+
			"Internal: the per-host agent of a multi-host job, started by gorun over ssh or srun.\n"+
			"It reads the job secret from $"+hostAgentSecretEnv+" or the first line of stdin.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.Connect == "" || o.Job == "" || fs.NArg() != 0 {
		fs.Usage()
		return o, errors.New("gorun agent: --connect and --job are required")
	}
	return o, nil
}

// HostAgentMain runs a host agent and returns its exit code: 0 when the
// job ended normally, 1 when it could not join or lost gorun.
func HostAgentMain(o HostAgentOptions, stdin io.Reader, stderr io.Writer) int {
	log := consolelog.New(stderr, zerolog.WarnLevel).With().Str("role", "host-agent").Logger()
	if o.Host == "" {
		o.Host = os.Getenv("SLURMD_NODENAME")
	}
	if o.Host == "" {
		h, _ := os.Hostname()
		o.Host, _, _ = strings.Cut(h, ".")
	}
	log = log.With().Str("host", o.Host).Logger()
	// The agent's stderr is an ssh channel that may close before the job
	// ends (a tree parent's ssh to it); a log line must then fail, not
	// kill the agent with SIGPIPE and its ranks with it.
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	defer signal.Stop(pipes)
	secret := os.Getenv(hostAgentSecretEnv)
	os.Unsetenv(hostAgentSecretEnv)
	if secret == "" {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil {
			log.Error().Err(err).Msg("no job secret on stdin")
			return 1
		}
		secret = strings.TrimSpace(line)
	}
	if os.Getenv("SLURM_STEP_ID") != "" {
		// Under srun, SLURM signals every process of the step: at a time
		// limit SIGTERM reaches the ranks directly and gorun forwards it
		// too. The agent must outlive the grace period rather than die at
		// once and take the ranks with it; gorun ends it when the job ends.
		sigs := make(chan os.Signal, 8)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGCONT)
		defer signal.Stop(sigs)
	}
	key, err := hex.DecodeString(secret)
	if err != nil || len(key) == 0 {
		log.Error().Msg("job secret is not hex")
		return 1
	}
	if err := serveHostAgent(o, key, log, stderr); err != nil {
		log.Error().Err(err).Msg("host agent failed")
		return 1
	}
	return 0
}

// agentConnectBudget bounds how long an agent tries to reach gorun and
// prove itself, over every attempt.
const agentConnectBudget = 30 * time.Second

// connectAuth dials gorun and proves the job secret. gorun closes an
// unproven connection to make room when its port is flooded
// (agentPortBounds), so a connection that gorun's side closed or reset
// before the handshake ended is dialed again, after a short backoff (20 ms,
// doubling to 500 ms), within agentConnectBudget; a refusal or a wrong
// secret is final.
func connectAuth(addr string, key []byte, job, host string, log zerolog.Logger) (net.Conn, *wire.Conn, error) {
	deadline := time.Now().Add(agentConnectBudget)
	backoff := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		c, err := net.DialTimeout("tcp", addr, time.Until(deadline))
		if err != nil {
			return nil, nil, fmt.Errorf("connect to gorun at %s: %w", addr, err)
		}
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		w, err := wire.DialAuth(c, key, job, host)
		if err == nil {
			return c, w, nil
		}
		c.Close()
		if !handshakeCut(err) || time.Now().Add(backoff).After(deadline) {
			return nil, nil, fmt.Errorf("handshake with gorun at %s (attempt %d): %w", addr, attempt, err)
		}
		log.Debug().Err(err).Int("attempt", attempt).Msg("gorun closed the connection during the handshake; reconnecting")
		time.Sleep(backoff)
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// handshakeCut reports whether a handshake failed because the connection
// was closed or reset under it (gorun evicting it), not by an answer.
func handshakeCut(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func serveHostAgent(o HostAgentOptions, key []byte, log zerolog.Logger, stderr io.Writer) error {
	c, w, err := connectAuth(o.Connect, key, o.Job, o.Host, log)
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := w.ReadMsg()
	if err != nil || m.T != "job" || m.Job == nil {
		return fmt.Errorf("expected the job description: %v", err)
	}
	job := m.Job
	log = log.Level(zerolog.Level(job.LogLevel))
	if job.Doctor {
		return doctorAgent(o, job, w)
	}
	// Preloaded files: where each goes, and which are missing. The
	// program's check then looks at its preloaded place.
	paths := map[string]string{}
	var need []string
	var placeErr error
	for _, f := range job.Preload {
		path, present, err := preload.Place(f, rankDir(job.Dir))
		if err != nil {
			placeErr = cmp.Or(placeErr, err)
			continue
		}
		paths[f.SHA256] = path
		if !present {
			need = append(need, f.SHA256)
		}
		if f.Program {
			j := *job
			j.Program = path
			job = &j
		}
	}
	hello, reserved := prepareHost(o, job, c, len(need) > 0)
	defer reserved.Release()
	if placeErr != nil && hello.Err == "" {
		hello.Err, hello.ErrKind = "preload: "+placeErr.Error(), "preload"
		reserved.Release()
	}
	hello.Need = need
	if err := w.Send(wire.Msg{T: "hello", Hello: &hello}); err != nil {
		return err
	}
	if hello.Err == "" && len(need) > 0 {
		if err := preload.Receive(w, job.Preload, paths, need); err != nil {
			return fmt.Errorf("preload: %w", err)
		}
	}
	if hello.Err != "" {
		// gorun reports it; wait for it to hang up so the message is read.
		_, _ = w.ReadMsg()
		return nil
	}
	// gorun may take a while to hear from every other host: no deadline
	// until the spec, but the lease below starts with it.
	_ = c.SetDeadline(time.Time{})
	kids := startChildren(job.Launch, hex.EncodeToString(key), w, log)
	defer kids.stop(job.Lease + job.Grace)
	// A spare host's agent is told so ("spare", once gorun planned the
	// job): from then on it pings gorun and waits at most a lease for
	// gorun's pings (wire/idle.go), ending when they stop.
	var spare time.Duration
	stopSpare := make(chan struct{})
	var spareWG sync.WaitGroup
	endSpare := sync.OnceFunc(func() { close(stopSpare); spareWG.Wait() })
	defer endSpare()
	for {
		if spare > 0 {
			m, err = w.ReadMsgWithin(spare)
		} else {
			m, err = w.ReadMsg()
		}
		if err == nil && m.T == "setup-over" {
			kids.quiet()
			if err := w.Send(wire.Msg{T: "setup-over-ack"}); err != nil {
				return nil
			}
			continue
		}
		if err == nil && m.T == "spare" && spare == 0 {
			spare = cmp.Or(job.Lease, DefaultLease)
			w.SetWriteTimeout(spare)
			spareWG.Go(func() { pinger(w, spare/4, stopSpare) })
			continue
		}
		if err != nil && spare > 0 {
			c.Close() // a pinger stuck on the dead link returns
			return fmt.Errorf("lost gorun while waiting as a spare host: %w", err)
		}
		if err != nil || m.T != "spec" {
			// gorun gave up on the job (another host failed): nothing started.
			return nil
		}
		break
	}
	endSpare()
	reserved.Release()
	return relay(w, job, hello, specWithSecret(m.Ranks, key), m.PMI, log, stderr)
}

// specWithSecret gives every rank the job secret this agent holds: gorun
// leaves it out of the spec (withoutSecret), since the connection is not
// encrypted.
func specWithSecret(ranks []wire.HostRank, key []byte) []wire.HostRank {
	kv := rankenv.Secret + "=" + hex.EncodeToString(key)
	for i := range ranks {
		ranks[i].Env = append(ranks[i].Env, kv)
	}
	return ranks
}

// children are the agents a host agent started for gorun (tree fan-out):
// their launch commands (ssh) run as this agent's children for the job's
// lifetime. A command that exits is reported to gorun until setup is over;
// after that, gorun watches the child agents' own connections.
type children struct {
	mu     sync.Mutex
	silent bool // guarded by mu: setup is over, report nothing more
	cmds   []*exec.Cmd
	wg     sync.WaitGroup
}

func startChildren(launch []wire.ChildLaunch, secret string, w *wire.Conn, log zerolog.Logger) *children {
	k := &children{}
	for _, cl := range launch {
		argv := cl.Argv
		if cl.FastKex {
			argv = withFastKex(argv)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		tail := &tailbuf.Buffer{}
		cmd.Stdout, cmd.Stderr = tail, tail
		cmd.Stdin = strings.NewReader(secret + "\n")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			k.report(w, wire.ChildExit{Host: cl.Host, Code: -1, Tail: err.Error()})
			continue
		}
		k.cmds = append(k.cmds, cmd)
		k.wg.Go(func() {
			_ = cmd.Wait()
			code := cmd.ProcessState.ExitCode()
			log.Debug().Str("child", cl.Host).Int("code", code).Msg("child agent's launcher exited")
			k.report(w, wire.ChildExit{Host: cl.Host, Code: code, Tail: tail.Tail()})
		})
	}
	return k
}

func (k *children) report(w *wire.Conn, e wire.ChildExit) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.silent {
		_ = w.Send(wire.Msg{T: "child-exit", Child: &e})
	}
}

// quiet ends the reports: after it returns none is sent.
func (k *children) quiet() {
	k.mu.Lock()
	k.silent = true
	k.mu.Unlock()
}

// stop waits up to d for the launch commands to end with their agents,
// then kills the rest (an ssh to a host whose link is cut could hang for
// long). The child agents themselves never depend on these commands: their
// own connections to gorun decide their fate, and they survive losing
// their stdio (SIGPIPE is caught in HostAgentMain).
func (k *children) stop(d time.Duration) {
	k.quiet()
	done := make(chan struct{})
	go func() { k.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(d):
	}
	for _, c := range k.cmds {
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
	<-done
}

// prepareHost checks what this host needs before any rank starts: the
// interface, the program, two free ports.
func prepareHost(o HostAgentOptions, job *wire.Job, c net.Conn, programComing bool) (wire.Hello, *ports.Reservation) {
	h := wire.Hello{Version: o.Version, PID: os.Getpid()}
	h.Hostname, _ = os.Hostname()
	var choice netif.Choice
	var err error
	if job.Iface != "" {
		choice, err = netif.Override(job.Iface)
	} else {
		ap, perr := netip.ParseAddrPort(c.LocalAddr().String())
		if perr != nil {
			err = perr
		} else {
			choice, err = netif.Holding(ap.Addr())
		}
	}
	if err != nil {
		h.Err, h.ErrKind = err.Error(), "iface"
		return h, nil
	}
	h.Iface, h.Addr, h.Why = choice.Name, choice.Addr.String(), choice.Why
	if job.Ranks > 0 {
		// This host's limits, not the launching machine's, decide
		// whether its ranks can start (launcher/limits).
		if err := limits.Check(job.Ranks, limits.Read()); err != nil {
			h.Err, h.ErrKind = strings.TrimPrefix(err.Error(), "launcher: "), "capacity"
			return h, nil
		}
	}
	prog, err := program.Resolve(job.Program, rankDir(job.Dir))
	if programComing && job.Program != "" && filepath.IsAbs(job.Program) {
		// Preloaded: it arrives before the ranks start.
		prog, err = job.Program, nil
	}
	if err == nil && !job.NoPMI && !programComing {
		// Open MPI would form one singleton per rank (launcher/program).
		err = program.CheckOpenMPI(job.Program, prog)
	}
	if err != nil {
		var pe *program.Error
		if errors.As(err, &pe) {
			err = pe.Err
		}
		h.Err, h.ErrKind = err.Error(), "program"
		return h, nil
	}
	h.Program = prog
	reserved, err := ports.Reserve()
	if err != nil {
		h.Err, h.ErrKind = err.Error(), "ports"
		return h, nil
	}
	h.MasterPort, h.RdzvPort = reserved.MasterPort, reserved.RdzvPort
	return h, reserved
}

// rankDir is dir when it exists on this host, else the home directory.
func rankDir(dir string) string {
	if dir != "" {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return dir
		}
	}
	home, _ := os.UserHomeDir()
	return home
}

// relay runs the ranks through a supervisor and forwards everything until
// the supervisor reports the end (then "done" goes to gorun after the last
// output) or gorun is gone (then the supervisor is told to kill it all).
//
// Goroutines, all waited for before relay returns:
//   - one per rank stream (outWG, pumpOutput): pipe → output frames.
//     They never stop reading, even when the connection is dead, so a
//     rank never blocks on a full pipe before the supervisor kills it.
//   - the connection reader (readCommands): frames from gorun → commands
//     to the supervisor, stdin chunks to rank 0's queue; every frame
//     (pings included) renews lastHeard, the lease's clock.
//   - the event reader (forwardEvents): supervisor events → event frames,
//     holding back "done" (doneEv) until every output stream reached EOF.
//   - the pinger: a ping every lease/4 so gorun's lease stays alive while
//     nothing else flows; it is separate so a write stuck on a dead link
//     cannot delay the lease check below.
//   - pingSupervisor: a ping to the supervisor every lease/4, its lease on
//     this agent; and the supervisor's lease on its events (watchLease).
//   - stdin's queue writer, when rank 0 reads gorun's stdin.
//
// relay's own loop (watch) decides the end: "done" (finish), or the
// connection closing or falling silent for the lease (gorun is gone or
// cut off: close the supervisor's command pipe, which kills every rank and
// descendant on this host, and return the reason).
func relay(w *wire.Conn, job *wire.Job, hello wire.Hello, ranks []wire.HostRank, pj *wire.PMIJob, log zerolog.Logger, stderr io.Writer) error {
	lease := job.Lease
	if lease <= 0 {
		lease = DefaultLease
	}
	r := &agentRelay{w: w, job: job, ranks: ranks, log: log, lease: lease,
		gone: make(chan error, 1), doneEv: make(chan wire.Event, 1), readerDone: make(chan struct{}), stopPing: make(chan struct{})}
	r.p = &supervisor.Pipes{Spec: wire.SupervisorSpec{Grace: job.Grace, LogLevel: log.GetLevel(), KeepOnSignal: os.Getenv("SLURM_STEP_ID") != "", PMI: pj,
		ClientLease: lease, Respawn: job.Respawn}}
	defer r.p.CloseChildEnds()
	// The ranks' flight records: written here, sent to gorun (flight.go).
	// Removed at the end; should this agent die first, by its supervisor.
	var flightEnv []string
	if job.Flight {
		if r.flight = agentFlight(log); r.flight != nil {
			defer r.flight.remove()
			r.p.Spec.RemoveDir = r.flight.dir
			flightEnv = []string{r.flight.env()}
		}
	}
	if len(ranks) > 0 {
		r.firstRank = ranks[0].Rank
	}
	if err := r.addRanks(hello, flightEnv); err != nil {
		return err
	}
	// What the ranks leave in other sessions when the supervisor dies
	// comes to this agent, not init; killLeftovers ends it below.
	supervisor.AdoptOrphans()
	sup, err := supervisor.Start("", r.p.Extra, stderr, jobIDOf(ranks))
	r.p.CloseChildEnds()
	if err != nil {
		if r.stdin != nil {
			r.stdin.w.Close()
		}
		r.p.CloseStreams()
		return &SupervisorError{Err: err}
	}
	r.sup = sup
	if r.p.Spec.Cgroup = sup.CgroupDir(); sup.CgroupErr() != nil {
		log.Debug().Err(sup.CgroupErr()).Msg("no job cgroup: a SIGKILLed supervisor's escaped descendants are found by their environment only")
	}
	defer r.p.CloseStreams()
	defer sup.CloseEvents()
	// After closeCommands (defers run last first): the supervisor exits
	// once its command pipe is closed, and only then is its cgroup
	// emptied and removed, on every way out of this function.
	defer func() {
		_ = sup.Wait()
		r.releaseCgroup()
	}()
	defer sup.CloseCommands()
	_ = sup.Send(r.p.Spec)

	var wg sync.WaitGroup
	defer wg.Wait()
	if r.stdin != nil {
		wg.Go(r.stdin.run)
		defer r.stdin.close()
	}
	for _, s := range r.p.Streams {
		r.outWG.Go(func() { r.pumpOutput(s) })
	}
	r.lastHeard.Store(time.Now().UnixNano())
	wg.Go(r.readCommands)
	// The supervisor's lease: silent (stopped, hung) past it, it is
	// killed, its event pipe ends and the loop below sees it lost.
	wg.Go(func() { sup.WatchLease(lease, r.readerDone, &r.supSilent) })
	wg.Go(r.forwardEvents)
	w.SetWriteTimeout(lease)
	defer close(r.stopPing)
	wg.Go(func() { pinger(w, lease/4, r.stopPing) })
	wg.Go(r.pingSupervisor)

	lost, ev, ok := r.watch()
	if lost == nil {
		return r.finish(ev, ok)
	}
	// gorun is gone: the supervisor kills every rank and descendant when
	// its command pipe closes.
	log.Warn().Err(lost).Msg("lost gorun; killing this host's ranks")
	sup.CloseCommands()
	_ = sup.Wait()
	r.releaseCgroup()
	w.Close()
	r.outWG.Wait()
	return lost
}

// agentRelay is what relay shares with the goroutines it starts and the
// steps it takes; relay owns it and waits for every goroutine before it
// returns.
type agentRelay struct {
	w         *wire.Conn
	job       *wire.Job
	ranks     []wire.HostRank
	log       zerolog.Logger
	lease     time.Duration
	p         *supervisor.Pipes
	sup       *supervisor.Client
	flight    *flightRecords
	firstRank int
	stdin     *stdinQueue // nil unless rank 0 is here and reads gorun's stdin

	// outWG counts the rank streams still being read (pumpOutput).
	outWG sync.WaitGroup
	// gone receives why the connection failed (gorun hung up or broke
	// the protocol; readCommands); lastHeard is when any frame last came from
	// gorun (Unix ns).
	gone      chan error
	lastHeard atomic.Int64
	// doneEv carries the supervisor's "done", held back until every output
	// stream reached EOF, and closes after it (or without it, when the
	// supervisor's events ended first); readerDone closes when the
	// supervisor's events end; supSilent is how long the supervisor was
	// silent when its lease killed it.
	doneEv     chan wire.Event
	readerDone chan struct{}
	supSilent  atomic.Int64
	stopPing   chan struct{}
}

// addRanks adds every rank to the supervisor's spec, with a pipe for
// rank 0's stdin when gorun forwards it.
func (r *agentRelay) addRanks(hello wire.Hello, flightEnv []string) error {
	base := rankenv.WithoutOtherLaunchers(filterEnv(os.Environ()))
	for _, rr := range r.ranks {
		stdinFD := -1
		if rr.Rank == 0 && r.job.Stdin {
			pr, pw, err := os.Pipe()
			if err != nil {
				r.p.CloseStreams()
				return fmt.Errorf("pipe: %w", err)
			}
			stdinFD = r.p.Inherit(pr, true)
			r.stdin = newStdinQueue(pw)
		}
		sr := wire.SupervisorRank{Rank: rr.Rank, Path: hello.Program, Argv: r.job.Argv, Dir: rankDir(r.job.Dir), Env: mergeEnv(base, rr.Env, flightEnv), GPU: rr.GPU}
		if err := r.p.AddRank(sr, stdinFD); err != nil {
			if r.stdin != nil {
				r.stdin.w.Close()
			}
			r.p.CloseStreams()
			return err
		}
	}
	return nil
}

// releaseCgroup empties and removes the job cgroup, if there is one.
func (r *agentRelay) releaseCgroup() {
	if _, err := r.sup.ReleaseCgroup(); err != nil {
		r.log.Warn().Err(err).Msg("job cgroup")
	}
}

// pumpOutput sends one rank stream to gorun as output frames until EOF.
func (r *agentRelay) pumpOutput(s supervisor.Stream) {
	buf := make([]byte, 64<<10)
	for {
		n, err := s.R.Read(buf)
		if n > 0 {
			// A failed write means gorun is gone; keep draining so the
			// ranks never block on a full pipe before the supervisor
			// kills them.
			_ = r.w.SendOutput(s.Rank, s.Kind, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// readCommands reads gorun's frames until the connection fails: commands
// go to the supervisor, stdin chunks to rank 0's queue, and every frame
// (pings included) renews lastHeard.
func (r *agentRelay) readCommands() {
	var buf []byte
	// asked is when this agent last told its ranks to dump their
	// flight records (its own clock, the ranks' clock).
	var asked time.Time
	for {
		typ, p, err := r.w.ReadFrame(buf)
		if err != nil {
			r.gone <- err
			return
		}
		buf = p[:0]
		r.lastHeard.Store(time.Now().UnixNano())
		if typ == wire.FrameStdin && r.stdin != nil {
			r.stdin.push(p)
			continue
		}
		if typ != wire.FrameMsg {
			continue
		}
		var m wire.Msg
		if json.Unmarshal(p, &m) != nil || m.T != "cmd" || m.Cmd == nil {
			continue
		}
		switch {
		case m.Cmd.Op == "flight":
			sendFlight(r.flight, r.w, r.firstRank, asked, true)
		case m.Cmd.Op == "flight-signal":
			asked = time.Now()
			r.flight.signalReady()
		default:
			if m.Cmd.Op == "signal" && m.Cmd.DumpFirst {
				// Blocks this reader for at most flightBeforeStop;
				// gorun's grace runs meanwhile and its kill queues
				// behind.
				r.flight.dumpBeforeStop()
			}
			if m.Cmd.Op == "signal" && m.Cmd.Signal == int(syscall.SIGUSR2) {
				asked = time.Now()
			}
			_ = r.sup.Send(m.Cmd)
		}
	}
}

// forwardEvents sends the supervisor's events to gorun as they come,
// except "done", which goes to doneEv to wait for the last output so that
// gorun has it all when it sees the host finish.
func (r *agentRelay) forwardEvents() {
	defer close(r.readerDone)
	var last *wire.Event
	r.sup.ReadEvents(func(ev wire.Event) {
		if ev.Ev == "done" {
			last = &ev
			return
		}
		_ = r.w.Send(wire.Msg{T: "event", Event: &ev})
		if ev.Ev == "injected" && ev.KillHost && ev.Err == "" {
			// An injected kill-host (inject.go): the ranks are signaled
			// and gorun has the event; now this host's agent dies as a
			// crashed machine's would, without a word. Its supervisor
			// sees its command pipe end and kills what is left; gorun
			// sees the connection drop: "host lost".
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	})
	if last != nil {
		r.doneEv <- *last
	}
	close(r.doneEv)
}

// pingSupervisor renews the supervisor's lease on this agent
// (ClientLease): a stopped agent stops pinging, and its ranks die
// without it.
func (r *agentRelay) pingSupervisor() {
	t := time.NewTicker(r.lease / 4)
	defer t.Stop()
	for {
		select {
		case <-r.stopPing:
			return
		case <-t.C:
			_ = r.sup.Send(wire.Cmd{Op: "ping"})
		}
	}
}

// watch waits for the end: the supervisor's "done" (or its event stream
// ending: ok false), or gorun lost — the connection closed or silent past
// the lease — with the reason.
func (r *agentRelay) watch() (lost error, ev wire.Event, ok bool) {
	check := time.NewTicker(r.lease / 8)
	defer check.Stop()
	// gorun is on another host: no process of its to read. What this
	// agent knows is its own lateness: time it could not run (its check
	// ticks came late) is not gorun's silence (internal/liveness,
	// notes/verdicts.md).
	stalls := liveness.StallMeter{Period: r.lease / 8, Slack: r.lease / 16}
	stalls.Tick(time.Now())
	for {
		select {
		case err := <-r.gone:
			return fmt.Errorf("connection to gorun closed: %w", err), ev, false
		case <-check.C:
			now := time.Now()
			stalls.Tick(now)
			heard := time.Unix(0, r.lastHeard.Load())
			if silent := now.Sub(heard); silent-stalls.Since(heard) > r.lease {
				return fmt.Errorf("no word from gorun for %s (lease %s)", silent.Round(time.Millisecond), r.lease), ev, false
			}
		case ev, ok = <-r.doneEv:
			return nil, ev, ok
		}
	}
}

// finish ends a job whose ranks are all gone: their flight records and
// then "done" go to gorun after the last output — or, when the supervisor
// was lost (!ok), what is left is killed and gorun is told why — and the
// connection is closed once gorun hung up.
func (r *agentRelay) finish(ev wire.Event, ok bool) error {
	// Every rank is gone: what they dumped goes to gorun before "done"
	// (ranks dump when their communicator fails), and the directory stays
	// this agent's to remove.
	sendFlight(r.flight, r.w, r.firstRank, time.Time{}, false)
	_ = r.sup.Send(wire.Cmd{Op: "bye"})
	r.sup.CloseCommands()
	supErr := r.sup.Wait()
	var supLost error
	if !ok {
		supLost = errors.New("its job supervisor exited without reporting the end of the job")
		if supErr != nil {
			supLost = fmt.Errorf("its job supervisor died (%v) without reporting the end of the job", supErr)
		}
		if d := time.Duration(r.supSilent.Load()); d > 0 {
			supLost = fmt.Errorf("its job supervisor was silent for %s, past the lease of %s (stopped or hung), and was killed", d.Round(time.Millisecond), r.lease)
		}
		// The supervisor died without killing what the ranks started in
		// other sessions, which may hold output pipes open: end it, and
		// stop waiting for those pipes after the grace period rather
		// than forever.
		n, cgErr := r.sup.ReleaseCgroup()
		if cgErr != nil {
			r.log.Warn().Err(cgErr).Msg("job cgroup")
		}
		if n += supervisor.KillLeftovers(jobIDOf(r.ranks)); n > 0 {
			r.log.Warn().Int("processes", n).Msg("killed processes the job left after its supervisor was lost")
		}
		drainOutput(&r.outWG, r.p, r.job.Grace+time.Second)
	}
	r.outWG.Wait()
	if ok {
		_ = r.w.Send(wire.Msg{T: "event", Event: &ev})
	} else {
		// Say why before hanging up: gorun would otherwise see only a
		// closed connection, which reads as a killed agent or a
		// rebooted host.
		_ = r.w.Send(wire.Msg{T: "supervisor-lost", Err: supLost.Error() + "; the host agent ended its ranks"})
	}
	// Half-close and wait for gorun to hang up (it does once every host
	// is done): closing outright while gorun's pings sit unread would
	// reset the connection, and a reset discards whatever of ours was
	// still in flight — "done" included.
	if tc, isTCP := r.w.NetConn().(*net.TCPConn); isTCP {
		_ = tc.CloseWrite()
		select {
		case <-r.gone:
		case <-time.After(2 * r.lease):
		}
	}
	r.w.Close()
	return supLost
}

// jobIDOf returns the job's GORUN_JOB_ID from its ranks' environment.
func jobIDOf(ranks []wire.HostRank) string {
	for _, r := range ranks {
		for _, kv := range r.Env {
			if v, ok := strings.CutPrefix(kv, rankenv.JobID+"="); ok {
				return v
			}
		}
	}
	return ""
}

// drainOutput waits up to d for the output readers, then closes their
// pipes so that readers stuck on a pipe an escaped process holds return.
func drainOutput(wg *sync.WaitGroup, p *supervisor.Pipes, d time.Duration) {
	done := make(chan struct{})
	go func() { // owned: ends when wg does, which closing the pipes ensures
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		p.CloseStreams()
		<-done
	}
}

// stdinQueue feeds rank 0's stdin pipe from the connection without ever
// blocking the connection's reader (which also keeps the lease): chunks
// queue in memory while rank 0 does not read.
type stdinQueue struct {
	w *os.File

	mu     sync.Mutex
	cond   *sync.Cond
	chunks [][]byte // guarded by mu
	eof    bool     // guarded by mu: no more chunks will come
}

func newStdinQueue(w *os.File) *stdinQueue {
	q := &stdinQueue{w: w}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// push queues a chunk; an empty chunk is EOF. It never blocks for long.
func (q *stdinQueue) push(p []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(p) == 0 {
		q.eof = true
	} else {
		q.chunks = append(q.chunks, append([]byte(nil), p...))
	}
	q.cond.Signal()
}

// close ends the queue as at EOF; run then returns once the pipe is done.
func (q *stdinQueue) close() {
	q.mu.Lock()
	q.eof, q.chunks = true, nil
	q.cond.Signal()
	q.mu.Unlock()
	// A rank that stopped reading would keep a write blocked.
	q.w.Close()
}

// run writes queued chunks to the pipe until EOF, then closes it so rank 0
// sees EOF.
func (q *stdinQueue) run() {
	defer q.w.Close()
	for {
		q.mu.Lock()
		for len(q.chunks) == 0 && !q.eof {
			q.cond.Wait()
		}
		if len(q.chunks) == 0 {
			q.mu.Unlock()
			return
		}
		c := q.chunks[0]
		q.chunks = q.chunks[1:]
		q.mu.Unlock()
		if _, err := q.w.Write(c); err != nil {
			return
		}
	}
}

// pinger sends a ping every interval until stop closes, so the other side's
// lease stays alive while nothing else flows. It runs apart from the loop
// that checks the lease: a write stuck on a dead link must not keep the
// check from happening.
func pinger(w *wire.Conn, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if w.WriteFrame(wire.FramePing) != nil {
				return
			}
		}
	}
}

// filterEnv drops gorun-internal variables from an agent's environment
// before it becomes the ranks' base.
func filterEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if strings.HasPrefix(kv, "GORUN_INTERNAL_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// DefaultLease is how long gorun and a host agent tolerate silence from
// each other before the agent kills its ranks and gorun counts them as
// failed; pings go every quarter of it. Long enough for a loaded machine's
// scheduling hiccups, short enough that a cut link ends the job within
// seconds.
const DefaultLease = 4 * time.Second
