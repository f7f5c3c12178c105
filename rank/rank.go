package rank

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/collateral"
	"github.com/gorun-hpc/gorun/internal/netfault"
	"github.com/gorun-hpc/gorun/rankenv"
	"github.com/gorun-hpc/gorun/rendezvous"
)

// DataPlanePurpose is the HKDF purpose of the data-plane key
// (rendezvous.Config.DeriveKey): every program that opens a data-plane
// endpoint for a job must derive its key with it, or its connections are
// refused as foreign.
const DataPlanePurpose = "gorun comm hmac v1"

// Errors of Init. Failures of the layers below (rendezvous, comm) come back
// wrapped, with their own sentinels and types intact.
var (
	// ErrConfig: Options or the rank environment is invalid; the message
	// names the field or variable.
	ErrConfig = errors.New("rank: invalid configuration")
	// ErrNotLaunched: Options.RequireLauncher is set and no launcher's
	// variables are present.
	ErrNotLaunched = errors.New("rank: not started by a launcher (run under gorun, torchrun or srun)")
	// ErrClosed: the Rank was closed.
	ErrClosed = errors.New("rank: closed")
)

// Options configures Init. Start from DefaultOptions.
type Options struct {
	// Logger receives the start-up choices (debug) and is passed to the
	// rendezvous, the endpoint and every communicator.
	Logger zerolog.Logger
	// Lookup reads the environment; nil means os.LookupEnv. Programs that
	// run several ranks in one process (tests, bindings that receive the
	// environment as a map) pass their own.
	Lookup func(string) (string, bool)
	// RequireLauncher makes Init fail with ErrNotLaunched when no launcher's
	// variables are present, instead of running as a world of one. Set it
	// in programs that make no sense alone (a benchmark of a link).
	RequireLauncher bool
	// ListenAddr is the data-plane listen address (host:port); empty means
	// GORUN_DATA_ADDR, else the address policy (see addr.go and the package
	// doc).
	ListenAddr string
	// Iface names the interface (eth0) or network (10.0.0.0/8) the data
	// plane listens on, overriding the route-based choice; the same
	// spelling as gorun's --iface.
	Iface string
	// Endpoint is the template of the data-plane listener. Init overwrites
	// Addr (the address policy), Secret (the derived data-plane key) and
	// Logger; the rest (ForceTCP, ring sizes, TCP tuning) is used as is.
	Endpoint comm.EndpointConfig
	// Comm is the template of every communicator: the world's (built by
	// Init) and NewComm's, which replace only Tag. Its Logger is replaced
	// by Logger.
	Comm comm.Config
	// Rendezvous, when set, adjusts the rendezvous configuration read from
	// the environment just before Join (timeouts, an in-memory transport in
	// tests). Identity fields should be left alone.
	Rendezvous func(*rendezvous.Config)
}

// DefaultOptions returns production settings: the environment of the
// process, running alone when no launcher started it, comm's and the
// endpoint's defaults, no logging.
func DefaultOptions() Options {
	return Options{
		Logger:   zerolog.Nop(),
		Endpoint: comm.DefaultEndpointConfig(),
		Comm:     comm.DefaultConfig(),
	}
}

// Validate reports the first invalid field, wrapping ErrConfig.
func (o *Options) Validate() error {
	c := o.Comm
	c.Logger = o.Logger
	if err := c.Validate(); err != nil {
		return fmt.Errorf("%w: Comm: %w", ErrConfig, err)
	}
	e := o.Endpoint
	e.Secret = []byte{1} // filled by Init; everything else is the caller's
	if err := e.Validate(); err != nil {
		return fmt.Errorf("%w: Endpoint: %w", ErrConfig, err)
	}
	return nil
}

// Rank is one started rank: its identity, its data-plane endpoint, its
// membership in the world (a rendezvous World, or a static world of one),
// the world communicator and the communicators made with NewComm. Methods
// are safe for concurrent use.
type Rank struct {
	opts   Options
	id     rendezvous.Config // identity as read from the environment
	source string
	log    zerolog.Logger

	ep    *comm.Endpoint
	world *rendezvous.World // nil when alone
	group comm.Group        // the world as a comm.Group
	comm  *comm.Comm        // the world communicator

	// mu guards comms and closed. Close takes it only to swap the list out,
	// so a NewComm that races Close either lands in the list or fails.
	mu     sync.Mutex
	comms  []*comm.Comm // made by NewComm, in creation order
	closed bool

	closeOnce sync.Once
	closeErr  error
}

// Init starts this process's rank: it reads the rank environment (gorun's
// GORUN_*, torch's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, SLURM's
// SLURM_PROCID/SLURM_NTASKS; the first complete set wins, see
// rendezvous.ConfigFromEnv) or, with none, runs alone; derives the
// data-plane key from the job secret; listens on the data plane; joins the
// rendezvous advertising that address; and connects the world communicator.
// It blocks until every rank of the world has done the same (bounded by ctx
// and the rendezvous formation timeout). On error everything already opened
// is closed again.
//
// Every rank of a job must call Init with equal Comm options (the world
// communicator's Config must match on every rank).
func Init(ctx context.Context, opts Options) (_ *Rank, err error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	look := opts.Lookup
	if look == nil {
		look = os.LookupEnv
	}
	r := &Rank{opts: opts}
	// Close what was opened if a later step fails: the same reverse order
	// as Close, so a half-started rank leaves nothing behind.
	defer func() {
		if err != nil {
			if r.comm != nil {
				r.comm.Abort(err)
			}
			_ = r.closeAll()
		}
	}()

	id, source, err := identity(look)
	switch {
	case errors.Is(err, rendezvous.ErrNoRankEnv) && opts.RequireLauncher:
		return nil, ErrNotLaunched
	case errors.Is(err, rendezvous.ErrNoRankEnv):
		id, source, err = soloIdentity()
		if err != nil {
			return nil, err
		}
	case err != nil:
		return nil, fmt.Errorf("%w: rank environment: %w", ErrConfig, err)
	}
	r.id, r.source = id, source
	r.log = opts.Logger.With().Int("rank", id.Rank).Str("host", id.Host).Int("world", id.WorldSize).Logger()

	// The key comes from the Config, before Join: the endpoint must be
	// listening (and so hold its key) before its address is advertised.
	key, err := id.DeriveKey(DataPlanePurpose)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	userAddr := opts.ListenAddr
	if userAddr == "" {
		userAddr = id.DataAddr // GORUN_DATA_ADDR
	}
	addr, why, err := listenAddr(ctx, userAddr, opts.Iface, id.Seed)
	if err != nil {
		return nil, err
	}
	ecfg := opts.Endpoint
	ecfg.Addr, ecfg.Secret, ecfg.Logger = addr, key, opts.Logger
	if ecfg.LinkLease == 0 && os.Getenv(comm.LinkLeaseEnv) == "" {
		// A cut link is named at the same lease as a silent member
		// (GORUN_RDZV_LEASE): comm's link lease.
		ecfg.LinkLease = id.AttachLease
	}
	if r.ep, err = comm.Listen(ecfg); err != nil {
		return nil, fmt.Errorf("rank %d: data plane: %w", id.Rank, err)
	}
	r.log.Debug().Str("launcher", source).Str("data_addr", r.ep.Addr()).Str("why", why).Msg("listening")

	if source == SourceAlone {
		host, _ := os.Hostname()
		r.group = comm.NewStaticGroup(0, []string{r.ep.Addr()}, []string{host})
	} else {
		rc := id
		rc.DataAddr = r.ep.Addr()
		rc.Logger = opts.Logger
		if opts.Rendezvous != nil {
			opts.Rendezvous(&rc)
		}
		if r.world, err = rendezvous.Join(ctx, rc); err != nil {
			// A member frozen before the world formed, or one that
			// never joined by the formation timeout, ends formation
			// for everyone: this rank fails because of it, and tells
			// its launcher so (as comm does after formation), or gorun
			// would name this rank's exit as the cause.
			var lost interface{ LostWorldRank() int }
			if errors.As(err, &lost) && lost.LostWorldRank() >= 0 && lost.LostWorldRank() != id.Rank {
				collateral.Tell(collateral.Report{Rank: id.Rank, Blame: lost.LostWorldRank(), Why: err.Error()})
			}
			return nil, fmt.Errorf("rank %d: %w", id.Rank, err)
		}
		r.group = r.world
	}
	ccfg := opts.Comm
	ccfg.Logger = opts.Logger
	if r.comm, err = comm.New(ctx, r.group, r.ep, ccfg); err != nil {
		return nil, fmt.Errorf("rank %d: world communicator: %w", id.Rank, err)
	}
	return r, nil
}

// Where a rank's identity came from (Rank.Source).
const (
	SourceGorun = "gorun" // GORUN_RANK, GORUN_WORLD_SIZE
	SourceTorch = "torch" // RANK, WORLD_SIZE (torchrun, or gorun's copies)
	SourceSlurm = "slurm" // SLURM_PROCID, SLURM_NTASKS (a direct srun)
	SourceAlone = "alone" // none: a world of one
)

// pairs are the launchers' (rank, size) variables in
// rendezvous.ConfigFromEnv's order of precedence.
var pairs = []struct{ source, rank, size string }{
	{SourceGorun, rankenv.GorunRank, rankenv.GorunWorldSize},
	{SourceTorch, rankenv.Rank, rankenv.WorldSize},
	{SourceSlurm, "SLURM_PROCID", "SLURM_NTASKS"},
}

// identity reads the rank's identity. Half a pair with no complete pair
// (RANK without WORLD_SIZE) is an error rather than a silent run alone: the
// user meant to launch a job and would otherwise get N separate worlds of one.
func identity(look func(string) (string, bool)) (rendezvous.Config, string, error) {
	has := func(k string) bool { _, ok := look(k); return ok }
	source := ""
	for _, p := range pairs {
		if has(p.rank) && has(p.size) {
			source = p.source
			break
		}
	}
	if source == "" {
		for _, p := range pairs {
			if has(p.rank) != has(p.size) {
				set, unset := p.rank, p.size
				if has(p.size) {
					set, unset = p.size, p.rank
				}
				return rendezvous.Config{}, "", fmt.Errorf("%s is set but %s is not", set, unset)
			}
		}
		return rendezvous.Config{}, "", rendezvous.ErrNoRankEnv
	}
	c, err := rendezvous.ConfigFromLookup(look)
	return c, source, err
}

// soloIdentity is the identity of a rank that runs alone: a world of one
// with a fresh random secret (nobody else needs it).
func soloIdentity() (rendezvous.Config, string, error) {
	c := rendezvous.DefaultConfig()
	c.JobID, c.WorldSize = "alone", 1
	c.Host, _ = os.Hostname()
	c.Secret = make([]byte, 32)
	if _, err := rand.Read(c.Secret); err != nil {
		return c, "", fmt.Errorf("rank: random secret: %w", err)
	}
	return c, SourceAlone, nil
}

// Rank returns this process's world rank.
func (r *Rank) Rank() int { return r.id.Rank }

// Size returns the world size.
func (r *Rank) Size() int { return r.id.WorldSize }

// LocalRank returns the rank's index on its host (0 when alone).
func (r *Rank) LocalRank() int { return r.id.LocalRank }

// Host returns the rank's host label (GORUN_HOST, SLURMD_NODENAME or the
// host name).
func (r *Rank) Host() string { return r.id.Host }

// JobID returns the job id ("alone" for a world of one).
func (r *Rank) JobID() string { return r.id.JobID }

// Source says which launcher's variables gave the identity: SourceGorun,
// SourceTorch, SourceSlurm or SourceAlone.
func (r *Rank) Source() string { return r.source }

// Endpoint returns the data-plane endpoint every communicator of this rank
// shares. It is closed by Close.
func (r *Rank) Endpoint() *comm.Endpoint { return r.ep }

// World returns the rendezvous world, or nil when the rank runs alone. Use
// it for membership events, barriers over gossip and the epoch; it is
// closed by Close.
func (r *Rank) World() *rendezvous.World { return r.world }

// WorldGroup returns the world as a comm.Group (the rendezvous World, or a
// static group of one when alone).
func (r *Rank) WorldGroup() comm.Group { return r.group }

// Comm returns the world communicator. It is closed by Close.
func (r *Rank) Comm() *comm.Comm { return r.comm }

// Members returns every rank's advertised facts, indexed by world rank.
func (r *Rank) Members() []rendezvous.Member {
	if r.world != nil {
		return r.world.Members()
	}
	return []rendezvous.Member{{
		Rank: 0, WorldSize: 1, JobID: r.id.JobID, Host: r.group.Host(0),
		DataAddr: r.ep.Addr(), PID: os.Getpid(),
	}}
}

// Group returns the subgroup of the given world ranks, numbered in the order
// given, with no message exchanged (rendezvous.World.Group). The caller must
// be in the list. Make a communicator over it with NewComm.
func (r *Rank) Group(ranks []int) (comm.Group, error) {
	if r.world != nil {
		g, err := r.world.Group(ranks)
		if err != nil {
			return nil, err
		}
		return g, nil
	}
	if !slices.Equal(ranks, []int{0}) {
		return nil, fmt.Errorf("%w: group %v: a rank running alone has only rank 0", ErrConfig, ranks)
	}
	return comm.NewStaticGroup(0, []string{r.ep.Addr()}, []string{r.group.Host(0)}), nil
}

// Split partitions the world like MPI_Comm_split (rendezvous.World.Split):
// collective over the world; a color of rendezvous.Undefined returns a nil
// group.
func (r *Rank) Split(ctx context.Context, color, key int) (comm.Group, error) {
	if r.world != nil {
		g, err := r.world.Split(ctx, color, key)
		if err != nil || g == nil {
			return nil, err // a nil *Group must not become a non-nil interface
		}
		return g, nil
	}
	if color == rendezvous.Undefined {
		return nil, nil
	}
	return r.Group([]int{0})
}

// NewComm connects a communicator over g (the world group or one from
// Group or Split) on this rank's endpoint, with Options.Comm and the given
// tag. Every member of g must call it with the same tag, and two
// communicators over the same members need different tags. It blocks until
// every member has connected. Close closes it, before the world
// communicator, in reverse order of creation.
func (r *Rank) NewComm(ctx context.Context, g comm.Group, tag string) (*comm.Comm, error) {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	ccfg := r.opts.Comm
	ccfg.Logger, ccfg.Tag = r.opts.Logger, tag
	c, err := comm.New(ctx, g, r.ep, ccfg)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Abort(ErrClosed)
		_ = c.Close()
		return nil, ErrClosed
	}
	r.comms = append(r.comms, c)
	return c, nil
}

// CloseComm closes c, a communicator made by NewComm, and forgets it: Close
// neither closes it again nor reports its failure a second time. The error
// is c.Close's (a failed communicator's cause), returned here once. Safe for
// concurrent use; a communicator this rank did not make is only closed.
func (r *Rank) CloseComm(c *comm.Comm) error {
	r.mu.Lock()
	if i := slices.Index(r.comms, c); i >= 0 {
		r.comms = slices.Delete(r.comms, i, i+1)
	}
	r.mu.Unlock()
	return c.Close()
}

// ReportStep tells the launcher that this rank has finished training step
// step (the program's numbering, 1-based; a run resumed from a checkpoint
// goes on with the checkpoint's numbers). gorun fires its
// `--inject ...:after-steps=N` faults on these reports, so a fault lands at
// the same step in every run however fast the machine is. It costs one
// non-blocking write to a pipe the rank inherited (no allocation beyond a
// small line, no lock) and is a no-op when gorun did not start the process;
// safe for concurrent use. Call it once per step, after the step's
// optimizer update.
func (r *Rank) ReportStep(step int) {
	collateral.TellStep(collateral.Step{Rank: r.id.Rank, Step: int64(step)})
	// Data-plane faults armed with after-steps= start in this process's
	// transport at this step (internal/netfault).
	netfault.ReportStep(int64(step))
}

// Abort fails every pending and future call of every communicator of this
// rank with err and tells the peers, so that they stop waiting now rather
// than at their timeouts. Call it before Close when giving up after an
// error: Close waits for issued calls.
func (r *Rank) Abort(err error) {
	r.mu.Lock()
	comms := slices.Clone(r.comms)
	r.mu.Unlock()
	for _, c := range comms {
		c.Abort(err)
	}
	if r.comm != nil {
		r.comm.Abort(err)
	}
}

// Close closes, in reverse order of opening, the communicators made by
// NewComm (newest first), the world communicator, the rendezvous world
// (leaving gracefully) and the endpoint. It is idempotent and returns the
// first call's joined errors; it returns after every goroutine those parts
// started has exited.
func (r *Rank) Close() error {
	r.closeOnce.Do(func() { r.closeErr = r.closeAll() })
	return r.closeErr
}

func (r *Rank) closeAll() error {
	r.mu.Lock()
	r.closed = true
	comms := r.comms
	r.comms = nil
	r.mu.Unlock()
	var errs []error
	for i := len(comms) - 1; i >= 0; i-- {
		errs = append(errs, comms[i].Close())
	}
	if r.comm != nil {
		errs = append(errs, r.comm.Close())
	}
	if r.world != nil {
		errs = append(errs, r.world.Close())
	}
	if r.ep != nil {
		errs = append(errs, r.ep.Close())
	}
	return errors.Join(errs...)
}
