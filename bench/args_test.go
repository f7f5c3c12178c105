package bench

import (
	"errors"
	"flag"
	"io"
	"slices"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"8", 8}, {"0", 0}, {"64K", 64 << 10}, {"64k", 64 << 10}, {"128M", 128 << 20},
		{"1G", 1 << 30}, {"2MiB", 2 << 20}, {"1GB", 1 << 30}, {"64B", 64}, {"1T", 1 << 40},
	} {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "K", "-1", "1.5M", "12Q", "99999999999T"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
	for _, n := range []int64{8, 1000, 64 << 10, 3 << 20, 1 << 30} {
		if got, _ := ParseSize(FormatSize(n)); got != n {
			t.Errorf("FormatSize(%d) = %q does not parse back", n, FormatSize(n))
		}
	}
}

func TestSizes(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  func(*Config)
		want []int64
	}{
		{"factor", func(c *Config) { c.MinBytes, c.MaxBytes, c.StepFactor = 8, 64<<20, 4 },
			[]int64{8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 2097152, 8388608, 33554432}},
		{"inclusive", func(c *Config) { c.MinBytes, c.MaxBytes, c.StepFactor = 1024, 4096, 2 }, []int64{1024, 2048, 4096}},
		{"increment", func(c *Config) { c.MinBytes, c.MaxBytes, c.StepBytes = 100, 400, 150 }, []int64{100, 250, 400}},
		{"one", func(c *Config) { c.MinBytes, c.MaxBytes = 64, 64 }, []int64{64}},
		{"from zero", func(c *Config) { c.MinBytes, c.MaxBytes, c.StepFactor = 0, 4, 2 }, []int64{0, 1, 2, 4}},
		{"barrier", func(c *Config) { c.Op = Barrier }, []int64{0}},
	} {
		cfg := DefaultConfig()
		c.cfg(&cfg)
		if got := cfg.Sizes(); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestBusFactor(t *testing.T) {
	for _, c := range []struct {
		op   Collective
		n    int
		want float64
	}{
		{AllReduce, 1, 0}, {AllReduce, 2, 1}, {AllReduce, 4, 1.5}, {AllReduce, 8, 1.75},
		{AllGather, 2, 0.5}, {AllGather, 4, 0.75}, {ReduceScatter, 8, 0.875}, {AllToAll, 4, 0.75},
		{Broadcast, 4, 1}, {Reduce, 16, 1}, {SendRecv, 2, 1}, {Barrier, 4, 0},
	} {
		if got := c.op.BusFactor(c.n); got != c.want {
			t.Errorf("%v.BusFactor(%d) = %v, want %v", c.op, c.n, got, c.want)
		}
	}
}

// The size and count columns follow nccl-tests' getCollByteCount.
func TestShape(t *testing.T) {
	for _, c := range []struct {
		op                  Collective
		size                int64
		n                   int
		bytes, count, algBy int64
	}{
		{AllReduce, 1024, 4, 1024, 256, 1024},
		{AllGather, 1024, 4, 1024, 64, 1024},
		{ReduceScatter, 1024, 4, 1024, 64, 1024},
		{AllToAll, 1024, 4, 1024, 64, 1024},
		{AllGather, 8, 3, 12, 1, 12}, // rounded up to one element per rank
		{Broadcast, 6, 2, 4, 1, 4},   // whole elements only
	} {
		sh := shapeFor(c.op, c.size, 4, c.n)
		if sh.bytes(4) != c.bytes || int64(sh.paramCount) != c.count || sh.algBytes != c.algBy {
			t.Errorf("%v %d on %d: bytes %d count %d alg %d; want %d %d %d", c.op, c.size, c.n,
				sh.bytes(4), sh.paramCount, sh.algBytes, c.bytes, c.count, c.algBy)
		}
	}
}

func TestParseArgs(t *testing.T) {
	o, err := ParseArgs([]string{"allgather", "-b", "1K", "--maxbytes", "64M", "-f", "4", "-d", "bf16",
		"-o", "max", "-n", "7", "-w", "0", "-c", "0", "--transport", "tcp", "--json", "x.json",
		"--plot", "x.png", "--compare", "a.json,b.txt", "--compare", "mpi=c.txt", "d.txt"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if c.Op != AllGather || c.MinBytes != 1024 || c.MaxBytes != 64<<20 || c.StepFactor != 4 ||
		c.DType != comm.BFloat16 || c.RedOp != comm.Max || c.Iters != 7 || c.Warmup != 0 || c.Check ||
		c.Transport != TransportTCP || o.JSON != "x.json" || o.Plot != "x.png" {
		t.Errorf("parsed %+v", o)
	}
	if !slices.Equal(o.Compare, []string{"a.json", "b.txt", "mpi=c.txt", "d.txt"}) {
		t.Errorf("compare = %v", o.Compare)
	}
	o, err = ParseArgs([]string{"-i", "100", "-b", "100", "-e", "1000", "broadcast", "-r", "1"}, io.Discard)
	if err == nil && (o.Config.Op != Broadcast || o.Config.StepBytes != 100) {
		t.Errorf("op after flags: %+v", o.Config)
	}
	if o, err := ParseArgs([]string{"allreduce", "-z", "1"}, io.Discard); err != nil || !o.Config.Blocking {
		t.Errorf("-z 1: %+v %v", o, err)
	}
	o, err = ParseArgs([]string{"report", "--plot", "p.png", "a.json", "b.txt"}, io.Discard)
	if err != nil || !o.Report || len(o.Compare) != 2 {
		t.Errorf("report: %+v %v", o, err)
	}
	if _, err := ParseArgs([]string{"allreduce", "-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
	for _, bad := range [][]string{
		{}, {"frobnicate"}, {"allreduce", "-b", "1X"}, {"allreduce", "-b", "1M", "-e", "1K"},
		{"allreduce", "-d", "complex"}, {"allreduce", "-o", "xor"}, {"allreduce", "-c", "2"}, {"allreduce", "-z", "2"},
		{"allreduce", "--transport", "rdma"}, {"allreduce", "-n", "0"}, {"allreduce", "-f", "1"},
		{"allreduce", "--bogus"}, {"report"}, {"allreduce", "-i", "1", "-e", "1G"},
	} {
		_, err := ParseArgs(bad, io.Discard)
		var ue *UsageError
		if !errors.As(err, &ue) {
			t.Errorf("ParseArgs(%q) = %v, want a *UsageError", bad, err)
		}
	}
}

func TestParseCollective(t *testing.T) {
	for in, want := range map[string]Collective{
		"allreduce": AllReduce, "all_reduce": AllReduce, "all_reduce_perf": AllReduce, "AllReduce": AllReduce,
		"all-gather": AllGather, "reduce_scatter": ReduceScatter, "alltoall": AllToAll, "all_to_all": AllToAll,
		"sendrecv": SendRecv, "broadcast": Broadcast, "reduce": Reduce, "barrier": Barrier,
	} {
		if got, err := ParseCollective(in); got != want || err != nil {
			t.Errorf("ParseCollective(%q) = %v, %v", in, got, err)
		}
	}
}
