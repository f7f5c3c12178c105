package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/mattn/go-isatty"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rank"
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

// RunRank is one rank of `gorun bench`: it starts the rank with rank.Init
// (identity from the environment, data-plane endpoint, rendezvous, world
// communicator; without any launcher's variables it runs alone, as a world
// of one rank) and runs the sweep. It returns the report (on every rank) and
// Run's error.
func RunRank(ctx context.Context, cfg Config) (*Report, error) {
	return runRank(ctx, cfg, nil)
}

// runRank is RunRank with the checker's test hook.
func runRank(ctx context.Context, cfg Config, corrupt func(int, bool, []byte)) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Device == DeviceCUDA {
		// Before joining anyone: a host without a GPU, its driver or NCCL
		// fails at once, saying which is missing, instead of after the
		// world has formed.
		if err := openGPU(); err != nil {
			return nil, fmt.Errorf("bench: --device cuda: %w", err)
		}
	}
	opts := rank.DefaultOptions()
	opts.Logger = cfg.Logger
	opts.Endpoint.ForceTCP = cfg.Transport == TransportTCP
	opts.Comm.Tag = "gorun-bench"
	r, err := rank.Init(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	var ranks []RankInfo
	for _, m := range r.Members() {
		ranks = append(ranks, RankInfo{Rank: m.Rank, Host: m.Host, PID: m.PID})
	}
	c := r.Comm()
	var measured comm.Communicator = c
	var gpu comm.Communicator
	if cfg.Device == DeviceCUDA {
		if gpu, err = newGPUComm(ctx, cfg, r); err != nil {
			r.Abort(err)
			r.Close()
			return nil, fmt.Errorf("bench: %w", err)
		}
		measured = gpu
	}
	rep, runErr := run(ctx, cfg, measured, c, ranks, corrupt)
	if runErr != nil && !errors.As(runErr, new(*WrongError)) {
		r.Abort(runErr) // free the peers now rather than at their timeouts
		if gpu != nil {
			gpu.Abort(runErr)
		}
	}
	if gpu != nil {
		if err := gpu.Close(); runErr == nil && err != nil {
			runErr = fmt.Errorf("bench: closing the NCCL communicator: %w", err)
		}
	}
	closeErr := r.Close()
	if rep != nil {
		rep.isRank0 = c.Rank() == 0
	}
	if runErr == nil && closeErr != nil {
		runErr = fmt.Errorf("bench: closing the rank: %w", closeErr)
	}
	return rep, runErr
}
