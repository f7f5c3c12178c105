package model

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"vocab", func(c *Config) { c.Vocab = 1 }, "Vocab"},
		{"seq", func(c *Config) { c.SeqLen = 0 }, "SeqLen"},
		{"dim", func(c *Config) { c.Dim = 0 }, "Dim"},
		{"heads", func(c *Config) { c.Heads = 0 }, "Heads"},
		{"split", func(c *Config) { c.Dim, c.Heads = 30, 4 }, "multiple"},
		{"layers", func(c *Config) { c.Layers = -1 }, "Layers"},
		{"hidden", func(c *Config) { c.Hidden = 0 }, "Hidden"},
		{"act", func(c *Config) { c.Activation = "tanh" }, "Activation"},
		{"eps", func(c *Config) { c.LNEps = float32(math.NaN()) }, "LNEps"},
		{"std", func(c *Config) { c.InitStd = 0 }, "InitStd"},
		{"huge", func(c *Config) { c.Vocab, c.Dim, c.Heads = 1<<20, 1<<16, 1 }, "too large"},
	} {
		c := DefaultConfig()
		tc.edit(&c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidConfig mentioning %q", tc.name, err, tc.want)
		}
		if _, err := New(c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New accepted an invalid config", tc.name)
		}
	}
}

// TestLayout pins the names and order that buckets, traces and checkpoints
// refer to.
func TestLayout(t *testing.T) {
	c := DefaultConfig()
	c.Vocab, c.SeqLen, c.Dim, c.Heads, c.Layers, c.Hidden = 5, 3, 4, 2, 2, 6
	m, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	lay := m.Layout()
	var names []string
	for i, r := range lay.Regions {
		if r.Index != i {
			t.Errorf("region %s has Index %d at position %d", r.Name, r.Index, i)
		}
		off := 0
		for _, ten := range r.Tensors {
			if !strings.HasPrefix(ten.Name, r.Name+".") {
				t.Errorf("tensor %s outside its region %s", ten.Name, r.Name)
			}
			if ten.Offset != off {
				t.Errorf("%s at offset %d, want %d (tensors are back to back)", ten.Name, ten.Offset, off)
			}
			off += ten.Len
			if got, ri, ok := lay.Tensor(ten.Name); !ok || ri != i || got.Offset != ten.Offset {
				t.Errorf("Layout.Tensor(%q) = %v, %d, %v", ten.Name, got, ri, ok)
			}
		}
		if off != r.Size {
			t.Errorf("%s: Size %d, tensors sum to %d", r.Name, r.Size, off)
		}
		names = append(names, r.Name)
	}
	if got := strings.Join(names, " "); got != "embed layers.0 layers.1 head" {
		t.Errorf("regions %q", got)
	}
	var block []string
	for _, ten := range lay.Regions[m.BlockRegion(1)].Tensors {
		block = append(block, ten.Name)
	}
	want := "layers.1.ln1.weight layers.1.ln1.bias layers.1.attn.qkv.weight layers.1.attn.qkv.bias " +
		"layers.1.attn.proj.weight layers.1.attn.proj.bias layers.1.ln2.weight layers.1.ln2.bias " +
		"layers.1.mlp.fc1.weight layers.1.mlp.fc1.bias layers.1.mlp.fc2.weight layers.1.mlp.fc2.bias"
	if got := strings.Join(block, " "); got != want {
		t.Errorf("block tensors\n got %s\nwant %s", got, want)
	}
	// D=4, Hd=6: 2·4 + 12·4+12 + 16+4 + 2·4 + 24+6 + 24+4 = 154.
	if s := lay.Regions[1].Size; s != 154 {
		t.Errorf("block size %d, want 154", s)
	}
	if m.HeadRegion() != 3 || m.NumRegions() != 4 || m.EmbedRegion() != 0 {
		t.Errorf("region indices: head %d of %d", m.HeadRegion(), m.NumRegions())
	}
	if lay.Size() != lay.Regions[0].Size+2*154+lay.Regions[3].Size {
		t.Errorf("Layout.Size %d", lay.Size())
	}
}

func TestShards(t *testing.T) {
	r := Region{Name: "x", Size: 10}
	for _, tc := range []struct{ n, shard, padded int }{{1, 10, 10}, {2, 5, 10}, {3, 4, 12}, {4, 3, 12}, {16, 1, 16}} {
		if r.ShardSize(tc.n) != tc.shard || r.PaddedSize(tc.n) != tc.padded {
			t.Errorf("n=%d: shard %d padded %d, want %d %d", tc.n, r.ShardSize(tc.n), r.PaddedSize(tc.n), tc.shard, tc.padded)
		}
	}
	buf := make([]float32, 12)
	for i := range buf {
		buf[i] = float32(i)
	}
	s, err := r.Shard(buf, 4, 3)
	if err != nil || len(s) != 3 || s[0] != 9 {
		t.Errorf("Shard(4, 3) = %v, %v", s, err)
	}
	if _, err := r.Shard(buf, 4, 4); !errors.Is(err, ErrShard) {
		t.Errorf("shard index out of range: %v", err)
	}
	if _, err := r.Shard(buf[:10], 4, 0); !errors.Is(err, ErrBufferSize) {
		t.Errorf("short buffer: %v", err)
	}
}

func TestInitDeterministicAndPadded(t *testing.T) {
	m, _ := New(DefaultConfig())
	a, b := m.Init(), m.Init()
	for r := range a {
		for i := range a[r] {
			if math.Float32bits(a[r][i]) != math.Float32bits(b[r][i]) {
				t.Fatalf("Init differs between calls in region %d", r)
			}
		}
	}
	padded := m.Layout().Alloc(3)
	for r := range padded {
		for i := range padded[r] {
			padded[r][i] = 7 // garbage the padding must lose
		}
	}
	if err := m.InitInto(padded); err != nil {
		t.Fatal(err)
	}
	for r, reg := range m.Layout().Regions {
		for i := range padded[r] {
			want := float32(0)
			if i < reg.Size {
				want = a[r][i]
			}
			if padded[r][i] != want {
				t.Fatalf("%s[%d] = %v, want %v", reg.Name, i, padded[r][i], want)
			}
		}
	}
	ln, _, _ := m.Layout().Tensor("layers.0.ln1.weight")
	if a[1][ln.Offset] != 1 {
		t.Errorf("LayerNorm weight initialised to %v", a[1][ln.Offset])
	}
	if err := m.InitInto(padded[:2]); !errors.Is(err, ErrBufferSize) {
		t.Errorf("InitInto with too few buffers: %v", err)
	}
}

// TestStepErrors: misuse of the step API is an error naming the problem,
// never a panic or silently wrong gradients.
func TestStepErrors(t *testing.T) {
	c := gradCheckConfig(GELU)
	m, _ := New(c)
	p, g := m.Init(), m.Layout().Alloc(1)
	ws, err := m.NewWorkspace(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.NewWorkspace(0); !errors.Is(err, ErrSampleRange) {
		t.Errorf("NewWorkspace(0): %v", err)
	}
	if _, err := m.NewWorkspace(math.MaxInt / 2); !errors.Is(err, ErrSampleRange) {
		t.Errorf("NewWorkspace(huge): %v", err)
	}
	if err := ws.Forward(0, p[0], 0, 4); !errors.Is(err, ErrOrder) {
		t.Errorf("forward before SetBatch: %v", err)
	}
	in, tg := batchFor(t, NewDataset(c), 4)
	if err := ws.SetBatch(in[:3], tg); !errors.Is(err, ErrBufferSize) {
		t.Errorf("short batch: %v", err)
	}
	bad := append([]int32(nil), in...)
	bad[5] = int32(c.Vocab)
	if err := ws.SetBatch(bad, tg); !errors.Is(err, ErrToken) {
		t.Errorf("token out of range: %v", err)
	}
	if err := ws.SetBatch(in, tg); err != nil {
		t.Fatal(err)
	}
	if err := ws.Forward(1, p[1], 0, 4); !errors.Is(err, ErrOrder) {
		t.Errorf("block before embedding: %v", err)
	}
	if err := ws.Forward(9, p[0], 0, 4); !errors.Is(err, ErrRegion) {
		t.Errorf("bad region: %v", err)
	}
	if err := ws.Forward(0, p[0][:3], 0, 4); !errors.Is(err, ErrBufferSize) {
		t.Errorf("short params: %v", err)
	}
	if err := ws.Forward(0, p[0], 2, 5); !errors.Is(err, ErrSampleRange) {
		t.Errorf("range past the end: %v", err)
	}
	for r := 0; r < m.NumRegions(); r++ {
		if err := ws.Forward(r, p[r], 0, 4); err != nil {
			t.Fatal(err)
		}
	}
	if err := ws.Backward(1, p[1], g[1], 0, 4); !errors.Is(err, ErrOrder) {
		t.Errorf("block backward before head backward: %v", err)
	}
	if err := ws.Backward(m.HeadRegion(), p[3], g[3], 1, 3); !errors.Is(err, ErrSampleRange) {
		t.Errorf("unaligned backward range: %v", err)
	}
	if err := ws.Backward(m.HeadRegion(), p[3], g[3][:5], 0, 4); !errors.Is(err, ErrBufferSize) {
		t.Errorf("short gradient: %v", err)
	}
	if err := ws.Backward(m.HeadRegion(), p[3], g[3], 0, 2); err != nil {
		t.Fatal(err)
	}
	if err := ws.Backward(m.HeadRegion(), p[3], g[3], 0, 2); !errors.Is(err, ErrOrder) {
		t.Errorf("backward twice: %v", err)
	}
	if _, err := ws.LossSum(0, 3); !errors.Is(err, ErrSampleRange) {
		t.Errorf("loss over a non-tree range: %v", err)
	}
	if _, err := ws.Step(p[:2], g); !errors.Is(err, ErrBufferSize) {
		t.Errorf("Step with missing regions: %v", err)
	}
}

// TestTreeOrder shows the tree is what makes the sum rank-count independent:
// the pairwise sum and a left-to-right sum of the same four numbers differ.
func TestTreeOrder(t *testing.T) {
	parts := [][]float32{{1e8}, {1}, {-1e8}, {1}}
	dst := make([]float32, 1)
	if err := TreeSum(dst, parts...); err != nil {
		t.Fatal(err)
	}
	// (1e8+1) + (−1e8+1): each +1 is lost to rounding in float32.
	if dst[0] != 0 {
		t.Errorf("TreeSum = %v, want 0", dst[0])
	}
	seq := ((parts[0][0] + parts[1][0]) + parts[2][0]) + parts[3][0]
	if seq != 1 {
		t.Errorf("left-to-right sum = %v, want 1 (the orders must differ for this test to mean anything)", seq)
	}
	if got := TreeSumScalars(1e8, 1, -1e8, 1); got != 0 {
		t.Errorf("TreeSumScalars = %v", got)
	}
	// Three parts: (p0+p1)+p2.
	if err := TreeSum(dst, []float32{1e8}, []float32{-1e8}, []float32{1}); err != nil || dst[0] != 1 {
		t.Errorf("TreeSum of three = %v, %v", dst[0], err)
	}
	if err := TreeSum(dst); !errors.Is(err, ErrBufferSize) {
		t.Errorf("TreeSum of nothing: %v", err)
	}
	if err := TreeSum(dst, []float32{1, 2}); !errors.Is(err, ErrBufferSize) {
		t.Errorf("TreeSum of mismatched lengths: %v", err)
	}
	buf := []float32{8, 4}
	if err := Mean(buf, 8); err != nil || buf[0] != 1 || buf[1] != 0.5 {
		t.Errorf("Mean = %v, %v", buf, err)
	}
}

// TestBackwardChunksCombine: backward over [0, n) equals TreeSum of backward
// over its two halves, bit for bit — chunking does not change gradients.
func TestBackwardChunksCombine(t *testing.T) {
	c := gradCheckConfig(GELU)
	m, _ := New(c)
	p := randomParams(t, m, 11)
	in, tg := batchFor(t, NewDataset(c), 4)
	run := func(chunked bool) [][]float32 {
		ws, _ := m.NewWorkspace(4)
		if err := ws.SetBatch(in, tg); err != nil {
			t.Fatal(err)
		}
		g := m.Layout().Alloc(2)
		for r := 0; r < m.NumRegions(); r++ {
			for _, rg := range [][2]int{{0, 2}, {2, 4}} {
				if err := ws.Forward(r, p[r], rg[0], rg[1]); err != nil {
					t.Fatal(err)
				}
			}
		}
		for r := m.NumRegions() - 1; r >= 0; r-- {
			if !chunked {
				if err := ws.Backward(r, p[r], g[r], 0, 4); err != nil {
					t.Fatal(err)
				}
				continue
			}
			a, b := make([]float32, len(g[r])), make([]float32, len(g[r]))
			if err := ws.Backward(r, p[r], a, 0, 2); err != nil {
				t.Fatal(err)
			}
			if err := ws.Backward(r, p[r], b, 2, 4); err != nil {
				t.Fatal(err)
			}
			if err := TreeSum(g[r], a, b); err != nil {
				t.Fatal(err)
			}
		}
		return g
	}
	whole, chunked := run(false), run(true)
	for r := range whole {
		for i := range whole[r] {
			if math.Float32bits(whole[r][i]) != math.Float32bits(chunked[r][i]) {
				t.Fatalf("region %d element %d: whole %v, chunked %v", r, i, whole[r][i], chunked[r][i])
			}
		}
		if odd := whole[r][len(whole[r])-1]; m.Layout().Regions[r].Size%2 == 1 && odd != 0 {
			t.Errorf("region %d padding gradient %v, want 0", r, odd)
		}
	}
}

func TestDataset(t *testing.T) {
	d := Dataset{Vocab: 11, SeqLen: 6, MaxStride: 3, Seed: 5}
	in, tg := make([]int32, 4*6), make([]int32, 4*6)
	if err := d.Batch(2, 8, 4, 8, in, tg); err != nil {
		t.Fatal(err)
	}
	for s := 0; s < 4; s++ {
		i1, t1 := make([]int32, 6), make([]int32, 6)
		if err := d.Sample(uint64(2*8+4+s), i1, t1); err != nil {
			t.Fatal(err)
		}
		k := (t1[0] - i1[0] + 11) % 11
		for p := 0; p < 6; p++ {
			if in[s*6+p] != i1[p] || tg[s*6+p] != t1[p] {
				t.Fatalf("Batch sample %d differs from Sample", s)
			}
			if (i1[p]+k)%11 != t1[p] || (p > 0 && t1[p-1] != i1[p]) {
				t.Fatalf("sample %d is not a progression: %v → %v", s, i1, t1)
			}
		}
		if k < 1 || k > 3 {
			t.Errorf("stride %d", k)
		}
	}
	if err := d.Batch(0, 8, 6, 9, in, tg); !errors.Is(err, ErrSampleRange) {
		t.Errorf("range past the batch: %v", err)
	}
	if err := (Dataset{}).Sample(0, in[:0], tg[:0]); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("zero dataset: %v", err)
	}
}

func TestOptimizer(t *testing.T) {
	if _, err := NewOptimizer(OptimizerConfig{Algorithm: "lion", LR: 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("unknown algorithm: %v", err)
	}
	bad := DefaultOptimizerConfig()
	bad.Beta2 = 1
	if _, err := NewOptimizer(bad); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Beta2 = 1: %v", err)
	}
	// Adam's first step moves every parameter by about LR against the sign
	// of its gradient, whatever the gradient's size.
	o, _ := NewOptimizer(DefaultOptimizerConfig())
	p := []float32{1, 1, 1, 0}
	g := []float32{0.5, -3, 1e-3, 0}
	st := o.NewState(4)
	if err := o.Update(1, p, g, st); err != nil {
		t.Fatal(err)
	}
	lr := DefaultOptimizerConfig().LR
	for i, want := range []float32{1 - lr, 1 + lr, 1 - lr, 0} {
		if math.Abs(float64(p[i]-want)) > 1e-5 {
			t.Errorf("after one Adam step p[%d] = %v, want %v", i, p[i], want)
		}
	}
	if err := o.Update(0, p, g, st); !errors.Is(err, ErrStep) {
		t.Errorf("step 0: %v", err)
	}
	if err := o.Update(2, p, g[:3], st); !errors.Is(err, ErrBufferSize) {
		t.Errorf("short gradient: %v", err)
	}
	// Elementwise: updating halves separately equals updating the whole.
	whole, halves := []float32{1, 2, 3, 4}, []float32{1, 2, 3, 4}
	gr := []float32{0.1, -0.2, 0.3, -0.4}
	sw, sh := o.NewState(4), o.NewState(4)
	for step := 1; step <= 3; step++ {
		_ = o.Update(step, whole, gr, sw)
		_ = o.Update(step, halves[:2], gr[:2], &OptState{M: sh.M[:2], V: sh.V[:2]})
		_ = o.Update(step, halves[2:], gr[2:], &OptState{M: sh.M[2:], V: sh.V[2:]})
	}
	for i := range whole {
		if math.Float32bits(whole[i]) != math.Float32bits(halves[i]) {
			t.Errorf("element %d: whole %v, halves %v", i, whole[i], halves[i])
		}
	}
	// SGD with momentum: p -= lr·(g), then p -= lr·(mu·g + g).
	sc := DefaultOptimizerConfig()
	sc.Algorithm, sc.LR, sc.Momentum = SGD, 0.5, 0.5
	s, _ := NewOptimizer(sc)
	q, sst := []float32{1}, s.NewState(1)
	_ = s.Update(1, q, []float32{1}, sst)
	_ = s.Update(2, q, []float32{1}, sst)
	if q[0] != 1-0.5-0.75 {
		t.Errorf("SGD momentum: %v", q[0])
	}
}

func TestSampleRange(t *testing.T) {
	for _, tc := range []struct {
		rank, chunk int
		major       bool
		lo, hi      int
	}{
		{0, 0, false, 0, 2}, {0, 1, false, 2, 4}, {1, 0, false, 4, 6}, {1, 1, false, 6, 8},
		{0, 0, true, 0, 2}, {1, 0, true, 2, 4}, {0, 1, true, 4, 6}, {1, 1, true, 6, 8},
	} {
		lo, hi, err := SampleRange(8, 2, tc.rank, 2, tc.chunk, tc.major)
		if err != nil || lo != tc.lo || hi != tc.hi {
			t.Errorf("SampleRange(8, 2, %d, 2, %d, %v) = %d, %d, %v; want %d, %d",
				tc.rank, tc.chunk, tc.major, lo, hi, err, tc.lo, tc.hi)
		}
	}
	for _, bad := range [][5]int{{8, 3, 0, 1, 0}, {8, 4, 0, 4, 0}, {6, 2, 0, 1, 0}, {8, 2, 2, 1, 0}, {8, 2, 0, 2, 2}} {
		if _, _, err := SampleRange(bad[0], bad[1], bad[2], bad[3], bad[4], false); !errors.Is(err, ErrSampleRange) {
			t.Errorf("SampleRange%v: %v", bad, err)
		}
	}
}

func TestInitShardsAndFingerprint(t *testing.T) {
	m, _ := New(gradCheckConfig(GELU))
	full := m.Init()
	const n = 3
	var parts [n][][]float32
	for k := 0; k < n; k++ {
		var err error
		if parts[k], err = m.InitShards(n, k); err != nil {
			t.Fatal(err)
		}
	}
	for r, reg := range m.Layout().Regions {
		var joined []float32
		for k := 0; k < n; k++ {
			joined = append(joined, parts[k][r]...)
		}
		if len(joined) != reg.PaddedSize(n) || Fingerprint(joined[:reg.Size]) != Fingerprint(full[r]) {
			t.Errorf("%s: shards do not reassemble the initial parameters", reg.Name)
		}
	}
	if _, err := m.InitShards(2, 2); !errors.Is(err, ErrShard) {
		t.Errorf("InitShards(2, 2): %v", err)
	}
	if Fingerprint([]float32{0}) == Fingerprint([]float32{float32(math.Copysign(0, -1))}) {
		t.Error("Fingerprint does not see the sign of zero")
	}
	if Fingerprint([]float32{1, 2}, []float32{3}) == Fingerprint([]float32{1}, []float32{2, 3}) {
		t.Error("Fingerprint ignores buffer boundaries")
	}
	if !strings.Contains(m.String(), "2 layers") {
		t.Errorf("String() = %q", m.String())
	}
}

// TestNoBlocks: Layers = 0 (embedding straight into the head) is a valid,
// if useless, model; the region indices and the step still work.
func TestNoBlocks(t *testing.T) {
	c := gradCheckConfig(ReLU)
	c.Layers = 0
	m, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if m.NumRegions() != 2 || m.HeadRegion() != 1 {
		t.Fatalf("%d regions, head at %d", m.NumRegions(), m.HeadRegion())
	}
	ws, _ := m.NewWorkspace(2)
	in, tg := batchFor(t, NewDataset(c), 2)
	if err := ws.SetBatch(in, tg); err != nil {
		t.Fatal(err)
	}
	loss, err := ws.Step(m.Init(), m.Layout().Alloc(1))
	if err != nil || !(loss > 0) || math.IsInf(float64(loss), 0) {
		t.Errorf("Step = %v, %v", loss, err)
	}
}

// TestOddBatch: a workspace of 6 samples (not a power of two) backpropagates
// over its whole range, by the same tree TreeSum uses (left part 4, right
// part 2), with any number of workers.
func TestOddBatch(t *testing.T) {
	c := gradCheckConfig(GELU)
	m, _ := New(c)
	p := randomParams(t, m, 5)
	const n = 6
	in, tg := batchFor(t, NewDataset(c), n)
	run := func(workers int, perSample bool) [][]float32 {
		ws, _ := m.NewWorkspace(n)
		ws.SetWorkers(workers)
		if err := ws.SetBatch(in, tg); err != nil {
			t.Fatal(err)
		}
		g := m.Layout().Alloc(1)
		if !perSample {
			if _, err := ws.Step(p, g); err != nil {
				t.Fatal(err)
			}
			return g
		}
		for r := 0; r < m.NumRegions(); r++ {
			if err := ws.Forward(r, p[r], 0, n); err != nil {
				t.Fatal(err)
			}
		}
		for r := m.NumRegions() - 1; r >= 0; r-- {
			parts := make([][]float32, n)
			for s := range parts {
				parts[s] = make([]float32, len(g[r]))
				if err := ws.Backward(r, p[r], parts[s], s, s+1); err != nil {
					t.Fatal(err)
				}
			}
			if err := TreeSum(g[r], parts...); err != nil {
				t.Fatal(err)
			}
		}
		return g
	}
	want := run(1, true)
	for _, workers := range []int{1, 2, 4} {
		got := run(workers, false)
		for r := range want {
			if Fingerprint(want[r]) != Fingerprint(got[r]) {
				t.Errorf("workers %d: region %d gradient differs from the per-sample TreeSum", workers, r)
			}
		}
	}
	ws, _ := m.NewWorkspace(n)
	_ = ws.SetBatch(in, tg)
	if _, err := ws.Step(p, m.Layout().Alloc(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.LossSum(0, n); err != nil {
		t.Errorf("LossSum over the whole odd workspace: %v", err)
	}
}
