package bench

import (
	"bytes"
	"errors"
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func near(a, b, rel float64) bool { return math.Abs(a-b) <= rel*math.Max(math.Abs(a), math.Abs(b)) }

// A real run's report survives JSON exactly and our text to the printed
// precision, with the nccl-tests column order.
func TestOutputParsesBack(t *testing.T) {
	cfg := smallConfig(AllReduce)
	cfg.MaxBytes = 64 << 10
	text, reps, errs := memRun(t, 3, cfg, nil)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	rep := reps[0]

	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	back, err := Parse(bytes.NewReader(js.Bytes()), ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var js2 bytes.Buffer
	_ = back.WriteJSON(&js2)
	if js.String() != js2.String() {
		t.Errorf("JSON round trip differs:\n%s\n%s", js.String(), js2.String())
	}

	tb, err := Parse(strings.NewReader(text), ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tb.Source != "gorun" || tb.Op != "allreduce" || tb.Ranks != 3 || len(tb.Hosts) != 3 ||
		tb.Iters != cfg.Iters || tb.MaxBytes != cfg.MaxBytes || tb.Label != "gorun mem" {
		t.Errorf("header read back as %+v", tb)
	}
	if len(tb.Rows) != len(rep.Rows) {
		t.Fatalf("%d rows read back, want %d", len(tb.Rows), len(rep.Rows))
	}
	for i, got := range tb.Rows {
		want := rep.Rows[i]
		if got.Bytes != want.Bytes || got.Count != want.Count || got.Type != "float" || got.RedOp != "sum" || got.Root != -1 {
			t.Errorf("row %d: %+v, want %+v", i, got, want)
		}
		for _, p := range [][2]*Measure{{got.OutOfPlace, want.OutOfPlace}, {got.InPlace, want.InPlace}} {
			// The text has 3 or 4 significant digits of time; bandwidths
			// are recomputed from it.
			if !near(p[0].TimeUs, p[1].TimeUs, 0.01) || !near(p[0].BusBW, p[1].BusBW, 0.01) || p[0].Wrong != p[1].Wrong {
				t.Errorf("row %d: %+v, want %+v", i, *p[0], *p[1])
			}
		}
	}
	if !near(tb.AvgBusBW, rep.AvgBusBW, 1e-5) {
		t.Errorf("avg busbw %v, want %v", tb.AvgBusBW, rep.AvgBusBW)
	}
}

// A blocking run (-z 1) waits for each call; its results are checked like
// any other, and its text says so and reads back.
func TestBlockingRunParsesBack(t *testing.T) {
	cfg := smallConfig(AllReduce)
	cfg.MaxBytes = 64 << 10
	cfg.Blocking = true
	text, reps, errs := memRun(t, 3, cfg, nil)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if reps[0].Wrong != 0 || len(reps[0].Rows) == 0 {
		t.Errorf("%d wrong elements in %d rows", reps[0].Wrong, len(reps[0].Rows))
	}
	tb, err := Parse(strings.NewReader(text), ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !tb.Blocking || !strings.Contains(text, " blocking: 1\n") {
		t.Errorf("blocking not in the text, or not read back:\n%s", text)
	}
}

func TestParseNCCLTests(t *testing.T) {
	rep, err := ReadFile("testdata/nccl-tests-all_reduce_perf.txt", ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Op != "allreduce" || rep.Ranks != 2 || len(rep.Hosts) != 2 || rep.Hosts[1].PID != 40722 ||
		len(rep.Rows) != 4 || rep.Iters != 20 || rep.AvgBusBW != 48.6525 || rep.Label != "nccl-tests-all_reduce_perf" {
		t.Fatalf("%+v", rep)
	}
	r := rep.Rows[3]
	if r.Bytes != 134217728 || r.Count != 33554432 || r.OutOfPlace.TimeUs != 921.6 || !near(r.OutOfPlace.BusBW, 145.64, 0.001) ||
		!near(r.InPlace.AlgBW, 145.87, 0.001) || r.InPlace.Wrong != 0 {
		t.Errorf("last row %+v %+v %+v", r, *r.OutOfPlace, *r.InPlace)
	}
	// Small sizes print 0.00; the parser recomputes from the time.
	if b := rep.Rows[0].OutOfPlace.BusBW; !near(b, 8/10.88e-6/1e9, 1e-9) {
		t.Errorf("8 B busbw %v", b)
	}

	// Newer nccl-tests name the collective in a title line; it beats the
	// guess from the file name.
	rs, err := ReadFile("testdata/nccl-tests-new-title.txt", ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rs.Op != "reducescatter" || rs.Ranks != 2 || !near(rs.Rows[0].OutOfPlace.BusBW, 128/10e-6/1e9*0.5, 1e-9) {
		t.Errorf("new title: op %s ranks %d busbw %v", rs.Op, rs.Ranks, rs.Rows[0].OutOfPlace.BusBW)
	}

	old, err := ReadFile("lbl=testdata/nccl-tests-old.txt", ParseOptions{Op: AllReduce})
	if err != nil {
		t.Fatal(err)
	}
	if old.Label != "lbl" || len(old.Rows) != 2 || old.Rows[1].Root != -1 || old.Rows[1].OutOfPlace.Wrong != 0 ||
		!near(old.Rows[1].OutOfPlace.BusBW, 25.47, 0.001) {
		t.Errorf("old format: %+v %+v", old, old.Rows[1].OutOfPlace)
	}
}

func TestParseOSU(t *testing.T) {
	rep, err := ReadFile("testdata/osu_allreduce.txt", ParseOptions{Ranks: 4})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Source != "osu" || rep.Op != "allreduce" || len(rep.Rows) != 3 {
		t.Fatalf("%+v", rep)
	}
	m := rep.Rows[2].OutOfPlace
	wantAlg := 1048576 / 834.13e-6 / 1e9
	if m.TimeUs != 834.13 || !near(m.AlgBW, wantAlg, 1e-9) || !near(m.BusBW, wantAlg*1.5, 1e-9) {
		t.Errorf("row %+v", m)
	}

	bw, err := ReadFile("testdata/osu_bw.txt", ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bw.Op != "sendrecv" || !near(bw.Rows[2].OutOfPlace.BusBW, 9.73011, 1e-9) || !near(bw.Rows[2].OutOfPlace.TimeUs, 4194304/9730.11, 1e-9) {
		t.Errorf("osu_bw: %+v %+v", bw, bw.Rows[2].OutOfPlace)
	}

	ag, err := ReadFile("testdata/osu_allgather_old.txt", ParseOptions{Ranks: 4})
	if err != nil {
		t.Fatal(err)
	}
	// OSU sizes are per rank; nccl-tests' all-gather size is the result.
	if ag.Op != "allgather" || ag.Rows[1].Bytes != 4096 || !near(ag.Rows[1].OutOfPlace.BusBW, 4096/10e-6/1e9*0.75, 1e-9) {
		t.Errorf("osu allgather: %+v %+v", ag.Rows[1], ag.Rows[1].OutOfPlace)
	}
}

func TestParseTaggedAndBad(t *testing.T) {
	raw, _ := os.ReadFile("testdata/nccl-tests-all_reduce_perf.txt")
	var tagged strings.Builder
	for _, l := range strings.Split(string(raw), "\n") {
		tagged.WriteString("[1,0]<stdout>:" + l + "\n")
	}
	rep, err := Parse(strings.NewReader(tagged.String()), ParseOptions{Op: AllReduce})
	if err != nil || len(rep.Rows) != 4 {
		t.Errorf("mpirun --tag-output text: %v", err)
	}
	for _, bad := range []string{"", "hello\nworld\n", "{not json", `{"format":"other"}`, "# OSU MPI Allreduce Latency Test\n1 x\n"} {
		if _, err := Parse(strings.NewReader(bad), ParseOptions{}); !errors.Is(err, ErrFormat) {
			t.Errorf("Parse(%q) = %v, want ErrFormat", bad, err)
		}
	}
}

func TestPlot(t *testing.T) {
	cfg := smallConfig(AllReduce)
	cfg.MaxBytes = 64 << 10
	_, reps, errs := memRun(t, 2, cfg, nil)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	nccl, err := ReadFile("testdata/nccl-tests-all_reduce_perf.txt", ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	osu, err := ReadFile("testdata/osu_allreduce.txt", ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "p.png")
	pc := PlotConfig{Width: 900, Height: 400}
	if err := WritePlot(path, []*Report{reps[0], nccl, osu}, pc); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != pc.Width || b.Dy() != pc.Height {
		t.Errorf("plot is %dx%d, want %dx%d", b.Dx(), b.Dy(), pc.Width, pc.Height)
	}
	// A barrier has nothing a log axis can show.
	bar := &Report{Op: "barrier", Rows: []Row{{Bytes: 0, OutOfPlace: &Measure{TimeUs: 5}}}}
	var ue *UsageError
	if err := WritePlot(filepath.Join(t.TempDir(), "b.png"), []*Report{bar}, pc); !errors.As(err, &ue) {
		t.Errorf("barrier plot: %v", err)
	}
}

func TestComparison(t *testing.T) {
	g := &Report{Source: "gorun", Label: "gorun tcp", Op: "allreduce", Ranks: 2, Rows: []Row{
		{Bytes: 1024, OutOfPlace: &Measure{BusBW: 1}, InPlace: &Measure{BusBW: 2, TimeUs: 10}},
		{Bytes: 4096, OutOfPlace: &Measure{BusBW: 3}},
	}}
	m := &Report{Source: "nccl-tests", Label: "mpi", Op: "allreduce", Ranks: 2, Rows: []Row{
		{Bytes: 1024, OutOfPlace: &Measure{BusBW: 4, TimeUs: 7.5}},
	}}
	var b strings.Builder
	WriteComparison(&b, []*Report{g, m}, DefaultRatios([]*Report{g, m}))
	out := b.String()
	// The time table's ratio column is the microseconds the first series
	// adds per call over the second.
	for _, want := range []string{"(a) gorun tcp / mpi", "1K      2.0000      4.0000     0.50", "4K      3.0000           -        -",
		"(x): us added per call", "1K        10.0         7.5      +2.5", "4K         0.0           -         -"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

func TestMergeBest(t *testing.T) {
	a := &Report{Label: "x", Rows: []Row{
		{Bytes: 8, OutOfPlace: &Measure{TimeUs: 10, BusBW: 1}},
		{Bytes: 64, OutOfPlace: &Measure{TimeUs: 50, BusBW: 2}},
	}}
	b := &Report{Label: "x", Rows: []Row{
		{Bytes: 8, OutOfPlace: &Measure{TimeUs: 20, BusBW: 0.5}},
		{Bytes: 64, OutOfPlace: &Measure{TimeUs: 25, BusBW: 4}},
		{Bytes: 16, OutOfPlace: &Measure{TimeUs: 12, BusBW: 1.5}},
	}}
	c := &Report{Label: "y", Rows: []Row{{Bytes: 8, OutOfPlace: &Measure{TimeUs: 1, BusBW: 9}}}}
	got := MergeBest([]*Report{a, c, b})
	if len(got) != 2 || got[0].Label != "x" || got[1].Label != "y" {
		t.Fatalf("%+v", got)
	}
	var times []float64
	for _, r := range got[0].Rows {
		times = append(times, r.OutOfPlace.TimeUs)
	}
	if fmt.Sprint(times) != "[10 12 25]" || a.Rows[1].OutOfPlace.TimeUs != 50 {
		t.Errorf("merged times %v (inputs must stay untouched: %v)", times, a.Rows[1].OutOfPlace.TimeUs)
	}
}

// One rank (the benchmark started without gorun) has a busbw of 0 for the
// collectives whose bus factor is 0 at one rank; its header says why and
// how to run it, and the text still reads back. More ranks get no hint.
func TestOneRankHint(t *testing.T) {
	const hint = "# one rank: busbw is 0 (no data crosses a link); run it under gorun"
	for _, c := range []struct {
		ranks int
		op    Collective
		want  bool
	}{{1, AllReduce, true}, {1, AllGather, true}, {1, Broadcast, false}, {2, AllReduce, false}} {
		cfg := smallConfig(c.op)
		cfg.MaxBytes = 64
		text, _, errs := memRun(t, c.ranks, cfg, nil)
		if errs[0] != nil {
			t.Fatal(errs[0])
		}
		if got := strings.Contains(text, hint); got != c.want {
			t.Errorf("%d ranks %s: hint shown = %v, want %v:\n%s", c.ranks, c.op, got, c.want, text)
		}
		if _, err := Parse(strings.NewReader(text), ParseOptions{}); err != nil {
			t.Errorf("%d ranks %s: text does not read back: %v", c.ranks, c.op, err)
		}
	}
}
