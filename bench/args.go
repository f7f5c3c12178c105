package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gorun-hpc/gorun/internal/cliflag"
)

// Options is a parsed `gorun bench` command line.
type Options struct {
	// Config is the run (unused in report mode).
	Config Config
	// JSON and Plot are output paths written by rank 0 ("" for none).
	JSON, Plot string
	// Compare lists result files (LABEL=PATH allowed) drawn next to this
	// run in the plot, and tabulated in report mode.
	Compare []string
	// Report is `gorun bench report FILE...`: no run, just read the files,
	// print the side-by-side table and optionally plot.
	Report bool
	// Ranks is the rank count assumed for OSU files (which do not say).
	Ranks int
	// Ratios are report mode's ratio columns, "NUM/DEN" with 1-based file
	// positions; empty: every gorun series over every other.
	Ratios []string
	// PlotConfig sizes the plot.
	PlotConfig PlotConfig
}

// list is a flag.Value collecting repeated and comma-separated values.
type list []string

func (l *list) String() string { return strings.Join(*l, ",") }
func (l *list) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// sizeFlag is a flag.Value for byte counts with K/M/G suffixes.
type sizeFlag struct{ v *int64 }

func (s sizeFlag) String() string {
	if s.v == nil {
		return ""
	}
	return FormatSize(*s.v)
}
func (s sizeFlag) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s.v = n
	return nil
}

// funcFlag parses with a function.
type funcFlag struct {
	show string
	set  func(string) error
}

func (f funcFlag) String() string     { return f.show }
func (f funcFlag) Set(s string) error { return f.set(s) }

const usageText = `usage: gorun -np N [-hostfile F] gorun bench OP [flags] [COMPARE_FILE...]
       gorun bench report [--plot FILE.png] [--ranks N] FILE...

Measures a collective over a sweep of sizes and prints the nccl-tests table:
size, count, type, redop, root, then time (us), algbw, busbw (GB/s) and
#wrong for out-of-place and in-place. busbw = algbw times 2(n-1)/n for
allreduce, (n-1)/n for allgather, reducescatter and alltoall, 1 otherwise.
Any wrong element (with -c 1) makes the exit code non-zero.

--device cuda measures GPU memory through NCCL (one GPU per rank; NCCL and
the NVIDIA driver are loaded when the run starts, so a host without them
fails at once saying which is missing; $GORUN_NCCL_LIBRARY names another
libnccl.so.2). The check then runs on the GPU.

OP is one of allreduce allgather reducescatter broadcast reduce alltoall
sendrecv barrier. Sizes take K, M, G suffixes (powers of 1024).
"report" reads result files (gorun JSON or text, nccl-tests or OSU text;
LABEL=FILE names a series; files with the same label are merged, keeping
the fastest time per size) and prints busbw side by side with ratios.

Examples:
  gorun -np 2 gorun bench allreduce -b 8 -e 64M -f 4
  gorun -np 4 gorun bench allgather -d bfloat16 --json ag.json --plot ag.png
  gorun -np 2 gorun bench allreduce --plot cmp.png --compare mpi=mpi.txt
  gorun -np 8 gorun bench allreduce --device cuda -b 8 -e 1G
  gorun bench report --plot cmp.png gorun=ar.json nccl=all_reduce_perf.txt

Flags (one or two dashes; nccl-tests' long names work too):
`

// ParseArgs reads the arguments after "gorun bench". A bad command line is
// a *UsageError (already explained on stderr); -h is flag.ErrHelp.
func ParseArgs(args []string, stderr io.Writer) (*Options, error) {
	o := &Options{Config: DefaultConfig(), PlotConfig: DefaultPlotConfig()}
	cfg := &o.Config
	fs := flag.NewFlagSet("gorun bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	alias := func(names []string, v flag.Value, usage string) {
		fs.Var(v, names[0], usage)
		for _, n := range names[1:] {
			fs.Var(v, n, "same as -"+names[0])
		}
	}
	alias([]string{"b", "minbytes"}, sizeFlag{&cfg.MinBytes}, "smallest size in `bytes` (8, 64K, 128M, 1G)")
	alias([]string{"e", "maxbytes"}, sizeFlag{&cfg.MaxBytes}, "largest size in `bytes`")
	alias([]string{"f", "stepfactor"}, funcFlag{"2", func(s string) error {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return err
		}
		cfg.StepFactor, cfg.StepBytes = v, 0
		return nil
	}}, "multiply the size by `factor` between rows")
	alias([]string{"i", "stepbytes"}, sizeFlag{&cfg.StepBytes}, "add `bytes` between rows instead of multiplying")
	alias([]string{"d", "datatype"}, funcFlag{"float", func(s string) (err error) {
		cfg.DType, err = ParseDType(s)
		return err
	}}, "element `type`: float, double, half, bfloat16, int32, int64, uint8")
	alias([]string{"o", "op"}, funcFlag{"sum", func(s string) (err error) {
		cfg.RedOp, err = ParseRedOp(s)
		return err
	}}, "reduction: sum, prod, min, max, avg")
	fs.IntVar(&cfg.Root, "r", cfg.Root, "root `rank` of broadcast and reduce")
	fs.IntVar(&cfg.Root, "root", cfg.Root, "same as -r")
	fs.IntVar(&cfg.Iters, "n", cfg.Iters, "timed `iterations` per size")
	fs.IntVar(&cfg.Iters, "iters", cfg.Iters, "same as -n")
	fs.IntVar(&cfg.Warmup, "w", cfg.Warmup, "untimed warm-up `iterations` per size")
	fs.IntVar(&cfg.Warmup, "warmup_iters", cfg.Warmup, "same as -w")
	check := 1
	fs.IntVar(&check, "c", 1, "check every result element: 1 on, 0 off")
	fs.IntVar(&check, "check", 1, "same as -c")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the check values")
	blocking := 0
	fs.IntVar(&blocking, "z", 0, "blocking: 1 waits for each call before the next, 0 issues them back to back")
	fs.IntVar(&blocking, "blocking", 0, "same as -z")
	transport := string(cfg.Transport)
	fs.StringVar(&transport, "transport", transport, "data plane inside a host: auto, tcp or shm (shm fails if any link is not shared memory)")
	device := string(cfg.Device)
	fs.StringVar(&device, "device", device, "where the buffers live: cpu (comm) or cuda (GPU memory through NCCL, loaded at run time)")
	fs.StringVar(&o.JSON, "json", "", "write the results as JSON to `FILE` (rank 0)")
	fs.StringVar(&o.Plot, "plot", "", "draw busbw and latency against size into `FILE.png` (rank 0)")
	fs.Var((*list)(&o.Compare), "compare", "result `FILE` to plot next to this run (repeatable; LABEL=FILE; gorun JSON/text, nccl-tests or OSU text)")
	fs.IntVar(&o.Ranks, "ranks", 0, "rank count of OSU result files, which do not record it (default: this run's, else 2)")
	fs.Var((*list)(&o.Ratios), "ratio", "report: a ratio column `N/D` of busbw, file positions from 1 (repeatable)")
	fs.IntVar(&o.PlotConfig.Width, "plot-width", o.PlotConfig.Width, "plot width in `pixels`")
	fs.IntVar(&o.PlotConfig.Height, "plot-height", o.PlotConfig.Height, "plot height in `pixels`")

	if len(args) == 0 {
		fs.Usage()
		return nil, &UsageError{Problem: "no operation given"}
	}
	opName := ""
	rest := args
	if !strings.HasPrefix(args[0], "-") {
		opName, rest = args[0], args[1:]
	}
	if err := cliflag.Parse(fs, rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		var ue *UsageError
		if errors.As(err, &ue) {
			return nil, ue
		}
		return nil, &UsageError{Problem: err.Error()}
	}
	extra := fs.Args()
	if opName == "" && len(extra) > 0 {
		opName, extra = extra[0], extra[1:]
	}
	if opName == "report" {
		o.Report = true
		o.Compare = append(o.Compare, extra...)
		if len(o.Compare) == 0 {
			return nil, &UsageError{Problem: "report: no result files given"}
		}
		return o, nil
	}
	// Files after the flags extend --compare, so "--compare a.json b.txt"
	// reads as it looks.
	o.Compare = append(o.Compare, extra...)
	if opName == "" {
		return nil, &UsageError{Problem: "no operation given (allreduce, allgather, ...)"}
	}
	op, err := ParseCollective(opName)
	if err != nil {
		return nil, err
	}
	cfg.Op = op
	switch check {
	case 0, 1:
		cfg.Check = check == 1
	default:
		return nil, &UsageError{Problem: fmt.Sprintf("-c %d: expected 0 or 1", check)}
	}
	switch blocking {
	case 0, 1:
		cfg.Blocking = blocking == 1
	default:
		return nil, &UsageError{Problem: fmt.Sprintf("-z %d: expected 0 or 1", blocking)}
	}
	cfg.Transport = Transport(transport)
	cfg.Device = Device(device)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return o, nil
}
