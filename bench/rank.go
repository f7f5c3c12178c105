package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/mattn/go-isatty"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rendezvous"
)

// Execute does what `gorun bench` was asked: in report mode it reads the
// files and prints the comparison; otherwise it runs this rank's part of the
// benchmark (RunRank) and, on rank 0, writes the JSON and the plot. stdout
// receives the table; stderr the progress line when it is a terminal.
func Execute(ctx context.Context, o *Options, stdout, stderr io.Writer) error {
	if o.Report {
		return report(o, stdout)
	}
	cfg := o.Config
	cfg.Out = stdout
	if f, ok := stderr.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		cfg.Progress = stderr
	}
	// Read the comparison files first: a typo should fail before a long run.
	compare, err := readAll(o.Compare, o.Ranks)
	if err != nil {
		return err
	}
	rep, runErr := RunRank(ctx, cfg)
	if rep == nil || !rep.isRank0 {
		return runErr
	}
	if runErr != nil && !errors.As(runErr, new(*WrongError)) {
		return runErr // a failed sweep leaves nothing worth writing
	}
	if o.JSON != "" {
		if err := rep.WriteJSONFile(o.JSON); err != nil {
			return errors.Join(runErr, err)
		}
	}
	if o.Plot != "" {
		for _, c := range compare {
			if c.Source == "osu" && o.Ranks == 0 && c.Ranks != rep.Ranks {
				c.rescaleRanks(rep.Ranks)
			}
		}
		if err := WritePlot(o.Plot, append([]*Report{rep}, compare...), o.PlotConfig); err != nil {
			return errors.Join(runErr, err)
		}
	}
	return runErr
}

func readAll(paths []string, ranks int) ([]*Report, error) {
	var out []*Report
	for _, p := range paths {
		r, err := ReadFile(p, ParseOptions{Ranks: ranks})
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// rescaleRanks recomputes an OSU series' bus bandwidth for n ranks (OSU
// files do not record their rank count; the run being compared does).
func (r *Report) rescaleRanks(n int) {
	op, err := ParseCollective(r.Op)
	if err != nil || r.Ranks == n || n < 1 {
		return
	}
	old, now := op.BusFactor(r.Ranks), op.BusFactor(n)
	for i := range r.Rows {
		if m := r.Rows[i].OutOfPlace; m != nil && old > 0 {
			m.BusBW = m.BusBW / old * now
		}
	}
	r.Ranks = n
	r.finish()
}

func report(o *Options, stdout io.Writer) error {
	reps, err := readAll(o.Compare, o.Ranks)
	if err != nil {
		return err
	}
	reps = MergeBest(reps)
	ratios := DefaultRatios(reps)
	if len(o.Ratios) > 0 {
		ratios = nil
		for _, q := range o.Ratios {
			var a, b int
			if _, err := fmt.Sscanf(q, "%d/%d", &a, &b); err != nil || a < 1 || b < 1 || a > len(reps) || b > len(reps) {
				return &UsageError{Problem: fmt.Sprintf("--ratio %q: expected N/D with file positions 1..%d", q, len(reps))}
			}
			ratios = append(ratios, Ratio{a - 1, b - 1})
		}
	}
	WriteComparison(stdout, reps, ratios)
	if o.Plot != "" {
		return WritePlot(o.Plot, reps, o.PlotConfig)
	}
	return nil
}

// RunRank is one rank of `gorun bench`: it reads the rank's identity from
// the environment (rendezvous.ConfigFromEnv), opens a comm Endpoint, joins
// the rendezvous advertising the endpoint's address, builds a communicator
// over the world and runs the sweep. Without any launcher's variables it
// runs alone, as a world of one rank. It returns the report (on every rank)
// and Run's error.
func RunRank(ctx context.Context, cfg Config) (*Report, error) {
	return runRank(ctx, cfg, nil)
}

// runRank is RunRank with the checker's test hook.
func runRank(ctx context.Context, cfg Config, corrupt func(int, bool, []byte)) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rc, err := rendezvous.ConfigFromEnv()
	solo := errors.Is(err, rendezvous.ErrNoRankEnv)
	if err != nil && !solo {
		return nil, fmt.Errorf("bench: rank environment: %w", err)
	}
	secret := rc.Secret
	if solo {
		secret = make([]byte, 32)
		_, _ = rand.Read(secret)
	}
	ecfg := comm.DefaultEndpointConfig()
	ecfg.Secret = secret
	ecfg.ForceTCP = cfg.Transport == TransportTCP
	ecfg.Logger = cfg.Logger
	if !solo && rc.Host != "" {
		// The launcher's name for this host is how the other hosts reached
		// it, so it is the address to advertise.
		ecfg.AdvertiseHost = rc.Host
	}
	ep, err := comm.Listen(ecfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer ep.Close()

	var group comm.Group
	var ranks []RankInfo
	if solo {
		host, _ := os.Hostname()
		group = soloGroup{host: host, addr: ep.Addr()}
		ranks = []RankInfo{{Rank: 0, Host: host, PID: os.Getpid()}}
	} else {
		rc.DataAddr = ep.Addr()
		rc.Logger = cfg.Logger
		world, err := rendezvous.Join(ctx, rc)
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		defer world.Close()
		group = world
		for _, m := range world.Members() {
			ranks = append(ranks, RankInfo{Rank: m.Rank, Host: m.Host, PID: m.PID})
		}
	}
	ccfg := comm.DefaultConfig()
	ccfg.Logger = cfg.Logger
	ccfg.Tag = "gorun-bench"
	c, err := comm.New(ctx, group, ep, ccfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	rep, runErr := run(ctx, cfg, c, ranks, corrupt)
	closeErr := c.Close()
	if rep != nil {
		rep.isRank0 = c.Rank() == 0
	}
	if runErr == nil && closeErr != nil {
		runErr = fmt.Errorf("bench: closing the communicator: %w", closeErr)
	}
	return rep, runErr
}

// soloGroup is the world of a benchmark started without a launcher.
type soloGroup struct{ host, addr string }

var _ comm.Group = soloGroup{}

func (soloGroup) Rank() int               { return 0 }
func (soloGroup) Size() int               { return 1 }
func (soloGroup) GlobalRank(int) int      { return 0 }
func (g soloGroup) Host(int) string       { return g.host }
func (g soloGroup) DataAddr(int) string   { return g.addr }
func (soloGroup) Failed() <-chan struct{} { return nil }
func (soloGroup) Err() error              { return nil }
