package model

import (
	"math"
	"testing"
)

// gradCheckConfig is tiny so that a central difference over every single
// parameter runs in well under a second, yet exercises every path: several
// heads, two blocks, a hidden width unlike Dim, a vocab unlike SeqLen.
func gradCheckConfig(act Activation) Config {
	c := DefaultConfig()
	c.Vocab, c.SeqLen, c.Dim, c.Heads, c.Layers, c.Hidden = 7, 5, 8, 2, 2, 12
	c.Activation = act
	c.InitStd = 0.4 // large enough that attention is far from uniform
	c.Seed = 42
	return c
}

// randomParams returns initialised parameters with every tensor, LayerNorm
// weights and biases included, moved off its special initial value, so that
// no gradient is checked only at a symmetric point.
func randomParams(t *testing.T, m *Model, seed uint64) [][]float32 {
	t.Helper()
	p := m.Init()
	r := newRNG(seed)
	for i := range p {
		for j := range p[i] {
			p[i][j] += float32(0.2 * (2*r.float64() - 1))
		}
	}
	return p
}

func toF64(p [][]float32) [][]float64 {
	out := make([][]float64, len(p))
	for i := range p {
		out[i] = make([]float64, len(p[i]))
		for j, v := range p[i] {
			out[i][j] = float64(v)
		}
	}
	return out
}

func batchFor(t *testing.T, d Dataset, n int) (in, tg []int32) {
	t.Helper()
	in, tg = make([]int32, n*d.SeqLen), make([]int32, n*d.SeqLen)
	if err := d.Batch(0, n, 0, n, in, tg); err != nil {
		t.Fatal(err)
	}
	return in, tg
}

// lossAndGrads64 runs a whole step in float64 and returns the summed loss
// and, when grads is not nil, the summed gradients.
func lossAndGrads64(t *testing.T, w *work[float64], params, grads [][]float64) float64 {
	t.Helper()
	R := len(params)
	for r := 0; r < R; r++ {
		if err := w.forward(r, params[r], 0, w.n); err != nil {
			t.Fatal(err)
		}
	}
	if grads != nil {
		for r := R - 1; r >= 0; r-- {
			if err := w.backward(r, params[r], grads[r], 0, w.n); err != nil {
				t.Fatal(err)
			}
		}
	}
	l, err := w.lossSum(0, w.n)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestGradientFiniteDifference checks the hand-written backward pass against
// central differences of the loss, for every tensor, in float64 (the same
// generic code the float32 model runs).
func TestGradientFiniteDifference(t *testing.T) {
	for _, act := range []Activation{GELU, ReLU} {
		t.Run(string(act), func(t *testing.T) {
			cfg := gradCheckConfig(act)
			m, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			const n = 2
			in, tg := batchFor(t, NewDataset(cfg), n)
			w := newWork[float64](cfg, m.Layout(), n)
			if err := w.setBatch(in, tg); err != nil {
				t.Fatal(err)
			}
			params := toF64(randomParams(t, m, 7))
			grads := make([][]float64, len(params))
			for i := range params {
				grads[i] = make([]float64, len(params[i]))
			}
			// Sum the per-sample gradients through single-sample backward
			// calls, so the check does not depend on the tree code.
			analytic := make([][]float64, len(params))
			for i := range params {
				analytic[i] = make([]float64, len(params[i]))
			}
			for s := 0; s < n; s++ {
				R := len(params)
				for r := 0; r < R; r++ {
					if err := w.forward(r, params[r], s, s+1); err != nil {
						t.Fatal(err)
					}
				}
				for r := R - 1; r >= 0; r-- {
					if err := w.backward(r, params[r], grads[r], s, s+1); err != nil {
						t.Fatal(err)
					}
					add(analytic[r], grads[r])
				}
			}
			lossAt := func() float64 {
				var sum float64
				for r := range params {
					if err := w.forward(r, params[r], 0, n); err != nil {
						t.Fatal(err)
					}
				}
				for s := 0; s < n; s++ {
					sum += w.loss[s]
				}
				return sum
			}
			const h = 1e-5
			checked, worst := 0, 0.0
			for r, reg := range m.Layout().Regions {
				for _, ten := range reg.Tensors {
					// Every element of small tensors, an even spread of about
					// 40 of larger ones (keeps -race runs short; a wrong
					// formula shows in most elements).
					stride := max(1, (ten.Len-1)/39)
					for j := ten.Offset; j < ten.Offset+ten.Len; j += stride {
						orig := params[r][j]
						params[r][j] = orig + h
						lp := lossAt()
						params[r][j] = orig - h
						lm := lossAt()
						params[r][j] = orig
						fd := (lp - lm) / (2 * h)
						a := analytic[r][j]
						diff := math.Abs(a - fd)
						rel := diff / math.Max(math.Abs(a)+math.Abs(fd), 1e-3)
						worst = math.Max(worst, rel)
						if diff > 1e-7 && rel > 1e-5 {
							t.Errorf("%s[%d]: analytic %.10g, finite difference %.10g", ten.Name, j-ten.Offset, a, fd)
						}
						checked++
					}
				}
			}
			t.Logf("%d parameters checked, worst relative error %.3g", checked, worst)
		})
	}
}

// TestFloat32MatchesFloat64 checks that the float32 model computes the same
// gradients as the float64 one that passed the finite-difference check, up
// to float32 rounding.
func TestFloat32MatchesFloat64(t *testing.T) {
	cfg := gradCheckConfig(GELU)
	cfg.Dim, cfg.Heads, cfg.Hidden, cfg.SeqLen = 16, 4, 32, 8
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	in, tg := batchFor(t, NewDataset(cfg), n)
	p32 := randomParams(t, m, 3)
	g32 := m.Layout().Alloc(1)
	ws, err := m.NewWorkspace(n)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.SetBatch(in, tg); err != nil {
		t.Fatal(err)
	}
	l32, err := ws.Step(p32, g32)
	if err != nil {
		t.Fatal(err)
	}
	w64 := newWork[float64](cfg, m.Layout(), n)
	if err := w64.setBatch(in, tg); err != nil {
		t.Fatal(err)
	}
	p64 := toF64(p32)
	g64 := toF64(m.Layout().Alloc(1))
	l64 := lossAndGrads64(t, w64, p64, g64)
	if math.Abs(float64(l32)-l64) > 1e-5*math.Abs(l64) {
		t.Errorf("loss float32 %v, float64 %v", l32, l64)
	}
	for r, reg := range m.Layout().Regions {
		for _, ten := range reg.Tensors {
			var num, den float64
			for j := ten.Offset; j < ten.Offset+ten.Len; j++ {
				d := float64(g32[r][j]) - g64[r][j]
				num += d * d
				den += g64[r][j] * g64[r][j]
			}
			if rel := math.Sqrt(num / math.Max(den, 1e-20)); rel > 1e-4 {
				t.Errorf("%s: float32 gradient differs from float64 by %.3g (relative L2)", ten.Name, rel)
			}
		}
	}
}
