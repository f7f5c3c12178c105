package hostagent

import (
	"bufio"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/consolelog"
	"github.com/gorun-hpc/gorun/launcher/preload"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/rankenv"
)

// SecretEnv carries the job secret to agents started by srun (which
// exports gorun's environment to every task); ssh-started agents read it
// from the first line of stdin instead, so it never appears in a command
// line that other users of the host can see in ps.
const SecretEnv = "GORUN_INTERNAL_AGENT_SECRET"

// Options configure Main; cmd/gorun fills them from the
// command line of `gorun agent`.
type Options struct {
	// Connect is gorun's host:port.
	Connect string
	// Host is the name gorun knows this host by; "" takes SLURMD_NODENAME
	// (set by srun on every node) or the short hostname.
	Host string
	// Job is the job id.
	Job string
	// Version is this gorun's version, compared with the launching one.
	Version string
	// CountGPUs counts this host's GPUs for doctor's GPUS column;
	// cmd/gorun passes launcher.DetectGPUs. nil counts none.
	CountGPUs func(context.Context) int
}

// ParseArgs parses the arguments of `gorun agent`.
func ParseArgs(args []string, stderr io.Writer) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("gorun agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Connect, "connect", "", "gorun's `host:port`")
	fs.StringVar(&o.Host, "host", "", "this host's name in the job (default: $SLURMD_NODENAME or the short hostname)")
	fs.StringVar(&o.Job, "job", "", "job id")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gorun agent --connect HOST:PORT --job ID [--host NAME]\n\n"+
			"Internal: the per-host agent of a multi-host job, started by gorun over ssh or srun.\n"+
			"It reads the job secret from $"+SecretEnv+" or the first line of stdin.")
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

// Main runs a host agent and returns its exit code: 0 when the
// job ended normally, 1 when it could not join or lost gorun.
func Main(o Options, stdin io.Reader, stderr io.Writer) int {
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
	secret := os.Getenv(SecretEnv)
	os.Unsetenv(SecretEnv)
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
	if err := serve(o, key, log, stderr); err != nil {
		log.Error().Err(err).Msg("host agent failed")
		return 1
	}
	return 0
}

// connectBudget bounds how long an agent tries to reach gorun and
// prove itself, over every attempt.
const connectBudget = 30 * time.Second

// connectAuth dials gorun and proves the job secret. gorun closes an
// unproven connection to make room when its port is flooded (launcher's
// agentPortBounds), so a connection that gorun's side closed or reset
// before the handshake ended is dialed again, after a short backoff (20
// ms, doubling to 500 ms), within connectBudget; a refusal or a wrong
// secret is final.
func connectAuth(addr string, key []byte, job, host string, log zerolog.Logger) (net.Conn, *wire.Conn, error) {
	deadline := time.Now().Add(connectBudget)
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

func serve(o Options, key []byte, log zerolog.Logger, stderr io.Writer) error {
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
		return doctor(o, job, w)
	}
	if job.Lease <= 0 {
		return fmt.Errorf("the job description names no lease (%v)", job.Lease)
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
			spare = job.Lease
			w.SetWriteTimeout(spare)
			spareWG.Go(func() { w.PingEvery(spare/4, stopSpare) })
			continue
		}
		if err != nil && spare > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			// Silent past the lease; a hang-up is the job's end, below.
			c.Close() // a ping stuck on the dead link returns
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
// leaves it out of the spec (launcher's withoutSecret), since the
// connection is not encrypted.
func specWithSecret(ranks []wire.HostRank, key []byte) []wire.HostRank {
	kv := rankenv.Secret + "=" + hex.EncodeToString(key)
	for i := range ranks {
		ranks[i].Env = append(ranks[i].Env, kv)
	}
	return ranks
}
