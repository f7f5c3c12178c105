package modeltest

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/gorun-hpc/gorun/model"
)

// small keeps the 20-step runs of every layout fast under -race.
func small() model.Config {
	c := model.DefaultConfig()
	c.Vocab, c.SeqLen, c.Dim, c.Heads, c.Layers, c.Hidden = 16, 8, 16, 2, 2, 32
	return c
}

func sameBits(t *testing.T, name string, want, got *Result) {
	t.Helper()
	for i := range want.Losses {
		if math.Float32bits(want.Losses[i]) != math.Float32bits(got.Losses[i]) {
			t.Errorf("%s: step %d loss %.9g, reference %.9g", name, i, got.Losses[i], want.Losses[i])
			return
		}
	}
	for r := range want.Params {
		if !Equal(want.Params[r], got.Params[r]) {
			t.Errorf("%s: region %d parameters differ from the reference", name, r)
			return
		}
	}
}

// TestRankCountIndependence is the numerics contract of the example trainer:
// over 20 steps, 1, 2, 4 and 8 ranks, data-parallel or sharded, with the
// batch in one piece or in chunks, give bitwise the same losses and
// parameters.
func TestRankCountIndependence(t *testing.T) {
	for _, alg := range []model.Algorithm{model.Adam, model.SGD} {
		t.Run(string(alg), func(t *testing.T) {
			base := Options{Model: small(), Optimizer: model.DefaultOptimizerConfig(), Batch: 8, Steps: 20, Ranks: 1}
			base.Optimizer.Algorithm = alg
			base.Optimizer.WeightDecay = 0.01 // exercise the decay path too
			if alg == model.SGD {
				base.Optimizer.LR = 0.05
			}
			ref, err := Run(base)
			if err != nil {
				t.Fatal(err)
			}
			if len(ref.Losses) != 20 {
				t.Fatalf("%d losses", len(ref.Losses))
			}
			cases := []struct {
				name    string
				ranks   int
				sharded bool
				chunks  int
			}{
				{"dp-2", 2, false, 1},
				{"dp-4", 4, false, 1},
				{"dp-8", 8, false, 1},
				{"sharded-2", 2, true, 1},
				{"sharded-4", 4, true, 1},
				{"chunked-1x2", 1, false, 2},
				{"sharded-chunked-4x2", 4, true, 2},
				{"chunked-2x4", 2, false, 4},
			}
			// Worker goroutines: fewer than, not a power of two, and more
			// than the samples of a range.
			for _, w := range [][3]int{{2, 1, 1}, {3, 2, 1}, {16, 4, 2}} {
				if alg == model.SGD {
					break // workers split samples, not elements; Adam covers it
				}
				o := base
				o.Workers, o.Ranks, o.Chunks = w[0], w[1], w[2]
				got, err := Run(o)
				if err != nil {
					t.Fatal(err)
				}
				sameBits(t, fmt.Sprintf("workers-%d ranks-%d chunks-%d", w[0], w[1], w[2]), ref, got)
			}
			for _, c := range cases {
				if alg == model.SGD && c.ranks != 4 {
					continue // the optimizer is elementwise; the 4-rank cases suffice
				}
				o := base
				o.Ranks, o.Sharded, o.Chunks = c.ranks, c.sharded, c.chunks
				got, err := Run(o)
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				sameBits(t, c.name, ref, got)
				if c.chunks > 1 {
					o.ChunkMajor = true
					got, err := Run(o)
					if err != nil {
						t.Fatalf("%s chunk-major: %v", c.name, err)
					}
					sameBits(t, c.name+" chunk-major", ref, got)
				}
			}
		})
	}
}

// TestDeterministic: two identical runs give identical bits.
func TestDeterministic(t *testing.T) {
	o := Options{Model: small(), Optimizer: model.DefaultOptimizerConfig(), Batch: 8, Steps: 5, Ranks: 2, Sharded: true}
	a, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	sameBits(t, "second run", a, b)
}

// TestLossDecreases: the task is learnable and the optimizer works — 50 Adam
// steps bring the loss well below its starting value ln(Vocab).
func TestLossDecreases(t *testing.T) {
	cfg := small()
	o := Options{Model: cfg, Optimizer: model.DefaultOptimizerConfig(), Batch: 8, Steps: 50, Ranks: 1}
	o.Optimizer.LR = 1e-2
	res, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	first := res.Losses[0]
	var last float32
	for _, l := range res.Losses[45:] {
		last += l / 5
	}
	t.Logf("loss %.4f → %.4f (ln Vocab = %.4f)", first, last, math.Log(float64(cfg.Vocab)))
	if math.Abs(float64(first)-math.Log(float64(cfg.Vocab))) > 0.3 {
		t.Errorf("initial loss %.4f, want about ln(%d) = %.4f", first, cfg.Vocab, math.Log(float64(cfg.Vocab)))
	}
	if !(last < 0.6*first) {
		t.Errorf("loss fell from %.4f only to %.4f over 50 steps", first, last)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	for _, o := range []Options{
		{Model: small(), Optimizer: model.DefaultOptimizerConfig(), Batch: 8, Ranks: 3, Steps: 1},
		{Model: small(), Optimizer: model.DefaultOptimizerConfig(), Batch: 6, Ranks: 2, Steps: 1},
		{Model: small(), Optimizer: model.DefaultOptimizerConfig(), Batch: 4, Ranks: 4, Chunks: 2, Steps: 1},
	} {
		if _, err := Run(o); !errors.Is(err, ErrOptions) {
			t.Errorf("Run(ranks %d batch %d chunks %d) = %v, want ErrOptions", o.Ranks, o.Batch, o.Chunks, err)
		}
	}
}

// TestNaiveSummationDiffers is the control for TestRankCountIndependence:
// with the cross-rank levels summed left to right instead of pairwise, four
// ranks no longer match one. If this ever passes bitwise, the independence
// test has lost its power (e.g. the model became too small to round).
func TestNaiveSummationDiffers(t *testing.T) {
	o := Options{Model: small(), Optimizer: model.DefaultOptimizerConfig(), Batch: 8, Steps: 20, Ranks: 1}
	ref, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	o.Ranks = 4
	o.crossRank = func(dst []float32, parts ...[]float32) error {
		copy(dst, parts[0])
		for _, p := range parts[1:] {
			for i := range dst {
				dst[i] += p[i]
			}
		}
		return nil
	}
	got, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	for r := range ref.Params {
		if !Equal(ref.Params[r], got.Params[r]) {
			return // differs, as it should
		}
	}
	t.Error("left-to-right cross-rank summation matched the pairwise tree bit for bit")
}
